/**
 * The tail kept (issue 24, item 1): what keeping a cut log's tail costs on ingest. One job of BENCH_TAIL_MIB
 * (default 64) MiB of 200-byte lines goes over a raw gRPC call (HTTP/2, frames written as fast as flow control
 * lets them) to `startRunnerServer` in a child process (bench/runner-worker.ts), timed to the acknowledged end.
 * Four servers, rounds alternating, on the memory store and the fs store (fsync on):
 * - tail kept: a 16 MiB limit (a 12 MiB head, a 4 MiB tail): every line past the head goes to the tail and the
 *   store drops its oldest segments as it goes; and the same under a 1 MiB limit, whose 32 KiB segments are far
 *   smaller than one append (the worst case: segment files made and dropped on every append);
 * - the peer: the limit high enough (1 GiB) that the cut never happens: the same lines stored, nothing dropped;
 * - for reference, the drop behaviour before the tail (`tailBytes: 0`): past the limit lines are counted, not
 *   stored, so it does less work than either (it is not the peer: it keeps nothing).
 * Run alone: `npm run bench -- runner-tail`.
 */
import { fork, type ChildProcess } from "node:child_process";
import { randomUUID } from "node:crypto";
import { once } from "node:events";
import type * as http2 from "node:http2";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { mkdtemp, rm } from "node:fs/promises";
import { createFsLogStore } from "../src/adapters/fs/log-store.js";
import { createMemoryLogStore } from "../src/adapters/memory/log-store.js";
import type { JobLogStore, LogEntry } from "../src/runner/ports.js";
import { ReceivedLine } from "../src/runner/protocol/received-line.js";
import { mintJobToken } from "../src/runner/protocol/token.js";
import { connect, frame, openCall } from "../test/fixtures/runner-raw-calls.js";
import { end, line } from "../test/fixtures/runner-service.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const SECRET = "bench-tail-secret";
const MiB = 1024 * 1024;
const JOB_MIB = Number(process.env.BENCH_TAIL_MIB ?? 64);
const ROUNDS = Number(process.env.BENCH_TAIL_ROUNDS ?? 5);
/**
 * Jobs (or store-alone pairs) a process takes before it is measured as running: the cut path's functions run ~20
 * times a job, so V8 takes several jobs to finish compiling them (docs/decisions/log-tail.md, "Warm-up").
 */
const WARM = Number(process.env.BENCH_TAIL_WARM ?? 3);
/** Pairs of the store-alone rows (after WARM warm-up pairs): enough that a 5 % difference stands out of the noise. */
const STORE_PAIRS = Number(process.env.BENCH_TAIL_STORE_PAIRS ?? 15);
/** Rounds of the running servers' jobs (after WARM jobs each, not counted). */
const RUNNING = Number(process.env.BENCH_TAIL_RUNNING ?? 20);
const LINE = 200;
const fmt = (n: number) => Math.round(n).toLocaleString("en-US");
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
/**
 * The 95 % interval of the median of `ratios` by the bootstrap (10,000 resamples, a fixed seed so a run's section
 * can be recomputed): how far the median of this few rounds could be from the machine's own.
 */
function medianInterval(ratios: number[]): [number, number] {
  let seed = 0x2545f491;
  const random = () => {
    seed ^= seed << 13;
    seed ^= seed >>> 17;
    seed ^= seed << 5;
    return (seed >>> 0) / 2 ** 32;
  };
  const medians: number[] = [];
  for (let i = 0; i < 10_000; i++)
    medians.push(median(ratios.map(() => ratios[Math.floor(random() * ratios.length)]!)));
  medians.sort((a, b) => a - b);
  return [medians[249]!, medians[9_749]!];
}
/** A ratio against the peer as a cost: 1.05 → "5.0 %". */
const percent = (ratio: number) => `${((ratio - 1) * 100).toFixed(1)} %`;

interface Config {
  name: string;
  limits: Record<string, number>;
}

const CONFIGS: Config[] = [
  {
    name: "tail kept, 16 MiB limit (12 MiB head, 4 MiB tail in 512 KiB segments)",
    limits: { jobLogBytes: 16 * MiB },
  },
  { name: "peer: limit not reached (1 GiB)", limits: { jobLogBytes: 1024 * MiB } },
  {
    name: "tail kept, 1 MiB limit (768 KiB head, 256 KiB tail in 32 KiB segments: segments far smaller than an append)",
    limits: { jobLogBytes: MiB },
  },
  {
    name: "reference: drop past a 16 MiB limit, no tail (`tailBytes: 0`)",
    limits: { jobLogBytes: 16 * MiB, tailBytes: 0 },
  },
];
/** The configuration the peer is. */
const PEER = 1;

interface Server {
  port: number;
  /** The server process's CPU time so far (user + system), in ms. */
  cpu(): Promise<number>;
  /** Forgets the server's ended jobs (their lines and files). */
  prune(): Promise<void>;
  stop(): Promise<void>;
}

async function startServer(store: string, limits: Record<string, number>): Promise<Server> {
  const child: ChildProcess = fork(path.join(here, "runner-worker.ts"), ["ours"], {
    // BENCH_TAIL_PROF=<dir>: a V8 CPU profile of each server child, written there on exit (docs/decisions/log-tail.md).
    execArgv: [
      "--import",
      "tsx",
      // BENCH_SERVER_ARGS: node flags for each server child (e.g. "--trace-deopt --trace-opt").
      ...(process.env.BENCH_SERVER_ARGS ? process.env.BENCH_SERVER_ARGS.split(" ") : []),
      ...(process.env.BENCH_TAIL_PROF ? ["--cpu-prof", `--cpu-prof-dir=${process.env.BENCH_TAIL_PROF}`] : []),
    ],
    env: { ...process.env, BENCH_SECRET: SECRET, BENCH_LOG_STORE: store, BENCH_LIMITS: JSON.stringify(limits) },
    stdio: ["ignore", "inherit", "inherit", "ipc"],
  });
  const [first] = (await once(child, "message")) as [{ port: number }];
  return {
    port: first.port,
    async cpu() {
      const answer = once(child, "message") as Promise<[{ cpu: { user: number; system: number } }]>;
      child.send("cpu");
      const [{ cpu }] = await answer;
      return (cpu.user + cpu.system) / 1000;
    },
    async prune() {
      const answer = once(child, "message");
      child.send("prune");
      await answer;
    },
    async stop() {
      const exited = once(child, "exit");
      child.send("exit");
      const timer = setTimeout(() => child.kill("SIGKILL"), 10_000);
      await exited;
      clearTimeout(timer);
    },
  };
}

/** The job's frames, made before the clock starts: JOB_MIB of LINE-byte lines, then the end item. */
function jobFrames(id: string): Buffer[] {
  const lines = Math.floor((JOB_MIB * MiB) / LINE);
  const blocks: Buffer[] = [];
  let block: Buffer[] = [];
  let size = 0;
  for (let i = 0; i < lines; i++) {
    const head = `step ${i} `;
    const f = frame(line(id, head + "x".repeat(LINE - head.length), i % 10 === 9));
    block.push(f);
    size += f.length;
    if (size >= MiB) {
      blocks.push(Buffer.concat(block));
      block = [];
      size = 0;
    }
  }
  block.push(frame(end(id, 0)));
  blocks.push(Buffer.concat(block));
  return blocks;
}

/** One job over one call; MB/s of line bytes to the acknowledged end. */
async function ingest(port: number): Promise<number> {
  const id = randomUUID();
  const blocks = jobFrames(id);
  const session = connect(`http://127.0.0.1:${port}`);
  try {
    const t0 = performance.now();
    const call = openCall(session, "grpc", mintJobToken(SECRET, id));
    const s: http2.ClientHttp2Stream = call.stream;
    for (const b of blocks) if (!s.write(b)) await new Promise((resolve) => s.once("drain", resolve));
    s.end();
    const status = await call.status;
    const seconds = (performance.now() - t0) / 1000;
    if (status.code !== 0) throw new Error(`ingest: ${JSON.stringify(status)}`);
    return (Math.floor((JOB_MIB * MiB) / LINE) * LINE) / 1e6 / seconds;
  } finally {
    session.close();
  }
}

/**
 * A server's first job: rounds alternating between the configurations, a fresh server per round and configuration;
 * MB/s and server CPU ms. A fresh server compiles the cut path's code (TurboFan, on V8's helper threads) during its
 * first cut job, a cost a process pays once (docs/decisions/log-tail.md, "What bounds the end-to-end cost").
 */
async function measureFirst(store: string): Promise<{ rates: number[][]; cpu: number[][] }> {
  const rates = CONFIGS.map(() => [] as number[]);
  const cpu = CONFIGS.map(() => [] as number[]);
  // Warm-up: one round, not counted.
  for (let round = -1; round < ROUNDS; round++) {
    for (const [k, config] of CONFIGS.entries()) {
      const server = await startServer(store, config.limits);
      try {
        const before = await server.cpu();
        const rate = await ingest(server.port);
        const after = await server.cpu();
        if (round >= 0) {
          rates[k]!.push(rate);
          cpu[k]!.push(after - before);
        }
      } finally {
        await server.stop();
      }
    }
  }
  return { rates, cpu };
}

/**
 * What a running server pays a job: one server per configuration, all started at once, each given WARM jobs first (not
 * counted: they compile), then RUNNING rounds of one job per configuration, the order rotating a round so none always
 * follows another; after every job the server prunes every earlier job (the memory store's peer would otherwise hold
 * every 64 MiB job; the one just ended stays, as a running server keeps its ended jobs), with no
 * forced collection: gc() between jobs made V8 drop and recompile its optimized code in every job, which cost the cut
 * path most (docs/decisions/log-tail.md, "Session of 2026-11-30"). Server CPU ms per job. A round's jobs ran back to back under
 * the same load, so the median of the rounds' ratios against the peer is the steadier figure.
 */
async function measureRunning(store: string): Promise<number[][]> {
  const cpu = CONFIGS.map(() => [] as number[]);
  const servers: Server[] = [];
  try {
    for (const config of CONFIGS) servers.push(await startServer(store, config.limits));
    for (let round = -WARM; round < RUNNING; round++) {
      for (let i = 0; i < CONFIGS.length; i++) {
        const k = (i + Math.max(0, round)) % CONFIGS.length;
        const server = servers[k]!;
        const before = await server.cpu();
        await ingest(server.port);
        const after = await server.cpu();
        await server.prune();
        if (round >= 0) cpu[k]!.push(after - before);
      }
    }
  } finally {
    for (const server of servers) await server.stop();
  }
  return cpu;
}

/**
 * The job's entries as the fast path hands them to the store (cost 16 + 200 a line): received lines, views of 64 KiB
 * request chunks (runner/protocol/received-line.ts), stamped from now; the one that passes the head's share a plain
 * entry marked as the tail's start when `tailBytes` > 0 (as call/item-rules.ts makes it). Plain entries throughout
 * hid most of the memory store's cost: it copies a received line's bytes, and writes a plain one's text.
 */
function* entries(limit: number, tailBytes: number): Generator<LogEntry[]> {
  const lines = Math.floor((JOB_MIB * MiB) / LINE);
  const head = limit - tailBytes;
  let out: LogEntry[] = [];
  const t0 = Date.now();
  let chunk = Buffer.alloc(0);
  let at = 0;
  let stored = 0;
  let cut = false;
  for (let i = 0; i < lines; i++) {
    if (at + LINE > chunk.length) {
      chunk = Buffer.alloc(64 * 1024);
      at = 0;
    }
    const text = `step ${i} `;
    chunk.write(text + "x".repeat(LINE - text.length), at, "latin1");
    const stderr = i % 10 === 9;
    const time = t0 + i / 100;
    const bytes = LINE + 16;
    if (!cut && tailBytes > 0 && stored + bytes > head) {
      cut = true;
      const line = chunk.toString("latin1", at, at + LINE);
      out.push({ stored: [{ line, stderr, time }], stderr, bytes, capped: true, tailBytes });
    } else {
      const r = new ReceivedLine("bench", chunk, at, at + LINE, stderr, time, -1, true);
      r.bytes = bytes;
      out.push(r);
    }
    stored += bytes;
    at += LINE;
    if (out.length === APPEND) {
      yield out;
      out = [];
    }
  }
  if (out.length > 0) yield out;
}

/**
 * Entries an append: what the server's appends hold in the end-to-end rows (BENCH_STORE_TIMING on the worker: a
 * 32 MiB job's ~167,800 items in 21–23 appends). The fs store's cut costs far more at this size than at 2,000
 * (docs/decisions/log-tail.md, "Where the end-to-end cost went").
 */
const APPEND = Number(process.env.BENCH_TAIL_APPEND ?? 7600);

/**
 * CPU ms of appending the job's entries to `store`, APPEND entries an append, counted around the appends only; the
 * job is opened first. Each append's entries are made just before it (and let go after), so the harness's heap does
 * not hold both 64 MiB jobs and each collection weighs on the job that made its garbage.
 */
async function appendCpu(store: JobLogStore, batches: Iterable<LogEntry[]>): Promise<number> {
  const id = randomUUID();
  await store.open(id);
  let at = 0;
  let us = 0;
  for (const batch of batches) {
    const t0 = process.cpuUsage();
    await store.append(id, at, batch);
    const t = process.cpuUsage(t0);
    us += t.user + t.system;
    at += batch.length;
  }
  return us / 1000;
}

/** The store alone, in this process: the same entries with the tail kept (16 MiB limit) and under 1 GiB. */
async function storeRows(): Promise<string[]> {
  const rows: string[] = [];
  for (const kind of ["memory", "fs"]) {
    const times: [number[], number[]] = [[], []];
    for (let round = -WARM; round < STORE_PAIRS; round++) {
      // Pairs alternate which goes first, so neither always runs after the other's garbage.
      const order = round % 2 === 0 ? [0, 1] : [1, 0];
      for (const k of order) {
        // A fresh store (and directory) per job: the memory store keeps the peer's 64 MiB otherwise.
        const dir = await mkdtemp(path.join(os.tmpdir(), "rd-bench-tail-"));
        const store = kind === "fs" ? createFsLogStore(dir, { fsync: false }) : createMemoryLogStore();
        try {
          const ms = await appendCpu(store, k === 0 ? entries(16 * MiB, 4 * MiB) : entries(1024 * MiB, 256 * MiB));
          if (round >= 0) times[k]!.push(ms);
        } finally {
          await store.close?.();
          await rm(dir, { recursive: true, force: true });
        }
      }
    }
    const [a, b] = [median(times[0]), median(times[1])];
    // Each pair ran back to back under the same load: the median of their ratios is the steadier figure.
    const paired = median(times[0].map((t, i) => t / times[1][i]!));
    rows.push(
      `| ${kind === "fs" ? "fs (fsync off: CPU only)" : kind} | ${fmt(a)} | ${times[0].map(fmt).join(" / ")} | ${fmt(b)} | ${times[1].map(fmt).join(" / ")} | ${(((a - b) / b) * 100).toFixed(1)} % | ${((paired - 1) * 100).toFixed(1)} % |`,
    );
  }
  return rows;
}

/** Runs the tail benchmark and returns its Markdown section. */
export async function run(): Promise<string> {
  const loadAtStart = os.loadavg()[0]!;
  const rows: string[] = [];
  // BENCH_TAIL_ONLY=store: the store rows alone (a quick look without the servers); =fs or =memory: those servers.
  const only = process.env.BENCH_TAIL_ONLY;
  const stores = only === "fs" || only === "memory" ? [] : await storeRows();
  const running: string[] = [];
  for (const store of only === "store" ? [] : only === "fs" || only === "memory" ? [only] : ["memory", "fs"]) {
    const label = store === "fs" ? "fs (fsync on)" : store;
    const { rates, cpu } = await measureFirst(store);
    const peer = median(rates[PEER]!);
    const peerCpu = median(cpu[PEER]!);
    for (const [k, config] of CONFIGS.entries()) {
      const m = median(rates[k]!);
      const c = median(cpu[k]!);
      // Time cost: how much longer the job took than the peer's (rates: peer ÷ ours − 1).
      const cost = k === PEER ? "—" : `${((peer / m - 1) * 100).toFixed(1)} %`;
      rows.push(
        `| ${label} | ${config.name} | ${fmt(m)} | ${rates[k]!.map(fmt).join(" / ")} | ${cost} | ${fmt(c)} | ${cpu[k]!.map(fmt).join(" / ")} | ${k === PEER ? "—" : percent(c / peerCpu)} |`,
      );
    }
    const later = await measureRunning(store);
    const peerLater = later[PEER]!;
    for (const [k, config] of CONFIGS.entries()) {
      const c = median(later[k]!);
      const ratios = later[k]!.map((t, i) => t / peerLater[i]!);
      const [low, high] = medianInterval(ratios);
      running.push(
        `| ${label} | ${config.name} | ${fmt(c)} | ${later[k]!.map(fmt).join(" / ")} | ${k === PEER ? "—" : percent(c / median(peerLater))} | ${k === PEER ? "—" : percent(median(ratios))} | ${k === PEER ? "—" : `${percent(low)} to ${percent(high)}`} |`,
      );
    }
  }
  return [
    "## Runner: the tail kept",
    "",
    `Method: one job of ${JOB_MIB} MiB of ${LINE}-byte lines (every 10th on stderr) written as fast as HTTP/2 flow control lets it over one raw gRPC call (frames made before the clock starts) to \`startRunnerServer\` in a child process, timed to the acknowledged end; MB = 10⁶ bytes of line text; server CPU: the child's user + system time over the job (less swayed by other work on the machine than the wall clock). A cost is (ours − peer) ÷ peer: negative means cheaper. The peer is the same job under a limit it never reaches: every line stored either way, so the difference is what the cut costs (the rolling tail's segments, the drops). The drop behaviour before the tail stores nothing past the limit; it is shown for reference, not as the peer.`,
    "",
    `A server's first job: a fresh server per round and configuration, one warm-up round, then ${ROUNDS} rounds alternating between the configurations. A fresh process compiles the cut path's code during its first cut job, a cost it pays once.`,
    "",
    "| store | configuration | MB/s (median) | all rounds | time cost against the peer | server CPU ms (median) | all rounds | CPU cost against the peer |",
    "|---|---|---:|---:|---:|---:|---:|---:|",
    ...rows,
    "",
    `What a running server pays a job: one server per configuration, all running at once, each given ${WARM} jobs first (not counted: V8 finishes compiling the cut path's code over the first few), then ${RUNNING} rounds of one job per configuration, the order rotating each round; after each job every earlier job pruned (a server holds the one just ended, as a running server keeps its ended jobs), and no collection forced (\`gc()\` between jobs made V8 recompile its optimized code in every job). The cost of the medians, and the median of the rounds' own ratios (a round's jobs ran back to back, under the same load) with its bootstrap interval: one job's server CPU moves ±25 % between identical jobs on this machine, so the interval, not the median alone, says what the rounds can tell.`,
    "",
    "| store | configuration | server CPU ms a job (median) | all rounds | cost (medians) | cost (median of round ratios) | 95 % interval of that median (bootstrap) |",
    "|---|---|---:|---:|---:|---:|---:|",
    ...running,
    "",
    `The store alone (in the bench process, no network): the same ${JOB_MIB} MiB of entries as the fast path hands them, made just before each append (the harness holds one append's entries, not both jobs) (received lines, views of 64 KiB request chunks, 216 counted a line; the one that passes the head's share a plain entry marked as the tail's start) appended ${fmt(APPEND)} at a time (what the server's appends of this job hold) to a fresh store, the tail kept under a 16 MiB limit against the peer's 1 GiB; CPU ms of this process over the appends (user + system, summed around each append); a fresh store and directory per job, the job opened before the clock; ${WARM} warm-up pairs, then ${STORE_PAIRS} pairs, which one goes first alternating; the cost of the medians, and the median of the pairs' own ratios (each pair ran back to back, under the same load).`,
    "",
    "| store | tail kept: CPU ms (median) | all rounds | peer: CPU ms (median) | all rounds | cost (medians) | cost (median of pair ratios) |",
    "|---|---:|---:|---:|---:|---:|---:|",
    ...stores,
    "",
    `Load average (1 min) at the start and end of this run: ${loadAtStart.toFixed(1)} / ${os.loadavg()[0]!.toFixed(1)} on ${os.cpus().length} cores` +
      (Math.max(loadAtStart, os.loadavg()[0]!) > os.cpus().length
        ? " — measured under load (other work on the machine)."
        : "."),
  ].join("\n");
}

// Run directly (`node --import tsx bench/runner-tail.ts`): print the section.
if (process.argv[1] && fileURLToPath(import.meta.url) === path.resolve(process.argv[1])) {
  console.log(await run());
}
