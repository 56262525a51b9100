/**
 * Runner benchmark: lines per second through one StreamLogs stream (100-byte lines),
 * our client + our service against a plain @grpc/grpc-js client + server doing the
 * same work, and server memory per open idle stream. Servers run in child processes
 * (bench/runner-worker.ts) so client and server each have a core.
 */
import { fork, spawn, type ChildProcess } from "node:child_process";
import { randomUUID } from "node:crypto";
import { once } from "node:events";
import http2 from "node:http2";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { create } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { LogItemSchema, Runner } from "../src/gen/runner/v1/runner_pb.js";
import { createRunnerClient } from "../src/runner/client/runner-client.js";
import { createLogItemEncoder } from "../src/runner/protocol/encoder.js";
import { mintJobToken } from "../src/runner/protocol/token.js";
import { runJob } from "../src/runner/agent/run-job.js";
import { createLineSplitter } from "../src/runner/agent/line-splitter.js";
import { POSTGRES_URL } from "../test/fixtures/backends.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const SECRET = "bench-secret";
const LINE = "x".repeat(99); // + the newline a process would have written = 100 bytes
const LINES = Number(process.env.BENCH_RUNNER_LINES ?? 300_000);
const ROUNDS = Number(process.env.BENCH_RUNNER_ROUNDS ?? 3);
const IDLE_STREAMS = 1000;

interface Mem {
  active: number;
  rss: number;
  heapUsed: number;
  external: number;
  arrayBuffers: number;
}

interface Worker {
  child: ChildProcess;
  port: number;
  mem(): Promise<Mem>;
  stop(): Promise<void>;
}

type LogStoreKind = "memory" | "fs" | "pg";

async function startWorker(
  mode: "ours" | "ours-connect" | "grpc-js" | "connect-min",
  logStore: LogStoreKind = "memory",
): Promise<Worker> {
  const child = fork(path.join(here, "runner-worker.ts"), [mode], {
    execArgv: ["--import", "tsx", "--expose-gc"],
    env: { ...process.env, BENCH_SECRET: SECRET, BENCH_LOG_STORE: logStore, BENCH_POSTGRES_URL: POSTGRES_URL },
    stdio: ["ignore", "inherit", "inherit", "ipc"],
  });
  const [first] = (await once(child, "message")) as [{ port: number }];
  return {
    child,
    port: first.port,
    async mem() {
      child.send("mem");
      const [m] = (await once(child, "message")) as [Mem];
      return m;
    },
    async stop() {
      const exited = once(child, "exit");
      child.send("exit");
      const timer = setTimeout(() => child.kill("SIGKILL"), 5000);
      await exited;
      clearTimeout(timer);
    },
  };
}

async function oursRound(port: number, lines = LINES): Promise<number> {
  const requestId = randomUUID();
  const client = createRunnerClient({
    endpoint: `http://127.0.0.1:${port}`,
    requestId,
    token: mintJobToken(SECRET, requestId),
  });
  const t0 = performance.now();
  for (let i = 0; i < lines; i++) {
    if (!client.log(LINE, i % 10 === 9)) await client.drained();
    // A real agent receives lines in pipe-sized bursts; yield like one would.
    if (i % 4096 === 4095) await new Promise<void>((r) => setImmediate(r));
  }
  await client.end({ exitCode: 0, success: true, repoUrl: "https://example.com/r.git", commitSha: "abc" });
  const seconds = (performance.now() - t0) / 1000;
  await client.close();
  return lines / seconds;
}

async function connectRound(port: number): Promise<number> {
  // A stock connect-node gRPC client against our server: what a client without batching gets.
  const requestId = randomUUID();
  const transport = createGrpcTransport({ baseUrl: `http://127.0.0.1:${port}` });
  const client = createClient(Runner, transport);
  const n = Math.min(LINES, 100_000);
  const t0 = performance.now();
  async function* items() {
    for (let i = 0; i < n; i++) {
      yield create(LogItemSchema, { requestId, event: { case: "log", value: { line: LINE, stderr: i % 10 === 9 } } });
    }
    yield create(LogItemSchema, { requestId, event: { case: "end", value: { exitCode: 0, success: true } } });
  }
  const ack = await client.streamLogs(items(), {
    headers: { authorization: `Bearer ${mintJobToken(SECRET, requestId)}` },
  });
  if (!ack.ok) throw new Error("connect client: ack not ok");
  return n / ((performance.now() - t0) / 1000);
}

function grpcJsClient(port: number) {
  const def = protoLoader.loadSync(path.join(here, "..", "proto", "runner", "v1", "runner.proto"), {
    defaults: true,
    oneofs: true,
  });
  const pkg = grpc.loadPackageDefinition(def) as unknown as {
    runner: { v1: { Runner: grpc.ServiceClientConstructor } };
  };
  return new pkg.runner.v1.Runner(`127.0.0.1:${port}`, grpc.credentials.createInsecure()) as unknown as grpc.Client & {
    StreamLogs(cb: (e: grpc.ServiceError | null, ack?: { ok: boolean }) => void): grpc.ClientWritableStream<unknown>;
  };
}

/**
 * A grpc-js StreamLogs call for a new job, its start time (taken before the call opens, as
 * the rows count it) and its Ack's `ok` as a promise. Shared by the grpc-js rows.
 */
function openGrpcJsCall(port: number) {
  const client = grpcJsClient(port);
  const requestId = randomUUID();
  const t0 = performance.now();
  let done!: (v: boolean) => void;
  let failed!: (e: unknown) => void;
  const acked = new Promise<boolean>((resolve, reject) => ((done = resolve), (failed = reject)));
  const call = client.StreamLogs((e, ack) => (e ? failed(e) : done(ack?.ok ?? false)));
  return { client, requestId, t0, call, acked };
}

async function grpcRound(port: number, lines = LINES): Promise<number> {
  const { client, requestId, t0, call, acked } = openGrpcJsCall(port);
  for (let i = 0; i < lines; i++) {
    if (!call.write({ requestId, log: { line: LINE, stderr: i % 10 === 9 } })) await once(call, "drain");
  }
  call.write({
    requestId,
    end: { exitCode: 0, success: true, repoUrl: "https://example.com/r.git", commitSha: "abc" },
  });
  call.end();
  if (!(await acked)) throw new Error("grpc-js: ack not ok");
  const rate = lines / ((performance.now() - t0) / 1000);
  client.close();
  return rate;
}

/** The job of the end-to-end rows: `lines` lines of 100 bytes (99 + newline) on stdout, as fast as a pipe takes them. */
function printer(lines: number): { command: string; args: string[] } {
  // yes | head: a job whose own cost is near zero, so the rows measure the path, not the job.
  return { command: "sh", args: ["-c", `yes ${LINE} | head -n ${lines}`] };
}

/** End to end, ours: a child printing lines → runJob → createRunnerClient → the server; lines/s until the end is acknowledged. */
async function oursJobRound(port: number, lines = LINES): Promise<number> {
  const requestId = randomUUID();
  const client = createRunnerClient({
    endpoint: `http://127.0.0.1:${port}`,
    requestId,
    token: mintJobToken(SECRET, requestId),
  });
  const t0 = performance.now();
  const code = await runJob(client, { ...printer(lines), repoUrl: "https://example.com/r.git", commitSha: "abc" });
  const seconds = (performance.now() - t0) / 1000;
  await client.close();
  if (code !== 0) throw new Error(`job exited ${code}`);
  return lines / seconds;
}

/** End to end, peer: the same child, lines split the same way, one grpc-js message per line → the grpc-js server (stores nothing). */
async function grpcJobRound(port: number, lines = LINES): Promise<number> {
  const { client, requestId, t0, call, acked } = openGrpcJsCall(port);
  const { command, args } = printer(lines);
  const child = spawn(command, args, { stdio: ["ignore", "pipe", "inherit"] });
  let sent = 0;
  const split = createLineSplitter((line) => {
    sent++;
    // Back-pressure as a plain client would: stop reading the pipe until the call drains.
    if (!call.write({ requestId, log: { line, stderr: false } })) {
      child.stdout.pause();
      call.once("drain", () => child.stdout.resume());
    }
  });
  child.stdout.on("data", (b: Buffer) => split.push(b));
  const [code] = (await once(child, "close")) as [number];
  split.end();
  call.write({
    requestId,
    end: { exitCode: code, success: code === 0, repoUrl: "https://example.com/r.git", commitSha: "abc" },
  });
  call.end();
  if (!(await acked)) throw new Error("grpc-js: ack not ok");
  const rate = sent / ((performance.now() - t0) / 1000);
  client.close();
  if (sent !== lines) throw new Error(`grpc-js job: ${sent} of ${lines} lines`);
  return rate;
}

/** Opens `count` connections, each with one call that sent one item and stays open. */
async function openIdleStreams(port: number, count: number, ours: boolean) {
  const sessions: http2.ClientHttp2Session[] = [];
  for (let i = 0; i < count; i++) {
    const requestId = randomUUID();
    const enc = createLogItemEncoder(requestId);
    const line = "started";
    const frame = Buffer.alloc(enc.logFrameSize(line, line.length, false));
    enc.writeLogFrame(frame, 0, line, line.length, false);
    const s = http2.connect(`http://127.0.0.1:${port}`);
    s.on("error", () => undefined);
    const req = s.request({
      ":method": "POST",
      ":path": "/runner.v1.Runner/StreamLogs",
      "content-type": "application/grpc",
      te: "trailers",
      ...(ours ? { authorization: `Bearer ${mintJobToken(SECRET, requestId)}` } : {}),
    });
    req.on("error", () => undefined);
    req.write(frame);
    sessions.push(s);
    if (i % 100 === 99) await new Promise((r) => setTimeout(r, 10));
  }
  return sessions;
}

async function memoryPerStream(mode: "ours" | "grpc-js") {
  const w = await startWorker(mode);
  try {
    // Warm the server up with one short stream so code paths are compiled before the baseline.
    const warm = await openIdleStreams(w.port, 5, mode === "ours");
    await new Promise((r) => setTimeout(r, 300));
    for (const s of warm) s.destroy();
    await new Promise((r) => setTimeout(r, 300));
    const before = await w.mem();
    const sessions = await openIdleStreams(w.port, IDLE_STREAMS, mode === "ours");
    let after = await w.mem();
    for (let i = 0; i < 100 && after.active - before.active < IDLE_STREAMS; i++) {
      await new Promise((r) => setTimeout(r, 100));
      after = await w.mem();
    }
    const opened = after.active - before.active;
    for (const s of sessions) s.destroy();
    return {
      opened,
      rss: (after.rss - before.rss) / IDLE_STREAMS,
      heap: (after.heapUsed - before.heapUsed) / IDLE_STREAMS,
      external: (after.external - before.external) / IDLE_STREAMS,
    };
  } finally {
    await w.stop();
  }
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const fmt = (n: number) => Math.round(n).toLocaleString("en-US");
const kib = (n: number) => `${(n / 1024).toFixed(1)} KiB`;

const STORES = (process.env.BENCH_RUNNER_STORES ?? "memory,fs,pg").split(",") as LogStoreKind[];
const E2E_LINES = Number(process.env.BENCH_RUNNER_E2E_LINES ?? LINES);
/**
 * Warm-up jobs before the measured one, for ours and the peer alike. A server in service has
 * served many jobs; after a single warm-up job the measured one still paid V8's optimising
 * compiler (about a quarter of our server's CPU samples in it, its hottest functions
 * optimised again after deoptimising at the new job's first items: runner-throughput.md,
 * session 9), a once-per-process cost the bench then charged to every round.
 */
const E2E_WARMUP_JOBS = Number(process.env.BENCH_RUNNER_E2E_WARMUP ?? 3);

/** The end-to-end rows: each log store and the grpc-js pair, a fresh server per round, medians of ROUNDS. */
async function endToEnd(): Promise<string[]> {
  const ours: Record<LogStoreKind, number[]> = { memory: [], fs: [], pg: [] };
  const peer: number[] = [];
  const peerDirect: number[] = [];
  for (let r = 0; r < ROUNDS; r++) {
    for (const store of STORES) {
      const w = await startWorker("ours", store);
      try {
        for (let i = 0; i < E2E_WARMUP_JOBS; i++) await oursJobRound(w.port, Math.min(E2E_LINES, 50_000)); // warm-up, not counted
        ours[store].push(await oursJobRound(w.port, E2E_LINES));
      } finally {
        await w.stop();
      }
    }
    const g = await startWorker("grpc-js");
    try {
      for (let i = 0; i < E2E_WARMUP_JOBS; i++) await grpcJobRound(g.port, Math.min(E2E_LINES, 50_000));
      peer.push(await grpcJobRound(g.port, E2E_LINES));
      peerDirect.push(await grpcRound(g.port, E2E_LINES));
    } finally {
      await g.stop();
    }
  }
  const p = median(peer);
  const pd = median(peerDirect);
  const name = { memory: "memory", fs: "fs (fsync on)", pg: "PostgreSQL" };
  return [
    "",
    "### End to end: a job's output → runJob → startRunnerServer → one result",
    "",
    `Method: a child (\`yes | head -n ${fmt(E2E_LINES)}\`, 100-byte lines) run by \`runJob\` with \`createRunnerClient\` in the bench process, ` +
      `the server (startRunnerServer, memory queue) in a child process on the log store named, a fresh server per round after ${E2E_WARMUP_JOBS} warm-up jobs of 50,000 lines (the peer too); ` +
      "timed from spawn to the acknowledged end. fs: `createFsLogStore` with fsync on, in a temp directory; PostgreSQL: `createPostgresLogStore` on the local server, a throw-away schema. " +
      "Peer, same run: the same child, its stdout split by the same line splitter, one `@grpc/grpc-js` message per line → a `@grpc/grpc-js` server that counts and acks (stores nothing). " +
      `The second peer column is the grpc-js pair without a child (lines from a loop), as in the table above. Medians of ${ROUNDS}.`,
    "",
    "| log store | lines/s (median) | all rounds | grpc-js pair, child → client | ratio | grpc-js pair, loop | ratio |",
    "|---|---:|---:|---:|---:|---:|---:|",
    ...STORES.map((store) => {
      const o = median(ours[store]);
      return `| ${name[store]} | ${fmt(o)} | ${ours[store].map(fmt).join(" / ")} | ${fmt(p)} | ${(o / p).toFixed(1)}× | ${fmt(pd)} | ${(o / pd).toFixed(1)}× |`;
    }),
    `| (peer rounds) | | | ${peer.map(fmt).join(" / ")} | | ${peerDirect.map(fmt).join(" / ")} | |`,
  ];
}

/** Runs the runner benchmark and returns its Markdown section. */
export async function run(): Promise<string> {
  // The machine is shared: the load average says how far these figures are from an idle one.
  const loadAtStart = os.loadavg()[0]!;
  const loadLine = () =>
    `Load average (1 min) at the start and end of this run: ${loadAtStart.toFixed(1)} / ${os.loadavg()[0]!.toFixed(1)} on ${os.cpus().length} cores` +
    (Math.max(loadAtStart, os.loadavg()[0]!) > os.cpus().length
      ? " — measured under load (other work on the machine)."
      : ".");
  if (process.env.BENCH_RUNNER_ONLY === "e2e")
    return ["## Runner: end to end only", ...(await endToEnd()), "", loadLine()].join("\n");
  const ours: number[] = [];
  const peer: number[] = [];
  const connect: number[] = [];
  let floor = 0;
  let floorPeer = 0;
  let viaConnect = 0;
  // A fresh server per round: the memory log store keeps every line, and a heap grown by
  // earlier rounds would charge their garbage collection to later ones.
  for (let r = 0; r < ROUNDS; r++) {
    const oursServer = await startWorker("ours");
    try {
      await oursRound(oursServer.port, Math.min(LINES, 50_000)); // warm-up, not counted
      ours.push(await oursRound(oursServer.port));
      if (r === 0) connect.push(await connectRound(oursServer.port));
    } finally {
      await oursServer.stop();
    }
    const grpcServer = await startWorker("grpc-js");
    try {
      await grpcRound(grpcServer.port, Math.min(LINES, 50_000));
      peer.push(await grpcRound(grpcServer.port));
    } finally {
      await grpcServer.stop();
    }
  }
  const connectServer = await startWorker("ours-connect");
  try {
    await oursRound(connectServer.port, Math.min(LINES, 50_000));
    viaConnect = await oursRound(connectServer.port);
  } finally {
    await connectServer.stop();
  }
  const minServer = await startWorker("connect-min");
  try {
    await oursRound(minServer.port, Math.min(LINES, 50_000));
    floor = await oursRound(minServer.port);
    await grpcRound(minServer.port, Math.min(LINES, 50_000));
    floorPeer = await grpcRound(minServer.port);
  } finally {
    await minServer.stop();
  }
  const memOurs = await memoryPerStream("ours");
  const memPeer = await memoryPerStream("grpc-js");
  const o = median(ours);
  const p = median(peer);
  return [
    "## Runner: log lines through one StreamLogs stream",
    "",
    `Method: ${fmt(LINES)} lines of 100 bytes (every 10th on stderr) plus the job end through one job, ` +
      `timed from the first line to the acknowledged end; median of ${ROUNDS} rounds, each on a fresh server ` +
      "after a 50,000-line warm-up job. Each server runs in its own child process (h2c on 127.0.0.1), the client in the bench process. " +
      "Ours: createRunnerClient → startRunnerServer (token check, memory log store storing every line, memory queue; " +
      "plain gRPC StreamLogs calls take the server's fast path: frames split and decoded on the HTTP/2 stream, items handed to the service in batches). " +
      "Peer: @grpc/grpc-js client → @grpc/grpc-js server loading the same proto, counting lines, acking. " +
      `Memory: ${IDLE_STREAMS} connections each holding one open call that sent one item, server-side ` +
      "RSS/heap/external delta after GC ÷ streams.",
    "",
    "| measure | ours | peer (grpc-js pair) | ratio ours ÷ peer |",
    "|---|---:|---:|---:|",
    `| lines/s, one stream (median) | ${fmt(o)} | ${fmt(p)} | ${(o / p).toFixed(1)}× |`,
    `| lines/s, all rounds | ${ours.map(fmt).join(" / ")} | ${peer.map(fmt).join(" / ")} | |`,
    `| lines/s, our client → our server with \`fastPath: false\` (every call through connect-node) | ${fmt(viaConnect)} | ${fmt(p)} | ${(viaConnect / p).toFixed(1)}× |`,
    `| lines/s, stock connect-node gRPC client → our server | ${fmt(connect[0]!)} | ${fmt(p)} | ${(connect[0]! / p).toFixed(1)}× |`,
    `| lines/s, same bare connect-node handler (decode, count, ack; no auth, no store): our client vs grpc-js client | ${fmt(floor)} | ${fmt(floorPeer)} | ${(floor / floorPeer).toFixed(1)}× |`,
    `| idle streams open (of ${IDLE_STREAMS}) | ${memOurs.opened} | ${memPeer.opened} | |`,
    `| server RSS per idle stream | ${kib(memOurs.rss)} | ${kib(memPeer.rss)} | ${(memOurs.rss / memPeer.rss).toFixed(2)}× |`,
    `| server heap per idle stream | ${kib(memOurs.heap)} | ${kib(memPeer.heap)} | ${(memOurs.heap / memPeer.heap).toFixed(2)}× |`,
    `| server external per idle stream | ${kib(memOurs.external)} | ${kib(memPeer.external)} | |`,
    ...(await endToEnd()),
    "",
    loadLine(),
  ].join("\n");
}
