/**
 * Log search benchmark (issue 24, item 3): a 256 MiB job log in the fs log store (the embedded default), searched
 * through the console's endpoint (`GET api/jobs/<id>/search`, page after page from `next` until `end`) by a server
 * in its own process, against `grep -c -F` over the same log as a plain text file, same run. Also measured: the
 * server's RSS peak during the search above its idle RSS (after a GC), and — for the report, with no target — the
 * case-insensitive literal (the fast path too) and an RE2 expression (which reads the log a page of lines at a time).
 *
 * `BENCH_LOG_MIB=32 npm run bench -- log-search` runs a smaller log.
 */
import { spawn, spawnSync } from "node:child_process";
import { randomUUID } from "node:crypto";
import { createWriteStream } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { createFsLogStore } from "../src/adapters/fs/index.js";
import type { LogEntry } from "../src/runner/ports.js";
import type { LogSearchPage } from "../src/runner/service/log-search.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const MiB = 1024 * 1024;
/** The needle: on every 10,007th line; near misses ("ERROR: build") elsewhere. */
const NEEDLE = "ERROR: build step failed";
const EVERY = 10_007;

/** Line `at` (0-based): ~100 bytes, some coloured, a near miss on every 101st. */
function lineText(at: number): string {
  if (at % EVERY === 0) return `step ${String(at).padStart(9, "0")} ${NEEDLE} with exit code 2 ${"x".repeat(40)}`;
  const tail = at % 101 === 0 ? "ERROR: build retried " + "y".repeat(49) : "x".repeat(70);
  return `${at % 50 === 0 ? "\u001b[32m" : ""}step ${String(at).padStart(9, "0")} ${tail}${at % 50 === 0 ? "\u001b[0m" : ""}`;
}

/** Fills job `id` in an fs store in `dir` with `mib` MiB of lines and writes them as text to `rawFile`. */
async function fill(dir: string, id: string, mib: number, rawFile: string): Promise<{ lines: number; ms: number }> {
  const logs = createFsLogStore(dir, { fsync: false });
  const raw = createWriteStream(rawFile);
  const start = performance.now();
  await logs.open(id, { expect: true });
  let bytes = 0;
  let at = 0;
  while (bytes < mib * MiB) {
    const batch: LogEntry[] = [];
    let text = "";
    for (let i = 0; i < 10_000 && bytes < mib * MiB; i++, at++) {
      const line = lineText(at);
      bytes += line.length + 1;
      text += `${line}\n`;
      batch.push({ stored: [{ line, stderr: at % 97 === 0 }], stderr: at % 97 === 0, bytes: line.length });
    }
    await logs.append(id, at - batch.length, batch);
    if (!raw.write(text)) await new Promise<void>((resolve) => raw.once("drain", () => resolve()));
  }
  await new Promise<void>((resolve) => raw.end(() => resolve()));
  await logs.close?.();
  return { lines: at, ms: performance.now() - start };
}

/** The server child: its port, and a line exchange on stdin/stdout. */
async function startServer(dir: string) {
  const child = spawn(
    process.execPath,
    ["--expose-gc", "--import", "tsx", path.join(here, "log-search-server.ts"), dir],
    {
      stdio: ["pipe", "pipe", "inherit"],
    },
  );
  const lines = createInterface({ input: child.stdout! })[Symbol.asyncIterator]();
  const next = async () => JSON.parse(((await lines.next()).value as string) ?? "null") as Record<string, number>;
  const { port } = await next();
  return {
    origin: `http://127.0.0.1:${port}`,
    async ask(what: "idle" | "peak"): Promise<number> {
      child.stdin!.write(`${what}\n`);
      return (await next()).rss!;
    },
    watch: () => child.stdin!.write("watch\n"),
    async stop() {
      const exited = new Promise((resolve) => child.once("exit", resolve));
      child.stdin!.end();
      await exited;
    },
  };
}

/** Every match of a search, page by page: the count, the requests, the time. */
async function searchAll(
  origin: string,
  id: string,
  query: string,
): Promise<{ count: number; requests: number; ms: number }> {
  const start = performance.now();
  let count = 0;
  let requests = 0;
  for (let from = 0; ; requests++) {
    const response = await fetch(`${origin}/api/jobs/${id}/search?${query}&from=${from}&limit=1000`);
    if (!response.ok) throw new Error(`search answered ${response.status}: ${await response.text()}`);
    const page = (await response.json()) as LogSearchPage;
    count += page.matches.length;
    if (page.end) return { count, requests: requests + 1, ms: performance.now() - start };
    from = page.next;
  }
}

/** `grep -c -F` over the raw file: its count and wall time (spawn included). */
function grep(rawFile: string): { count: number; ms: number } {
  const start = performance.now();
  const out = spawnSync("grep", ["-c", "-F", NEEDLE, rawFile], {
    encoding: "utf8",
    env: { ...process.env, LC_ALL: "C" },
  });
  const ms = performance.now() - start;
  if (out.status !== 0) throw new Error(`grep exited with ${out.status}: ${out.stderr}`);
  return { count: Number(out.stdout.trim()), ms };
}

export async function run(): Promise<string> {
  const mib = Number(process.env.BENCH_LOG_MIB) > 0 ? Number(process.env.BENCH_LOG_MIB) : 256;
  const dir = await mkdtemp(path.join(os.tmpdir(), "bench-log-search-"));
  const rawFile = path.join(dir, "job.log");
  const id = randomUUID();
  const filled = await fill(path.join(dir, "store"), id, mib, rawFile);
  const server = await startServer(path.join(dir, "store"));
  try {
    const q = `q=${encodeURIComponent(NEEDLE)}`;
    // Warm-up: the store builds its line index on the job's first read, and the file is read into the page cache.
    await searchAll(server.origin, id, `${q}&case=1`);
    grep(rawFile);
    const idle = await server.ask("idle");
    server.watch();
    const ours: Array<{ count: number; requests: number; ms: number }> = [];
    const peer: Array<{ count: number; ms: number }> = [];
    // In turns, so load weighs on both alike.
    for (let round = 0; round < 5; round++) {
      ours.push(await searchAll(server.origin, id, `${q}&case=1`));
      peer.push(grep(rawFile));
    }
    const peak = await server.ask("peak");
    const nocase = await searchAll(server.origin, id, q);
    const regex = await searchAll(
      server.origin,
      id,
      `q=${encodeURIComponent("ERROR: build st[e]p fail")}&regex=1&case=1`,
    );
    const expected = Math.ceil(filled.lines / EVERY);
    for (const r of [...ours, ...peer, nocase, regex])
      if (r.count !== expected) throw new Error(`a search counted ${r.count} lines, not ${expected}`);
    const oursMs = median(ours.map((r) => r.ms));
    const peerMs = median(peer.map((r) => r.ms));
    const load = os
      .loadavg()
      .map((l) => l.toFixed(2))
      .join(" / ");
    const rss = (n: number) => `${(n / MiB).toFixed(1)} MiB`;
    return [
      `## Log search: a ${mib} MiB job log`,
      "",
      `Method: ${filled.lines.toLocaleString("en")} lines (${mib} MiB, ~100 bytes each, every ${EVERY.toLocaleString("en")}th holding the needle \`${NEEDLE}\`, every 101st a near miss) stored in the **fs log store** (the embedded default; written in ${(filled.ms / 1000).toFixed(1)} s, fsync off), the same lines written as a plain text file beside it. Ours: the console's \`GET api/jobs/<id>/search?q=…&case=1&limit=1000\` in a server child process (\`createConsole\` on node:http), fetched page after page from \`next\` until \`end\` by the bench process — the fs store's byte fast path (log-find.ts). Peer: \`grep -c -F\` over the text file (\`LC_ALL=C\`, spawn included), same run. Both after a warm-up (page cache warm, the store's line index built), in turns, 5 rounds, medians. Memory: the server's RSS sampled every 5 ms through the 5 searches, peak − its idle RSS after the warm-up and a GC (so idle holds the one 4 MiB read buffer the fs store keeps for the next search). Load average at the end (1 / 5 / 15 min): ${load}.`,
      "",
      "| measure | ours | peer (`grep -c -F`) | ratio ours ÷ peer |",
      "|---|---:|---:|---:|",
      `| case-sensitive literal over the whole log (median of 5) | ${oursMs.toFixed(0)} ms (${ours[0]!.requests} requests) | ${peerMs.toFixed(0)} ms | ${(oursMs / peerMs).toFixed(2)}× (target ≤ 2×) |`,
      `| all rounds | ${ours.map((r) => r.ms.toFixed(0)).join(" / ")} ms | ${peer.map((r) => r.ms.toFixed(0)).join(" / ")} ms | |`,
      `| lines found (each search equals grep's count) | ${expected.toLocaleString("en")} | ${peer[0]!.count.toLocaleString("en")} | |`,
      `| server RSS: idle → peak during the searches | ${rss(idle)} → ${rss(peak)}: **+${rss(Math.max(0, peak - idle))}** (target ≤ 64 MiB) | | |`,
      `| case-insensitive literal (fs fast path: the block as Latin-1, an \`i\` RegExp) | ${nocase.ms.toFixed(0)} ms (${nocase.requests} requests) | ${peerMs.toFixed(0)} ms | ${(nocase.ms / peerMs).toFixed(1)}× (no target) |`,
      `| RE2 expression, case-sensitive (read path, re2js) | ${regex.ms.toFixed(0)} ms (${regex.requests} requests) | ${peerMs.toFixed(0)} ms | ${(regex.ms / peerMs).toFixed(1)}× (no target) |`,
    ].join("\n");
  } finally {
    await server.stop();
    await rm(dir, { recursive: true, force: true });
  }
}
