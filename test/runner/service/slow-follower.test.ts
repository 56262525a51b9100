/**
 * A slow follower's memory stays bounded while the job writes a tenth of a GiB (1 GiB in
 * `npm run soak`, soak/runner-slow-follower.ts): it falls behind, the lines wait in
 * PostgreSQL, and it catches up from there by offset. Measured on the follower's own
 * process (heap after GC, RSS), not in time.
 */
import { describe, expect, it } from "vitest";
import { needs } from "../../fixtures/backends.js";
import { runSlowFollower } from "../../fixtures/slow-follower.js";

needs("postgres");

const MiB = 1024 * 1024;

describe("follow(): a slow follower on another replica", () => {
  it("falls behind and catches up from the store while the job writes 102 MiB; its heap grows by a bounded amount, not by what it missed", async () => {
    const report = await runSlowFollower(102 * MiB);
    console.log(JSON.stringify(report));
    expect(report.lines).toBe(report.writtenLines);
    expect(report.bytes).toBe(report.writtenBytes);
    // It really was behind by far more than the shared ring (4,096 lines) when the job ended.
    expect(report.writtenLines - report.linesAtFast).toBeGreaterThan(Math.max(8192, report.writtenLines / 4));
    // A follower that buffered what it missed would hold ~100 MiB more live memory, in its
    // heap (strings) or outside it (Buffers). Both are measured after GC. RSS is reported but
    // not bounded: it also counts pages the allocator freed and kept, which depends on the
    // machine (a clean-clone CI run showed +112 MiB RSS with a flat heap and flat Buffers).
    expect(report.peak.heap - report.base.heap).toBeLessThan(24 * MiB);
    // Buffers are sampled after two GCs (one GC leaves dead Buffers to V8's concurrent
    // sweeper: +20 to +64 MiB of garbage was counted that way); measured so, heap and
    // Buffers together grow by 1-2 MiB. The follower was ~80 MiB behind, so one that kept
    // what it missed, as strings or as Buffers, would hold more than this bound.
    expect(report.peak.heap - report.base.heap + report.peak.external - report.base.external).toBeLessThan(32 * MiB);
  }, 600_000);
});
