/**
 * Soak: a slow follower on another replica while the job writes 1 GiB (× scale) into the
 * PostgreSQL log store. Holds when the follower gets every line and byte, was behind by
 * far more than the shared ring when the job ended, and its live memory after GC grew by a
 * bound that does not follow the job's size: heap < 32 MiB, heap and Buffers together < 48 MiB (RSS is shown,
 * not bounded: it also counts pages the allocator keeps). The test suite runs the same
 * check at a tenth of a GiB.
 */
import { runSlowFollower } from "../test/fixtures/slow-follower.js";

const MiB = 1024 * 1024;

/** Runs the soak; returns its RELIABILITY.md section. */
export async function run({ scale }: { scale: number }): Promise<string> {
  const started = Date.now();
  const target = Math.round(1024 * MiB * scale);
  const r = await runSlowFollower(target);
  const heapGrowth = r.peak.heap - r.base.heap;
  const rssGrowth = r.peak.rss - r.base.rss;
  // Buffers after two GCs (one GC leaves dead Buffers to V8's concurrent sweeper: +48 to
  // +64 MiB of garbage was counted that way at a tenth); measured so they grow by 0.2-1.1 MiB.
  const externalGrowth = r.peak.external - r.base.external;
  const held =
    r.lines === r.writtenLines &&
    r.bytes === r.writtenBytes &&
    r.writtenLines - r.linesAtFast > Math.max(8192, r.writtenLines / 4) &&
    heapGrowth < 32 * MiB &&
    heapGrowth + externalGrowth < 48 * MiB;
  const mib = (n: number) => (n / MiB).toFixed(1);
  return [
    "## Runner: a slow follower while a job writes 1 GiB",
    "",
    `A job streams ${mib(r.writtenBytes)} MiB of 1 KiB lines over gRPC into replica A (PostgreSQL log store); a follower on replica B, in its own process, pauses every 100 lines until the job has ended, then reads at full speed. ${held ? "**Held**: the follower got every line and byte, was far behind the 4,096-line shared ring when the job ended and caught up from the store by offset, and its heap (after GC) grew by less than 32 MiB and its heap and Buffers together by less than 48 MiB." : "**DID NOT HOLD** (see the row)."}`,
    "",
    "| written | lines followed | behind at the job's end (lines) | heap after GC: base → peak (MiB) | Buffers after GC: base → peak (MiB) | RSS: base → peak (MiB) | seconds |",
    "|---|---|---|---|---|---|---|",
    `| ${mib(r.writtenBytes)} MiB, ${r.writtenLines} lines | ${r.lines} | ${r.writtenLines - r.linesAtFast} | ${mib(r.base.heap)} → ${mib(r.peak.heap)} (+${mib(heapGrowth)}) | ${mib(r.base.external)} → ${mib(r.peak.external)} (+${mib(externalGrowth)}) | ${mib(r.base.rss)} → ${mib(r.peak.rss)} (+${mib(rssGrowth)}) | ${((Date.now() - started) / 1000).toFixed(1)} |`,
  ].join("\n");
}
