/**
 * Per-line time (issue 23): bytes each log store and the archive keep a line with and without
 * times, and the end-to-end ingest (child → runJob → server on the memory store, times on)
 * against the physical limit of an agent: the same child's output read from its pipe and only
 * counted (no splitting, network or store), with each process's CPU time a line (which the
 * machine's load moves far less than the rates). Run alone: `npm run bench -- runner-line-time`;
 * `BENCH_CPU_PROF=<dir>` writes CPU profiles of the agent (this process) and the server;
 * `BENCH_SERVER_ARGS` adds node flags to the server (e.g. `--trace-gc`).
 */
import { fork, spawn, type ChildProcess } from "node:child_process";
import { randomBytes, randomUUID } from "node:crypto";
import { once } from "node:events";
import { closeSync, openSync, writeSync } from "node:fs";
import { mkdtemp, readdir, readFile, rm, stat, unlink } from "node:fs/promises";
import http2 from "node:http2";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import pg from "pg";
import { createFsLogStore } from "../src/adapters/fs/index.js";
import { createPostgresLogStore } from "../src/adapters/postgres/index.js";
import { ArchiveWriter } from "../src/runner/archive/format.js";
import { readPipe } from "../src/runner/agent/pipe-reader.js";
import { runJob } from "../src/runner/agent/run-job.js";
import { createRunnerClient, type RunnerClient } from "../src/runner/client/runner-client.js";
import { mintJobToken } from "../src/runner/protocol/token.js";
import { createSpool } from "../src/runner/client/spool.js";
import { createLogItemEncoder } from "../src/runner/protocol/encoder.js";
import type { JobLogStore, LogEntry, StoredLine } from "../src/runner/ports.js";
import { POSTGRES_URL } from "../test/fixtures/backends.js";
import { aimBudget, childSecondsOf } from "./aim-bound.js";
import { leanJob, leanRunsJob, transportJob } from "./lean-agents.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const SECRET = "bench-secret";
const LINE = "x".repeat(99); // + newline = 100 bytes
const LINES = Number(process.env.BENCH_RUNNER_LINES ?? 300_000);
const ROUNDS = Number(process.env.BENCH_RUNNER_ROUNDS ?? 3);
const SIZE_LINES = 20_000;
const fmt = (n: number) => Math.round(n).toLocaleString("en-US");
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

/**
 * The job: `lines` lines of 100 bytes as fast as a pipe takes them. With `timesFile`, the shell then writes its
 * `times` there, whose second line is the CPU of `yes` and `head` (the aim's bound takes it off the cores' time).
 */
function printer(lines: number, timesFile?: string): { command: string; args: string[] } {
  const times = timesFile === undefined ? "" : `; times > '${timesFile}'`;
  return { command: "sh", args: ["-c", `yes ${LINE} | head -n ${lines}${times}`] };
}

/**
 * The CPU seconds of the children of the job shell that wrote `timesFile` (none asked: undefined). The file is
 * removed once read, so a shell that died before `times` fails the run instead of lending it the last job's.
 */
async function childSecondsIn(timesFile: string | undefined): Promise<number | undefined> {
  if (timesFile === undefined) return undefined;
  const seconds = childSecondsOf(await readFile(timesFile, "utf8"));
  await unlink(timesFile);
  return seconds;
}

/** A run's rate (lines/s, spawn to the end) and CPU µs a line (user + system) of the processes named. */
interface Figures {
  rate: number;
  /** This process: the reader of the pipe, or the agent (runJob, the client). */
  cpuHere: number;
  /** The server process (0 for the pipe alone). */
  cpuServer: number;
  /** The child's own CPU seconds (`yes` + `head`, from the job shell's `times`), where they were asked for. */
  childSeconds?: number;
}

/**
 * The physical limit: the child's stdout read from its pipe, newlines counted; lines/s from spawn to close.
 * `reused`: read as the agent reads (readPipe: one reused buffer), else with node's fresh buffer per read.
 */
async function pipeOnly(lines: number, reused = true, timesFile?: string): Promise<Figures> {
  const { command, args } = printer(lines, timesFile);
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  const child = spawn(command, args, { stdio: ["ignore", "pipe", "inherit"] });
  let count = 0;
  const onData = (b: Buffer) => {
    for (let i = b.indexOf(10); i !== -1; i = b.indexOf(10, i + 1)) count++;
  };
  if (reused) {
    const reader = readPipe(child.stdout, onData, () => undefined);
    if (!reader.reused) throw new Error("pipe: readPipe fell back to node's reads");
    await Promise.all([once(child, "exit"), reader.done]);
  } else {
    child.stdout.on("data", onData);
    await once(child, "close");
  }
  const seconds = (performance.now() - t0) / 1000;
  const cpu = process.cpuUsage(cpu0);
  if (count !== lines) throw new Error(`pipe: ${count} of ${lines} lines`);
  const childSeconds = await childSecondsIn(timesFile);
  return { rate: lines / seconds, cpuHere: (cpu.user + cpu.system) / lines, cpuServer: 0, childSeconds };
}

/**
 * The server (bench/runner-worker.ts: `ours` on the memory store, or bench/lean-pipeline.ts's) in a child process,
 * optionally under --cpu-prof.
 */
async function startServer(
  profileDir?: string,
  mode: "ours" | LeanKind = "ours",
  env: Record<string, string> = {},
): Promise<{
  port: number;
  cpu(): Promise<number>;
  expect(id: string, secrets: string[]): Promise<void>;
  prune(): Promise<void>;
  stop(): Promise<void>;
}> {
  const child: ChildProcess = fork(path.join(here, "runner-worker.ts"), [mode], {
    execArgv: [
      "--import",
      "tsx",
      ...(process.env.BENCH_SERVER_ARGS ? process.env.BENCH_SERVER_ARGS.split(" ") : []),
      ...(profileDir ? ["--cpu-prof", `--cpu-prof-dir=${profileDir}`, "--cpu-prof-name=server.cpuprofile"] : []),
    ],
    env: { ...process.env, BENCH_SECRET: SECRET, BENCH_LOG_STORE: "memory", ...env },
    stdio: ["ignore", "inherit", "inherit", "ipc"],
  });
  const [first] = (await once(child, "message")) as [{ port: number }];
  return {
    port: first.port,
    /** The server process's CPU time so far (user + system), in µs. */
    async cpu() {
      child.send("cpu");
      const [m] = (await once(child, "message")) as [{ cpu: NodeJS.CpuUsage }];
      return m.cpu.user + m.cpu.system;
    },
    /** Registers the job with its secrets (the service masks them too). */
    async expect(id: string, secrets: string[]) {
      child.send({ expect: id, secrets });
      await once(child, "message");
    },
    /** Prunes the jobs that ended before the last prune (bench/runner-worker.ts), as a server's retention does. */
    async prune() {
      child.send("prune");
      await once(child, "message");
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

/** A worker server as {@link startServer} gives it. */
type Server = Awaited<ReturnType<typeof startServer>>;

/** How {@link oursJob} runs its agent. */
interface AgentOptions {
  /** Registered on both sides (the agent's and the service's masking). */
  secrets?: string[];
  /** Prune the server's ended jobs after this one, timed with it (a server's retention). */
  prune?: boolean;
  /**
   * The agent as it was before runs of lines went to the client whole: one line a call (`logUtf8`, no `logLines`);
   * both sides of a pair reach the client through the same kind of object.
   */
  perLine?: boolean;
  /**
   * A local echo into /dev/null, as the agent's CLI echoes to its console: a write a line (`onLine`, as the CLI did
   * before 2026-11-30) or bytes a pipe read (`onOutput`, as it does now). Synchronous writes, as node's to a file.
   */
  echo?: "lines" | "bytes";
  /** Where the job shell writes its `times` ({@link printer}). */
  timesFile?: string;
  /** The client's `runs` option: false sends a frame a line, as before runs of lines (default true). */
  runs?: boolean;
}

/** One job end to end: child → runJob (stamps every pipe read, masks `secrets`) → client → server; rate and CPU a line. */
async function oursJob(server: Server, lines: number, options: AgentOptions = {}): Promise<Figures> {
  const { secrets = [], prune = false, perLine = false, echo, timesFile, runs = true } = options;
  const requestId = randomUUID();
  if (secrets.length > 0) await server.expect(requestId, secrets);
  const real = createRunnerClient({
    endpoint: `http://127.0.0.1:${server.port}`,
    requestId,
    token: mintJobToken(SECRET, requestId),
    runs,
  });
  const client: RunnerClient = Object.create(real);
  if (perLine) client.logLines = undefined;
  const sink = echo === undefined ? -1 : openSync("/dev/null", "w");
  const echoing =
    echo === "lines"
      ? { onLine: (line: string) => writeSync(sink, `${line}\n`) }
      : echo === "bytes"
        ? { onOutput: (bytes: Buffer) => writeSync(sink, bytes) }
        : {};
  let code = 0;
  try {
    const figures = await measured(server, lines, async () => {
      code = await runJob(client, { ...printer(lines, timesFile), secrets, ...echoing });
      // Timed with the job: letting the earlier one go (and zeroing its pooled blocks) is part of what a job costs.
      if (prune) await server.prune();
    });
    if (code !== 0) throw new Error(`job exited ${code}`);
    return { ...figures, childSeconds: await childSecondsIn(timesFile) };
  } finally {
    await real.close();
    if (sink !== -1) closeSync(sink);
  }
}

/** `job` timed, with this process's and the server's CPU over it, as {@link Figures} for `lines` lines. */
async function measured(server: { cpu(): Promise<number> }, lines: number, job: () => Promise<void>): Promise<Figures> {
  const server0 = await server.cpu();
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  await job();
  const seconds = (performance.now() - t0) / 1000;
  const cpu = process.cpuUsage(cpu0);
  const serverCpu = (await server.cpu()) - server0;
  return { rate: lines / seconds, cpuHere: (cpu.user + cpu.system) / lines, cpuServer: serverCpu / lines };
}

/** The servers of bench/lean-pipeline.ts, as bench/runner-worker.ts names them. */
type LeanKind = "lean-bytes" | "lean-frames" | "lean-template" | "lean-runs" | "lean-fields";

/**
 * One job through bench/lean-agents.ts to a bench/lean-pipeline.ts server: the child's stdout piped as it comes (`lean-bytes`, the transport alone) or
 * through the lean agent (the lean pipelines); timed from spawn to the server's answer, the connection made before.
 */
async function leanRun(
  server: { port: number; cpu(): Promise<number> },
  kind: LeanKind,
  lines: number,
  timesFile?: string,
): Promise<Figures> {
  const session = http2.connect(`http://127.0.0.1:${server.port}`);
  try {
    await once(session, "connect");
    const { command, args } = printer(lines, timesFile);
    let count = 0;
    const figures = await measured(server, lines, async () => {
      if (kind === "lean-bytes") count = await transportJob(session, command, args);
      else if (kind === "lean-runs") count = await leanRunsJob(session, command, args, "joined");
      else if (kind === "lean-fields") count = await leanRunsJob(session, command, args, "fields");
      else count = await leanJob(session, command, args);
    });
    const want = kind === "lean-bytes" ? lines * 100 : lines;
    if (count !== want) throw new Error(`${kind}: ${count} of ${want}`);
    return { ...figures, childSeconds: await childSecondsIn(timesFile) };
  } finally {
    session.close();
  }
}

/** Lines as an agent's stamps make them: one time per 64 KiB pipe read (655 lines), reads 150 µs apart. */
function pipeTimed(n: number, start: number): StoredLine[] {
  return Array.from({ length: n }, (_, i) => ({
    line: LINE,
    stderr: i % 10 === 9,
    time: start + Math.floor(i / 655) * 0.15,
  }));
}

/** Lines of a slow job: every line its own time, one a second (the fs store's deltas grow with the job). */
function secondTimed(n: number, start: number): StoredLine[] {
  return Array.from({ length: n }, (_, i) => ({ line: LINE, stderr: i % 10 === 9, time: start + i * 1000 + 0.123 }));
}

const untimed = (n: number): StoredLine[] =>
  Array.from({ length: n }, (_, i) => ({ line: LINE, stderr: i % 10 === 9 }));

async function appendAll(store: JobLogStore, id: string, lines: StoredLine[], start: number): Promise<void> {
  for (let at = 0; at < lines.length; at += 1000) {
    const entries: LogEntry[] = lines
      .slice(at, at + 1000)
      .map((l) => ({ stored: [l], stderr: l.stderr, bytes: Buffer.byteLength(l.line) }));
    await store.append(id, at, entries, new Date(start));
  }
}

/** Bytes a line in each store: the fs log file, the PostgreSQL chunk rows, the archive's records and object. */
async function bytesPerLine(): Promise<string[]> {
  const start = Date.parse("2026-11-29T09:00:00Z");
  const kinds: Array<[string, (n: number) => StoredLine[]]> = [
    ["no times", untimed],
    ["agent times (one per pipe read)", (n) => pipeTimed(n, start)],
    ["a time per line, one a second (5.5 h job)", (n) => secondTimed(n, start)],
  ];
  const dir = await mkdtemp(path.join(os.tmpdir(), "rd-bench-line-time-"));
  const pool = new pg.Pool({ connectionString: POSTGRES_URL, max: 2 });
  pool.on("error", () => undefined);
  const schema = `rd_bench_time_${process.pid}`;
  const fsStore = createFsLogStore(dir, { fsync: false });
  const pgStore = createPostgresLogStore({ pool, schema });
  const rows: number[][] = [];
  let pgBefore = 0;
  try {
    for (const [, make] of kinds) {
      const lines = make(SIZE_LINES);
      const fsId = randomUUID();
      await appendAll(fsStore, fsId, lines, start);
      const fsBytes = (await stat(path.join(dir, "jobs", `${fsId}.log`))).size;
      const pgId = randomUUID();
      await appendAll(pgStore, pgId, lines, start);
      // `before`: the same rows with the one flag byte a line that chunk rows held before times.
      const { rows: r } = await pool.query<{ n: string; before: string }>(
        `SELECT sum(octet_length(bytes) + octet_length(ends) + octet_length(flags))::bigint AS n,
                sum(octet_length(bytes) + octet_length(ends) + count)::bigint AS before
         FROM "${schema}".job_chunks WHERE request_id = $1`,
        [pgId],
      );
      if (rows.length === 0) pgBefore = Number(r[0]!.before) / SIZE_LINES;
      const writer = new ArchiveWriter();
      let object = 0;
      for (const l of lines) {
        const chunk = await writer.add(l);
        if (chunk) object += chunk.length;
      }
      for (const part of await writer.finish()) object += part.length;
      rows.push([
        fsBytes / SIZE_LINES,
        Number(r[0]!.n) / SIZE_LINES,
        writer.rawBytes / SIZE_LINES,
        object / SIZE_LINES,
      ]);
    }
  } finally {
    await fsStore.close?.();
    await pgStore.close?.();
    await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`).catch(() => undefined);
    await pool.end();
    await rm(dir, { recursive: true, force: true });
  }
  const base = rows[0]!;
  const cell = (v: number, i: number, k: number) =>
    k === 0 ? v.toFixed(2) : `${v.toFixed(2)} (+${(v - base[i]!).toFixed(2)})`;
  return [
    "### Bytes stored per line, with and without times",
    "",
    `Method: ${fmt(SIZE_LINES)} lines of 99 bytes (every 10th on stderr) appended 1,000 at a time to each store; bytes ÷ lines. ` +
      "fs: the job's log file (fsync off; the format is the same); PostgreSQL: `bytes + ends + flags` of the job's chunk rows " +
      "(before TOAST compression); archive: records before gzip, and the `.rdlog` object (gzip -6). Memory store: 8 bytes a line " +
      "by construction (a `Float64Array` of µs beside its ends and flags). In brackets: extra bytes against no times, same run.",
    "",
    "| lines | fs log file | PostgreSQL chunk rows | archive records | archive object |",
    "|---|---:|---:|---:|---:|",
    `| before times (the formats of 0.1.0; fs and archive: as no times below) | ${base[0]!.toFixed(2)} | ${pgBefore.toFixed(2)} | ${base[2]!.toFixed(2)} | ${base[3]!.toFixed(2)} |`,
    ...rows.map((r, k) => `| ${kinds[k]![0]} | ${r.map((v, i) => cell(v, i, k)).join(" | ")} |`),
    "",
    "PostgreSQL rows now hold 9 flag bytes a line whether or not the line has a time (a row's stride is fixed), so " +
      `its extra bytes are against the rows before times: ${(rows[1]![1]! - pgBefore).toFixed(2)} a line.`,
  ];
}

/** The job shell's children's CPU a line over a row's rounds (summed, since `times` counts in 10 ms ticks). */
function childCpu(fs: Figures[]): number {
  return (fs.reduce((sum, f) => sum + (f.childSeconds ?? Number.NaN), 0) * 1e6) / (LINES * fs.length);
}

/** Ten token-like secrets (43 characters each), registered on both sides for the masking-on rows. */
const SECRETS = Array.from({ length: 10 }, () => randomBytes(32).toString("base64url"));

/**
 * The end-to-end rows against the physical limit, rounds alternating, medians of ROUNDS: rates (wall clock, which
 * the machine's load moves) and CPU µs a line of each process (which it moves far less).
 */
async function endToEnd(profileDir?: string): Promise<string[]> {
  const kinds = [
    "limit",
    "nodeReads",
    "floor",
    "leanFrames",
    "leanTemplate",
    "leanRuns",
    "leanFields",
    "plain",
    "masked",
    "maskedFrames",
  ] as const;
  const runs = new Map<(typeof kinds)[number], Figures[]>(kinds.map((k) => [k, []]));
  // Every measured job's shell writes its `times` here (the child's CPU, for the aim's bound).
  const timesDir = await mkdtemp(path.join(os.tmpdir(), "rd-bench-times-"));
  const timesFile = path.join(timesDir, "times");
  for (let r = 0; r < ROUNDS; r++) {
    for (let i = 0; i < 3; i++) await pipeOnly(Math.min(LINES, 50_000));
    runs.get("limit")!.push(await pipeOnly(LINES, true, timesFile));
    runs.get("nodeReads")!.push(await pipeOnly(LINES, false));
    // The transport alone and the lean pipelines, each on its own server, warmed like ours (4 jobs).
    for (const [kind, row] of [
      ["lean-bytes", "floor"],
      ["lean-frames", "leanFrames"],
      ["lean-template", "leanTemplate"],
      ["lean-runs", "leanRuns"],
      ["lean-fields", "leanFields"],
    ] as const) {
      const lean = await startServer(undefined, kind);
      try {
        for (let i = 0; i < 4; i++) await leanRun(lean, kind, LINES);
        runs.get(row)!.push(await leanRun(lean, kind, LINES, timesFile));
      } finally {
        await lean.stop();
      }
    }
    const server = await startServer(r === 0 ? profileDir : undefined);
    try {
      // Warm-up, not counted: jobs of the measured size, because after three of 50,000 lines the first measured job
      // still cost the server 1.6–2.2 µs a line against ~1.0–1.9 for later ones (docs/decisions/ingest-limit.md,
      // "Session of 2026-11-30"); it took the first slot in half the rounds of each row. Both kinds, so the masking
      // code is warm too.
      // A running server prunes ended jobs as new ones come (its retention), so a job's lines land in the blocks of one
      // let go (the memory store's pool): docs/decisions/ingest-limit.md, "The memory store's block pool".
      const prune = process.env.BENCH_PRUNE !== "0";
      for (let i = 0; i < 4; i++) await oursJob(server, LINES, { secrets: i % 2 === 1 ? SECRETS : [], prune });
      // Rotating which goes first, so none always runs on the fresher heap.
      const rows = ["plain", "masked", "maskedFrames"] as const;
      for (let k = 0; k < rows.length; k++) {
        const kind = rows[(r + k) % rows.length]!;
        const secrets = kind === "plain" ? [] : SECRETS;
        runs
          .get(kind)!
          .push(await oursJob(server, LINES, { secrets, prune, timesFile, runs: kind !== "maskedFrames" }));
      }
    } finally {
      await server.stop();
    }
  }
  await rm(timesDir, { recursive: true, force: true });
  const limit = runs.get("limit")!;
  const l = median(limit.map((f) => f.rate));
  const lCpu = median(limit.map((f) => f.cpuHere));
  // The cores this process may run on (its CPU affinity), which os.cpus() does not tell.
  const cores = os.availableParallelism();
  const limitChild = childCpu(limit);
  const row = (name: string, fs: Figures[]) => {
    const rate = median(fs.map((f) => f.rate));
    const agent = median(fs.map((f) => f.cpuHere));
    const server = median(fs.map((f) => f.cpuServer));
    const both = median(fs.map((f) => f.cpuHere + f.cpuServer));
    // Each round against its own limit's bound, with this row's child (a pipe that fills costs it more).
    const child = childCpu(fs);
    const shares = fs.map((f, i) => (f.cpuHere + f.cpuServer) / aimBudget(limit[i]!.rate, child, cores));
    const over = shares.filter((x) => x > 1).length;
    return (
      `| ${name} | ${fmt(rate)} | ${fs.map((f) => fmt(f.rate)).join(" / ")} | ${(rate / l).toFixed(2)}× ` +
      `(rounds: ${fs.map((f, i) => (f.rate / limit[i]!.rate).toFixed(2)).join(" / ")}) | ${agent.toFixed(2)} | ${server.toFixed(2)} | ` +
      `${child.toFixed(2)} | ${both.toFixed(2)} | ${median(shares).toFixed(2)}× (over in ${over} of ${fs.length}) | ` +
      `${(lCpu / Math.max(agent, server)).toFixed(2)}× |`
    );
  };
  const reference = (fs: Figures[]) => {
    const rate = median(fs.map((f) => f.rate));
    const cpu = median(fs.map((f) => f.cpuHere));
    return (
      `| reference: the same, read with node's fresh buffer per read (the limit before 2026-11-29 19:00) | ${fmt(rate)} | ` +
      `${fs.map((f) => fmt(f.rate)).join(" / ")} | ${(rate / l).toFixed(2)}× | ${cpu.toFixed(2)} (the reader) | — | — | — | — | — |`
    );
  };
  return [
    "### End to end against the physical limit of an agent (times on)",
    "",
    `Method: the child \`yes | head -n ${fmt(LINES)}\` (100-byte lines). Limit: its stdout read from the pipe in this process and ` +
      "only counted (newlines), timed from spawn to close, read as the agent reads it (`readPipe`: one reused 64 KiB buffer; " +
      "node's own reads, a fresh buffer each, are the reference row). The transport alone: the same child's stdout piped as it " +
      "comes into one HTTP/2 request to a bare node:http2 server in a child process that counts the bytes and answers the " +
      "count (no gRPC framing, splitting, masking, time or store; windows of 1 MiB, as ours gives a busy call). The lean " +
      "pipelines (bench/lean-agents.ts, bench/lean-pipeline.ts): a reference for what a leaner design gains, not a product path (no spool, retries, masking, rules or store " +
      "port): the agent cuts lines and frames them with the project's encoder into reused 64 KiB chunks, reading ahead up to " +
      "4 MiB; the server copies each request chunk whole into 1 MiB blocks (never a line on its own) and either only walks " +
      "the frames or decodes each against the call's first. Two more lean rows measure a wire the seed's proto does not " +
      'have (docs/decisions/ingest-limit.md, "Runs of lines on the wire"): each pipe read\'s whole lines in one message, ' +
      "joined by `\\n` in one string or each line its own field. Each on its own server after 4 warm-up jobs, the connection made " +
      "before the clock starts. Ours: the same child run by `runJob` (a stamp per pipe read, " +
      "every line with its time) → `createRunnerClient` → `startRunnerServer` in a child process on the memory store, " +
      "each pipe read's lines in `LogRun` items once the server's first answer says it takes them (a frame a line in the " +
      "last row), " +
      `timed from spawn to the acknowledged end, a fresh server per round after 4 warm-up jobs of the same size (2 with masking on), pruned after every job ` +
      "as a server's retention does, the prune timed with the job (it keeps the newest ended job; the memory store " +
      "reuses the blocks of the ones it lets go; `BENCH_PRUNE=0`: never pruned); with masking on, " +
      `10 secrets of 43 characters registered on both sides (runJob's \`secrets\` and \`expectJob\`'s), so the agent and the service each scan every line. ` +
      `Medians of ${ROUNDS}, rounds alternating. CPU µs a line: user + system time of the process over the job ÷ lines ` +
      "(the bench process is the agent; the limit's reader is the same process). The last column is what the CPU figures predict " +
      "on a machine with a core free for each process (the agent and the server run in parallel, so the slower of the two sets the rate): " +
      "the limit's CPU a line ÷ the larger of the agent's and the server's. It moves far less with the machine's load than the wall-clock ratio.",
    "",
    `**The aim's CPU bound on this machine:** at 0.5× the limit (median ${(l / 1e6).toFixed(2)} M lines/s) a line has ` +
      `${cores} cores ÷ (0.5 × the limit) = ${aimBudget(l, 0, cores).toFixed(2)} µs of the cores' time, of which the ` +
      `child (\`yes\` + \`head\`, the job shell's \`times\`, summed over a row's rounds) takes its part, measured in ` +
      `each row (${limitChild.toFixed(2)} µs a line in the limit's runs). So agent + server may spend at most the ` +
      "rest: the bound. The table gives each row's agent + server CPU over its bound, both taken per round against " +
      "that round's limit (median over rounds), and in how many rounds it was over. The bound takes " +
      "every core as busy the whole job, and a row's CPU a line as what it is at the rate measured: a row over it in " +
      "every round would have to spend that much less a line to reach 0.5× here; a row under it may still not reach " +
      'it (docs/decisions/ingest-limit.md, "The aim\'s CPU bound").',
    "",
    "| measure | lines/s (median) | all rounds | ratio to the limit | agent CPU µs/line | server CPU µs/line | child CPU µs/line | agent + server | agent + server ÷ the bound | CPU-predicted ratio |",
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    `| pipe read and counted (the limit) | ${fmt(l)} | ${limit.map((f) => fmt(f.rate)).join(" / ")} | 1.00× | ${lCpu.toFixed(2)} (the reader) | — | ${limitChild.toFixed(2)} | — | — | 1.00× |`,
    reference(runs.get("nodeReads")!),
    row(
      "the transport alone: the child's stdout as it comes over one HTTP/2 stream (node:http2 both sides), bytes counted",
      runs.get("floor")!,
    ),
    row(
      "lean pipeline, no line decoded: a lean agent (split, the project's encoder, write) and a server that copies each request chunk whole and walks the frames' lengths",
      runs.get("leanFrames")!,
    ),
    row(
      "lean pipeline, every line decoded: the same, each frame checked against the call's first (request_id, layout), its line scanned for ASCII, offsets and time kept",
      runs.get("leanTemplate")!,
    ),
    row(
      "lean pipeline, runs of lines: the same server checks, but each pipe read's whole lines go in one frame (one LogChunk whose line holds them joined by `\\n`, one time a run; not the seed's protocol), cut into lines' offsets on the server",
      runs.get("leanRuns")!,
    ),
    row(
      "lean pipeline, runs of lines as fields: the same, but the run is LogItem field 4, each line its own length-delimited field (`LogRun { repeated string lines = 1; fixed64 time_unix_nano = 3 }`), walked line by line on the server",
      runs.get("leanFields")!,
    ),
    row("end to end, memory store, times on, no secrets", runs.get("plain")!),
    row("end to end, memory store, times on, masking on (10 secrets)", runs.get("masked")!),
    row(
      "the same, masking on, a frame a line (the client's `runs: false`: the wire before runs of lines)",
      runs.get("maskedFrames")!,
    ),
  ];
}

/**
 * The memory store's block pool, paired: two servers side by side that both prune after every job, one with the pool
 * (its jobs' full-size blocks are the let-go jobs') and one without (`pooledBlocks: 0`: every block new), masked jobs
 * alternating between them, which goes first alternating too. Wall-clock rates on this kind of machine scatter ±40 %
 * from job to job, so a paired count says more than two medians taken minutes apart. BENCH_POOL_PAIRS=0 skips it.
 */
async function pooledPairs(): Promise<string[]> {
  const pairs = pairCount("BENCH_POOL_PAIRS");
  if (pairs === 0) return [];
  const pooled = await startServer(undefined, "ours", { BENCH_POOLED_BLOCKS: "32" });
  const fresh = await startServer(undefined, "ours", { BENCH_POOLED_BLOCKS: "0" });
  let runs: Pair[];
  try {
    runs = await paired(pairs, (a, secrets) => oursJob(a ? pooled : fresh, LINES, { secrets, prune: true }));
  } finally {
    await pooled.stop();
    await fresh.stop();
  }
  return [
    "### The memory store's block pool, paired (masking on, times on)",
    "",
    `Method: two servers side by side on the memory store, each after 4 warm-up jobs; ${pairs} pairs of the masked ` +
      "job above, alternating between the servers and which goes first. Both prune after every job, keeping the newest " +
      "ended one (a server's retention), the prune timed with the job. One keeps the let-go jobs' full-size blocks in " +
      "its pool (`pooledBlocks: 32`, the default) for its next jobs; the peer's store has no pool (`pooledBlocks: 0`), " +
      "so every block is new memory. Medians over the pairs; the counts are a sign test's (a tie counts against the pool).",
    "",
    ...pairTable(runs, ["blocks from the pool", "peer: no pool, every block new"], "server"),
  ];
}

/**
 * The agent's runs of lines, paired: one server (pruning, the pool on), masked jobs alternating between the agent as
 * it is (a pipe read's plain lines framed into the spool in one pass, `RunnerClient.logLines`) and the same
 * agent without `logLines` (a call a line through the masking step and `logUtf8`, as before 2026-11-30), which goes
 * first alternating too; then as many pairs with a local echo, bytes a pipe read against a write a line.
 * BENCH_AGENT_PAIRS=0 skips it.
 */
async function agentPairs(): Promise<string[]> {
  const pairs = pairCount("BENCH_AGENT_PAIRS");
  if (pairs === 0) return [];
  const server = await startServer(undefined, "ours");
  let runs: Pair[];
  let echoed: Pair[];
  try {
    runs = await paired(pairs, (a, secrets) => oursJob(server, LINES, { secrets, prune: true, perLine: !a }));
    echoed = await paired(pairs, (a, secrets) =>
      oursJob(server, LINES, { secrets, prune: true, echo: a ? "bytes" : "lines" }),
    );
  } finally {
    await server.stop();
  }
  return [
    "### The agent's runs of lines, paired (masking on, times on)",
    "",
    `Method: one server on the memory store (pruning after every job, the pool on), after 8 warm-up jobs; ${pairs} ` +
      "pairs of the masked job above, alternating between two agents in this process, and which goes first. One is the " +
      "agent as it is: a pipe read's complete lines, up to the line holding the first command or secret form, go to " +
      "the client in one call that frames them into the spool in one pass (`logLines`), the rest one by one. The peer hands the client one line " +
      "a call through the masking step (`logUtf8`), as the agent did before. Medians over the pairs; the counts are a " +
      "sign test's (a tie counts against the runs).",
    "",
    ...pairTable(runs, ["runs of lines (`logLines`)", "peer: a call a line"], "agent"),
    "",
    "With a local echo, as the agent's CLI prints the job's output on its console unless `--quiet` (here into " +
      `/dev/null, synchronous writes as node's to a file; ${pairs} more pairs after 8 more warm-up jobs): bytes a pipe ` +
      "read (`onOutput`, the CLI since 2026-11-30) against a write a line (`onLine`, the CLI before).",
    "",
    ...pairTable(echoed, ["echo: bytes a pipe read (`onOutput`)", "peer: echo a write a line (`onLine`)"], "agent"),
  ];
}

/**
 * Runs of lines on the wire, paired: one server (pruning, the pool on), masked jobs alternating between the client as
 * it is (each pipe read's lines in `LogRun` items once the server said it takes them) and the same client with
 * `runs: false` (a frame a line, the wire before), which goes first alternating too. BENCH_WIRE_PAIRS=0 skips it.
 */
async function wirePairs(): Promise<string[]> {
  const pairs = pairCount("BENCH_WIRE_PAIRS");
  if (pairs === 0) return [];
  const server = await startServer(undefined, "ours");
  let runs: Pair[];
  try {
    runs = await paired(pairs, (a, secrets) => oursJob(server, LINES, { secrets, prune: true, runs: a }));
  } finally {
    await server.stop();
  }
  const agent = (k: "a" | "b") => median(runs.map((r) => r[k].cpuHere));
  const lower = runs.filter((r) => r.a.cpuHere < r.b.cpuHere).length;
  return [
    "### Runs of lines on the wire, paired (masking on, times on)",
    "",
    `Method: one server on the memory store (pruning after every job, the pool on), after 8 warm-up jobs; ${pairs} ` +
      "pairs of the masked job above, alternating between the client as it is (a job's first call a frame a line, " +
      'then each pipe read\'s plain lines as `LogRun` items: runner-protocol.md §2, "Runs of lines") and the same ' +
      "client with `runs: false` (a frame a line, the wire before runs), and which goes first. Medians over the " +
      "pairs; the counts are a sign test's (a tie counts against runs).",
    "",
    ...pairTable(runs, ["runs of lines on the wire", "peer: a frame a line (`runs: false`)"], "server"),
    `The agent's CPU a line: ${(agent("a") / agent("b")).toFixed(2)}× (lower in ${lower} of ${runs.length} pairs).`,
    "",
    "Bytes of gRPC messages a line (the spool's frames, as they go on the wire; request ID of 36 characters, a time " +
      "on every line; a 64 KiB pipe read's lines):",
    "",
    "| line (bytes, without its newline) | a frame a line | runs | runs ÷ frames |",
    "|---:|---:|---:|---:|",
    ...[0, 10, 99, 1000].map((n) => {
      const [frames, inRuns] = [false, true].map((r) => wireBytesALine(n, r));
      return `| ${n} | ${frames!.toFixed(1)} | ${inRuns!.toFixed(1)} | ${(inRuns! / frames!).toFixed(2)} |`;
    }),
  ];
}

/** Bytes the client's spool frames a line of `lineBytes` bytes into, a frame a line or in runs. O(64 KiB). */
function wireBytesALine(lineBytes: number, runs: boolean): number {
  const read = Buffer.from(`${"x".repeat(lineBytes)}\n`.repeat(Math.max(1, Math.floor(65_536 / (lineBytes + 1)))));
  const spool = createSpool();
  const frames = createLogItemEncoder(randomUUID()).lineFramer(false, Date.now());
  // The client's default line limit caps a run's frame (64 KiB), as the spool's chunk does.
  if (runs) spool.appendRuns(read, 0, read.length, 65_536, frames, 65_536);
  else spool.appendLines(read, 0, read.length, 65_536, frames);
  const bytes = spool.slice(0, Number.MAX_SAFE_INTEGER).buffers.reduce((n, b) => n + b.length, 0);
  return bytes / spool.end;
}

/** The pair count an environment variable sets (default 12; 0 skips the table). */
function pairCount(name: string): number {
  const pairs = Number(process.env[name] ?? 12);
  if (!Number.isInteger(pairs) || pairs < 0) throw new RangeError(`${name} must be an integer ≥ 0`);
  return pairs;
}

/** One pair's figures: `a` the variant measured, `b` its peer. */
interface Pair {
  a: Figures;
  b: Figures;
}

/**
 * `pairs` pairs of masked jobs, `job(true, …)` for the variant and `job(false, …)` for its peer, after 4 warm-up jobs
 * of each (alternately unmasked and masked); which goes first alternates. Wall-clock rates on this kind of machine
 * scatter ±40 % from job to job, so a paired count says more than two medians taken minutes apart.
 */
async function paired(pairs: number, job: (a: boolean, secrets: string[]) => Promise<Figures>): Promise<Pair[]> {
  for (let i = 0; i < 4; i++) {
    await job(true, i % 2 === 1 ? SECRETS : []);
    await job(false, i % 2 === 1 ? SECRETS : []);
  }
  const runs: Pair[] = [];
  for (let i = 0; i < pairs; i++) {
    const pair: Partial<Pair> = {};
    for (const a of i % 2 === 0 ? [true, false] : [false, true]) pair[a ? "a" : "b"] = await job(a, SECRETS);
    runs.push(pair as Pair);
  }
  return runs;
}

/** A paired table's rows and its ratios: the CPU a line of `side` (the process that differs) and the rate. */
function pairTable(runs: Pair[], names: [string, string], side: "agent" | "server"): string[] {
  const fig = (k: "a" | "b", f: (x: Figures) => number) => median(runs.map((r) => f(r[k])));
  const cpu = (f: Figures) => (side === "agent" ? f.cpuHere : f.cpuServer);
  // A sign test's counts: ties count against the variant.
  const lower = runs.filter((r) => cpu(r.a) < cpu(r.b)).length;
  const faster = runs.filter((r) => r.a.rate > r.b.rate).length;
  const row = (name: string, k: "a" | "b") =>
    `| ${name} | ${fmt(fig(k, (f) => f.rate))} | ${fig(k, (f) => f.cpuHere).toFixed(2)} | ` +
    `${fig(k, (f) => f.cpuServer).toFixed(2)} |`;
  const ratio = (f: (x: Figures) => number) => (fig("a", f) / fig("b", f)).toFixed(2);
  return [
    "| variant | lines/s (median) | agent CPU µs/line | server CPU µs/line |",
    "|---|---:|---:|---:|",
    row(names[0], "a"),
    row(names[1], "b"),
    "",
    `Ratio of the first to the peer: ${side} CPU a line ${ratio(cpu)}× (lower in ${lower} of ${runs.length} pairs), ` +
      `rate ${ratio((f) => f.rate)}× (higher in ${faster} of ${runs.length}).`,
  ];
}

/** Runs the per-line time benchmark and returns its Markdown section. */
export async function run(): Promise<string> {
  const loadAtStart = os.loadavg()[0]!;
  const profileDir = process.env.BENCH_CPU_PROF;
  // BENCH_LINE_TIME_ONLY=e2e: the end-to-end rows and the pairs, not the bytes stored a line; =pairs: the pool's pairs
  // alone; =agent: the agent's pairs alone; =wire: the wire's pairs alone.
  const only = process.env.BENCH_LINE_TIME_ONLY;
  const e2e = only === "pairs" || only === "agent" || only === "wire" ? [] : await endToEnd(profileDir);
  const pool = only === "agent" || only === "wire" ? [] : await pooledPairs();
  const agent = only === "pairs" || only === "wire" ? [] : await agentPairs();
  const wire = only === "pairs" || only === "agent" ? [] : await wirePairs();
  const sizes = only !== undefined ? [] : await bytesPerLine();
  if (profileDir) console.error(`profiles in ${profileDir}: ${(await readdir(profileDir)).join(", ")}`);
  return [
    "## Runner: per-line time",
    "",
    ...sizes,
    "",
    ...e2e,
    "",
    ...pool,
    "",
    ...agent,
    "",
    ...wire,
    "",
    `Load average (1 min) at the start and end of this run: ${loadAtStart.toFixed(1)} / ${os.loadavg()[0]!.toFixed(1)} on ${os.cpus().length} cores` +
      (Math.max(loadAtStart, os.loadavg()[0]!) > os.cpus().length
        ? " — measured under load (other work on the machine)."
        : "."),
  ].join("\n");
}

// Run directly (`node --import tsx bench/runner-line-time.ts`, e.g. under --cpu-prof): print the section.
if (process.argv[1] && fileURLToPath(import.meta.url) === path.resolve(process.argv[1])) {
  console.log(await run());
}
