/**
 * Child process of bench/runner-fleet.ts: one runner server on PostgreSQL (a throw-away
 * schema), a memory queue, token check on. Counts stored lines (onLog) and results (onEnd);
 * on request it follows jobs with `follow()` and records, for every line delivered, the delay
 * since the agent wrote it (the agent puts its clock in the line: `<seq> <epoch ms> …`); at the
 * end it reads every job back from the store and checks each line is there once, in order.
 *
 * IPC in: `{ follow: ids }`, `"sample"`, `{ probeFollow: ids }`, `{ verify: { id: lines }[] }`, `"exit"`.
 * IPC out: `{ port }` once listening, then one answer per request.
 */
import { readFileSync, writeFileSync } from "node:fs";
import http2 from "node:http2";
import { syncBuiltinESMExports } from "node:module";
import v8 from "node:v8";
import { Session } from "node:inspector/promises";
import pg from "pg";
import { createMemoryQueue } from "../src/adapters/memory/queue.js";
import { createMemoryLogStore } from "../src/adapters/memory/log-store.js";
import { createPostgresLogStore } from "../src/adapters/postgres/log-store.js";
import { startRunnerServer } from "../src/runner/server/start-server.js";
import { createRunnerService } from "../src/runner/index.js";
import { backlogOf } from "../src/runner/service/store-backlog.js";

const url = process.env.BENCH_POSTGRES_URL ?? "postgres://postgres@127.0.0.1:5432/test";
const schema = `rd_fleet_${process.pid}_${Date.now().toString(36)}`;
const pool = new pg.Pool({ connectionString: url, max: Number(process.env.BENCH_FLEET_POOL ?? 20) });
pool.on("error", () => undefined);
// BENCH_FLEET_STORE=memory: the same run on the memory log store (is it the store or the rest?).
// BENCH_FLEET_GROUP_STATEMENTS: the store's appends (and job-row reads) in flight at once (groupStatements; default the store's).
const groupStatements = process.env.BENCH_FLEET_GROUP_STATEMENTS
  ? Number(process.env.BENCH_FLEET_GROUP_STATEMENTS)
  : undefined;
const logs =
  process.env.BENCH_FLEET_STORE === "memory"
    ? createMemoryLogStore()
    : createPostgresLogStore({ pool, schema, groupStatements });
/** Store calls: count and time in them (BENCH_FLEET_DEBUG prints them at exit). */
const calls: Record<string, { n: number; ms: number }> = {};
if (process.env.BENCH_FLEET_DEBUG) {
  for (const name of ["append", "get", "open", "finish", "read"] as const) {
    const f = (logs[name] as (...a: unknown[]) => Promise<unknown>).bind(logs);
    const c = (calls[name] = { n: 0, ms: 0 });
    (logs as unknown as Record<string, unknown>)[name] = async (...a: unknown[]) => {
      const t0 = performance.now();
      try {
        return await f(...a);
      } finally {
        c.n++;
        c.ms += performance.now() - t0;
      }
    };
  }
  process.on("exit", () => console.error("store calls", JSON.stringify(calls)));
}
/**
 * Delays (ms) counted in fixed buckets, allocated before the agents start: an array of every
 * delay grew by 8 bytes a line (hundreds of thousands of lines in the heavy mix), and that
 * growth counted in the server RSS the bench divides by the open streams. Buckets of
 * 0.1 ms below 100 ms, 1 ms up to 100 s (beyond: the last bucket); a quantile is reported
 * as its bucket's upper edge, the max exactly. O(1) a delay, 404 KiB each.
 */
class DelayHistogram {
  private readonly fine = new Uint32Array(1000);
  private readonly coarse = new Uint32Array(100_000);
  count = 0;
  max = Number.NaN;
  add(ms: number): void {
    const v = Math.max(0, ms);
    if (v < 100) this.fine[Math.floor(v * 10)]!++;
    else this.coarse[Math.min(99_999, Math.floor(v))]!++;
    this.count++;
    if (!(v <= this.max)) this.max = v;
  }
  quantile(q: number): number {
    if (this.count === 0) return Number.NaN;
    let rank = Math.min(this.count - 1, Math.floor(q * this.count));
    for (let i = 0; i < this.fine.length; i++) if ((rank -= this.fine[i]!) < 0) return Math.min(this.max, (i + 1) / 10);
    for (let i = 100; i < this.coarse.length; i++) if ((rank -= this.coarse[i]!) < 0) return Math.min(this.max, i + 1);
    return this.max;
  }
}

let stored = 0;
const storeDelays = new DelayHistogram();
/**
 * The steady window (every job started, none ended), as the agents' clock reads it: the
 * runner-fleet.ts parent opens and closes it. A line written inside it is also counted in the
 * steady histograms, whenever it arrives: the aim is judged at 1,000 streams, not during the
 * ramp (fewer streams, every job starting) nor the ends.
 */
const steady = { from: Infinity, to: Infinity };
const steadyStoreDelays = new DelayHistogram();
const inSteady = (at: number) => at >= steady.from && at < steady.to;
let results = 0;
const runner = createRunnerService(createMemoryQueue(), {
  logs,
  // BENCH_FLEET_QUEUED_BYTES: the server-wide budget of items not yet stored (limits.queuedBytes); default the service's.
  limits: process.env.BENCH_FLEET_QUEUED_BYTES
    ? { queuedBytes: Number(process.env.BENCH_FLEET_QUEUED_BYTES) }
    : undefined,
  secret: process.env.BENCH_SECRET ?? "bench",
  onLog: (event) => {
    stored += event.lines.length;
    // The store's share of the latency: from the agent's write to the append's return.
    const now = performance.timeOrigin + performance.now();
    for (const line of event.lines) {
      const space = line.line.indexOf(" ");
      const at = Number(line.line.slice(space + 1, line.line.indexOf(" ", space + 1)));
      storeDelays.add(now - at);
      if (inSteady(at)) steadyStoreDelays.add(now - at);
    }
  },
  onEnd: () => {
    results++;
  },
});
/**
 * The HTTP/2 streams the runner server opens, seen through its http2 server (wrapped here,
 * the bench's own instrument: startRunnerServer does not expose it), to measure what flow
 * control lets Node buffer: bytes received on streams the server has not read yet (a call
 * paused behind the store backlog keeps up to its window there) and the connections whose
 * windows were widened (runner/server/flow-window.ts). O(open streams) a sample.
 */
const openStreams = new Set<http2.ServerHttp2Stream>();
const createServer = http2.createServer;
(http2 as { createServer: unknown }).createServer = (...args: Parameters<typeof http2.createServer>) => {
  const made = createServer(...args);
  made.on("stream", (stream) => {
    openStreams.add(stream);
    stream.on("close", () => openStreams.delete(stream));
  });
  return made;
};
syncBuiltinESMExports();
function flowHeld(): { windows: number; widened: number } {
  let windows = 0;
  const sessions = new Set<http2.Http2Session>();
  for (const stream of openStreams) {
    windows += stream.readableLength;
    if (stream.session) sessions.add(stream.session);
  }
  let widened = 0;
  for (const session of sessions) if ((session.localSettings.initialWindowSize ?? 65_535) > 65_535) widened++;
  return { windows, widened };
}
const server = await startRunnerServer(runner, {
  port: 0,
  ...(process.env.BENCH_FLEET_SERVER_KEEPALIVE
    ? { keepAliveMs: Number(process.env.BENCH_FLEET_SERVER_KEEPALIVE) }
    : {}),
});
if (process.env.BENCH_FLEET_DEBUG) {
  const { monitorEventLoopDelay } = await import("node:perf_hooks");
  const h = monitorEventLoopDelay({ resolution: 10 });
  h.enable();
  let lastCpu = process.cpuUsage();
  let lastStored = 0;
  setInterval(() => {
    const c = process.cpuUsage(lastCpu);
    lastCpu = process.cpuUsage();
    console.error(
      `dbg active ${runner.activeCalls} stored/s ${stored - lastStored} cpu ${((c.user + c.system) / 1e4).toFixed(0)}% loop p99 ${(h.percentile(99) / 1e6).toFixed(0)} ms max ${(h.max / 1e6).toFixed(0)} pool idle ${pool.idleCount}/${pool.totalCount} waiting ${pool.waitingCount}`,
    );
    lastStored = stored;
    h.reset();
  }, 1000).unref();
}
const send = (m: unknown) => process.send?.(m);

/** Memory by kind: V8 heap spaces (used, committed), array buffers, and the process's memory map (smaps_rollup). */
function diagnosis(): Record<string, number> {
  const out: Record<string, number> = {};
  for (const s of v8.getHeapSpaceStatistics()) {
    out[`${s.space_name} used`] = s.space_used_size;
    out[`${s.space_name} committed`] = s.physical_space_size;
  }
  const mem = process.memoryUsage();
  out.rss = mem.rss;
  out.heapUsed = mem.heapUsed;
  out.heapCommitted = mem.heapTotal;
  out.external = mem.external;
  out.arrayBuffers = mem.arrayBuffers;
  try {
    for (const row of readFileSync("/proc/self/smaps_rollup", "utf8").split("\n")) {
      const m = /^(Rss|Anonymous|Private_Dirty|Shared_Clean|Private_Clean):\s+(\d+) kB/.exec(row);
      if (m) out[`smaps ${m[1]}`] = Number(m[2]) * 1024;
    }
  } catch {
    // Not Linux.
  }
  out.active = runner.activeCalls;
  // BENCH_FLEET_SMAPS=<prefix>: the whole memory map too, one file per diagnosis, to tell V8's pages from malloc's arenas.
  if (process.env.BENCH_FLEET_SMAPS)
    writeFileSync(`${process.env.BENCH_FLEET_SMAPS}-${Date.now()}.smaps`, readFileSync("/proc/self/smaps", "utf8"));
  return out;
}

/**
 * Time this process spent runnable but waiting for a CPU (Linux /proc/self/schedstat, second
 * field, ns), in ms: on a shared machine the server can be starved without being busy.
 */
function runQueueMs(): number {
  try {
    return Number(readFileSync("/proc/self/schedstat", "utf8").split(" ")[1]) / 1e6;
  } catch {
    return NaN;
  }
}

/** Delays (ms) of followed lines, and per followed job the next sequence number expected. */
const delays = new DelayHistogram();
const steadyDelays = new DelayHistogram();
let followErrors = 0;
const followers: Promise<void>[] = [];
const stopFollow = new AbortController();

async function follow(id: string): Promise<void> {
  let next = 0;
  for await (const line of runner.follow(id, { signal: stopFollow.signal })) {
    const now = performance.timeOrigin + performance.now();
    const space = line.line.indexOf(" ");
    const seq = Number(line.line.slice(0, space));
    const at = Number(line.line.slice(space + 1, line.line.indexOf(" ", space + 1)));
    if (seq !== next) followErrors++;
    next = seq + 1;
    delays.add(now - at);
    if (inSteady(at)) steadyDelays.add(now - at);
  }
}

/**
 * The cost of one follow() while the jobs stream: for each job in turn, a new follow() from
 * line 0 until its first line arrives (a store read and the follower's set-up), in ms.
 */
async function probeFollow(ids: string[]): Promise<number[]> {
  const times: number[] = [];
  for (const id of ids) {
    const stop = new AbortController();
    const t0 = performance.now();
    for await (const _ of runner.follow(id, { signal: stop.signal })) break;
    times.push(performance.now() - t0);
    stop.abort();
  }
  return times;
}

async function verify(
  expected: { id: string; lines: number }[],
): Promise<{ jobs: number; whole: number; problems: string[] }> {
  const problems: string[] = [];
  let whole = 0;
  for (const { id, lines } of expected) {
    const state = await logs.get(id);
    const got = await logs.read(id, 0);
    let ok = state?.status === "finished" && state.committed === lines + 1 && got.length === lines;
    for (let i = 0; ok && i < got.length; i++) if (!got[i]!.line.startsWith(`${i} `)) ok = false;
    if (ok) whole++;
    else if (problems.length < 5)
      problems.push(`${id}: status ${state?.status}, committed ${state?.committed}, read ${got.length}, sent ${lines}`);
  }
  return { jobs: expected.length, whole, problems };
}

/**
 * BENCH_FLEET_ALLOC=<file>: V8's sampling heap profiler over the run (from start until the
 * agents are done), counting objects the scavenger and the mark-compactor collected too, so
 * the profile is where the server allocates (what grows the young generation), not only what
 * stays. Written as a .heapprofile (Chrome DevTools' Memory tab reads it).
 */
const allocProfile = process.env.BENCH_FLEET_ALLOC ? new Session() : null;
if (allocProfile) {
  allocProfile.connect();
  await allocProfile.post("HeapProfiler.startSampling", {
    samplingInterval: 16_384,
    includeObjectsCollectedByMajorGC: true,
    includeObjectsCollectedByMinorGC: true,
  });
}

process.on("message", async (m: unknown) => {
  if (m === "sample") {
    const mem = process.memoryUsage();
    const cpu = process.cpuUsage();
    // What the server holds unstored: entries queued for the store (the budget's count) and incomplete messages.
    const held = { backlog: backlogOf(runner)?.held ?? 0, reading: server.heldBytes, ...flowHeld() };
    send({
      rss: mem.rss,
      heap: mem.heapUsed,
      cpuMs: (cpu.user + cpu.system) / 1000,
      stored,
      results,
      active: runner.activeCalls,
      runQueueMs: runQueueMs(),
      held,
    });
    return;
  }
  if (m === "sampleGc") {
    // Live memory with the streams open: a full collection first (the server runs with --expose-gc).
    const gc = (globalThis as { gc?: () => void }).gc;
    gc?.();
    gc?.();
    const mem = process.memoryUsage();
    // Committed bytes by V8 space (new, old, code, large object…) and Node's array buffers: the
    // marginal figure (runner-fleet.ts) shows which of them grow with the calls and which not.
    const spaces: Record<string, number> = { arrayBuffers: mem.arrayBuffers };
    for (const s of v8.getHeapSpaceStatistics()) spaces[s.space_name] = s.physical_space_size;
    send({
      rss: mem.rss,
      heap: mem.heapUsed,
      external: mem.external,
      active: runner.activeCalls,
      gc: gc !== undefined,
      spaces,
    });
    return;
  }
  if (m === "diag") {
    // BENCH_FLEET_DIAG: where the bytes are, after a full GC (see diagnosis() in runner-fleet.ts).
    const gc = (globalThis as { gc?: () => void }).gc;
    gc?.();
    gc?.();
    send(diagnosis());
    return;
  }
  if (typeof m === "object" && m !== null && "snapshot" in m) {
    // BENCH_FLEET_SNAPSHOT: a heap snapshot of the server with the calls open (a pause of seconds).
    send({ file: v8.writeHeapSnapshot((m as { snapshot: string }).snapshot) });
    return;
  }
  if (m === "steadyFrom" || m === "steadyTo") {
    steady[m === "steadyFrom" ? "from" : "to"] = performance.timeOrigin + performance.now();
    send({ ok: true });
    return;
  }
  if (m === "exit") {
    stopFollow.abort();
    await Promise.allSettled(followers);
    await server.close();
    await runner.close();
    await logs.close?.();
    await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`).catch(() => undefined);
    await pool.end();
    process.exit(0);
  }
  const msg = m as {
    follow?: string[];
    probeFollow?: string[];
    verify?: { id: string; lines: number }[];
    delays?: boolean;
  };
  if (msg.follow) {
    for (const id of msg.follow) followers.push(follow(id).catch(() => void followErrors++));
    send({ following: msg.follow.length });
  } else if (msg.delays) {
    // Followers end with their jobs; wait for them so every delivered line counts.
    await Promise.allSettled(followers);
    if (allocProfile) {
      const { profile } = await allocProfile.post("HeapProfiler.stopSampling");
      writeFileSync(process.env.BENCH_FLEET_ALLOC!, JSON.stringify(profile));
    }
    const q = (h: DelayHistogram) => ({ lines: h.count, p50: h.quantile(0.5), p99: h.quantile(0.99), max: h.max });
    send({
      ...q(delays),
      followErrors,
      stored: { p50: storeDelays.quantile(0.5), p99: storeDelays.quantile(0.99) },
      steady: {
        ...q(steadyDelays),
        stored: { p50: steadyStoreDelays.quantile(0.5), p99: steadyStoreDelays.quantile(0.99) },
      },
    });
  } else if (msg.probeFollow) {
    send(await probeFollow(msg.probeFollow));
  } else if (msg.verify) {
    send(await verify(msg.verify));
  }
});
send({ port: server.port });
