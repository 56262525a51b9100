/**
 * The cost of secret masking end to end (issue 23): the same job (a child printing 100-byte
 * lines → runJob → createRunnerClient → startRunnerServer, memory store) with 0, 10 and
 * 1,000 secrets registered on both sides (runJob's `secrets`, and `expectJob`'s, so the
 * agent and the service each scan every line). Jobs with each count take turns in every
 * round, so a change in the machine's load falls on all three alike.
 */
import { fork, type ChildProcess } from "node:child_process";
import { randomBytes, randomUUID } from "node:crypto";
import { once } from "node:events";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { createRunnerClient } from "../src/runner/client/runner-client.js";
import { mintJobToken } from "../src/runner/protocol/token.js";
import { runJob } from "../src/runner/agent/run-job.js";
import { createSecretMasker, type SecretMasker } from "../src/runner/masking/secret-masker.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const SECRET = "bench-secret";
const LINE = "x".repeat(99);
const LINES = Number(process.env.BENCH_MASKING_LINES ?? 300_000);
const ROUNDS = Number(process.env.BENCH_MASKING_ROUNDS ?? 9);
const COUNTS = [0, 10, 1_000] as const;
/** Lines a job prints that hold one of its secrets (the rest hold none): the masking's replace path too. */
const EVERY = 1_000;

const fmt = (n: number) => Math.round(n).toLocaleString("en-US");
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

async function startWorker(): Promise<{ child: ChildProcess; port: number; stop(): Promise<void> }> {
  const child = fork(path.join(here, "runner-worker.ts"), ["ours"], {
    execArgv: ["--import", "tsx"],
    env: { ...process.env, BENCH_SECRET: SECRET, BENCH_LOG_STORE: "memory" },
    stdio: ["ignore", "inherit", "inherit", "ipc"],
  });
  const [first] = (await once(child, "message")) as [{ port: number }];
  return {
    child,
    port: first.port,
    async stop() {
      const exited = once(child, "exit");
      child.send("exit");
      await exited;
    },
  };
}

/** Token-like secrets: 32 random bytes in base64url (43 characters), as an API token looks. */
function secrets(count: number): string[] {
  return Array.from({ length: count }, () => randomBytes(32).toString("base64url"));
}

/** The server process's CPU time so far (user + system), in µs. */
async function serverCpu(worker: { child: ChildProcess }): Promise<number> {
  worker.child.send("cpu");
  const [m] = (await once(worker.child, "message")) as [{ cpu: NodeJS.CpuUsage }];
  return m.cpu.user + m.cpu.system;
}

interface JobFigures {
  /** Lines a second, spawn to acknowledged end. */
  rate: number;
  /** CPU µs a line: the bench process (agent, client) plus the server process. */
  cpuPerLine: number;
}

/** One job with `values` registered on both sides. */
async function job(
  worker: { child: ChildProcess; port: number },
  values: string[],
  lines: number,
): Promise<JobFigures> {
  const requestId = randomUUID();
  worker.child.send({ expect: requestId, secrets: values });
  await once(worker.child, "message");
  const client = createRunnerClient({
    endpoint: `http://127.0.0.1:${worker.port}`,
    requestId,
    token: mintJobToken(SECRET, requestId),
  });
  // Every EVERY-th line carries a secret (when there are any), the rest are the plain 100-byte line.
  const marked = values.length > 0 ? `${LINE.slice(0, 99 - values[0]!.length - 1)} ${values[0]}` : LINE;
  const script = `yes ${LINE} | head -n ${lines} | awk 'NR % ${EVERY} == 0 { print "${marked}"; next } { print }'`;
  const server0 = await serverCpu(worker);
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  const code = await runJob(client, { command: "sh", args: ["-c", script], secrets: values });
  const seconds = (performance.now() - t0) / 1000;
  const cpu = process.cpuUsage(cpu0);
  const server = (await serverCpu(worker)) - server0;
  await client.close();
  if (code !== 0) throw new Error(`job exited ${code}`);
  return { rate: lines / seconds, cpuPerLine: (cpu.user + cpu.system + server) / lines };
}

/** A loop that only reads each byte of the line: the floor any scan of the line pays. */
function readBytes(buf: Buffer): number {
  let x = 0;
  for (let i = 0; i < buf.length; i++) x = (x << 8) | buf[i]!;
  return x;
}

/**
 * In-process: ns a line for `masker.maskBytes` on lines holding no secret, and for the byte
 * loop, taken in turns (slices of 200,000 calls, median of 15), so load falls on both alike.
 */
function perLine(maskers: Map<number, SecretMasker>, line: Buffer): Map<number | "loop", number> {
  const samples = new Map<number | "loop", number[]>([
    ["loop", []],
    ...[...maskers.keys()].map((c) => [c, []] as [number, number[]]),
  ]);
  let sink = 0;
  for (let rep = 0; rep < 16; rep++) {
    for (const [key, list] of samples) {
      const m = key === "loop" ? null : maskers.get(key)!;
      const t0 = performance.now();
      for (let i = 0; i < 200_000; i++)
        sink += m === null ? readBytes(line) : m.maskBytes(line, 0, line.length) === null ? 0 : 1;
      if (rep > 0) list.push(((performance.now() - t0) * 1e6) / 200_000);
    }
  }
  if (sink === 42) console.log(sink);
  return new Map([...samples].map(([k, v]) => [k, median(v)]));
}

/** Runs the masking benchmark and returns its Markdown section. */
export async function run(): Promise<string> {
  const loadAtStart = os.loadavg()[0]!;
  const rates = new Map<number, number[]>(COUNTS.map((c) => [c, []]));
  const cpus = new Map<number, number[]>(COUNTS.map((c) => [c, []]));
  /** Per round, each count's rate ÷ the 0-secret job's in the same round (paired: the load moves less within a round). */
  const paired = new Map<number, number[]>(COUNTS.map((c) => [c, []]));
  const values = new Map<number, string[]>(COUNTS.map((c) => [c, secrets(c)]));
  for (let r = 0; r < ROUNDS; r++) {
    const worker = await startWorker();
    try {
      for (const c of COUNTS) await job(worker, values.get(c)!, 50_000); // warm-up, not counted
      // A different order each round: no count always runs first or last.
      const order = r % 2 === 0 ? [...COUNTS] : [...COUNTS].reverse();
      const round = new Map<number, JobFigures>();
      for (const c of order) round.set(c, await job(worker, values.get(c)!, LINES));
      for (const c of COUNTS) {
        rates.get(c)!.push(round.get(c)!.rate);
        cpus.get(c)!.push(round.get(c)!.cpuPerLine);
        paired.get(c)!.push(round.get(c)!.rate / round.get(0)!.rate);
      }
    } finally {
      await worker.stop();
    }
  }
  const baseCpu = median(cpus.get(0)!);
  const maskers = new Map(COUNTS.map((c) => [c, createSecretMasker(values.get(c)!)]));
  const lines = {
    "100 × `x`": Buffer.from(LINE),
    "a compiler's line": Buffer.from(
      "src/runner/agent/run-job.ts(118,7): error TS2345: Argument of type 'string' is not assignable.",
    ),
  };
  const micro = Object.entries(lines).map(([name, line]) => [name, perLine(maskers, line)] as const);
  const loadAtEnd = os.loadavg()[0]!;
  return [
    "## Runner: secret masking end to end",
    "",
    `Method: a child (\`yes | head -n ${fmt(LINES)}\` through awk, 100-byte lines; every ${fmt(EVERY)}th line holds a secret when there are any) run by \`runJob\` with \`createRunnerClient\` in the bench process, ` +
      "the server (startRunnerServer, memory store, memory queue, token check) in a child process; the job's secrets (random 32-byte tokens, base64url) given to runJob's `secrets` and to `expectJob`, " +
      "so the agent and the service both mask every line (each value adds 4–8 forms: base64 at three alignments, base64url, percent-encoding, its JSON escaping). " +
      `Timed from spawn to the acknowledged end. Each round a fresh server, a warm-up job of 50,000 lines per count, then one job per count in alternating order; medians of ${ROUNDS}. ` +
      "Peer: the same job with 0 secrets (the masker then returns at once), in the same rounds. " +
      "Columns: the median rate; every round's; the median of the per-round ratios to the 0-secret job (paired, so a change of load between rounds cancels); " +
      "CPU time a line, the bench process (agent and client) plus the server process, median, and its ratio — on a shared machine the least noisy figure, since time spent waiting for a core is not counted. " +
      "The masker is a Wu–Manber scan over every form (docs/decisions/log-masking.md): a line costs O(its bytes) expected, not O(bytes × secrets).",
    "",
    "| secrets registered | lines/s (median) | all rounds | rate ÷ 0 secrets, paired (median) | CPU µs a line (median) | CPU ÷ 0 secrets | aim |",
    "|---:|---:|---:|---:|---:|---:|---|",
    ...COUNTS.map((c) => {
      const ratio = median(paired.get(c)!);
      const cpu = median(cpus.get(c)!);
      const aim = c === 0 ? "" : c === 10 ? "cost ≤ 10 %" : "cost ≤ 25 %";
      return (
        `| ${fmt(c)} | ${fmt(median(rates.get(c)!))} | ${rates.get(c)!.map(fmt).join(" / ")} | ${ratio.toFixed(2)}× (cost ${((1 - ratio) * 100).toFixed(1)} %) ` +
        `| ${cpu.toFixed(2)} | ${(cpu / baseCpu).toFixed(2)}× (cost ${((cpu / baseCpu - 1) * 100).toFixed(1)} %) | ${aim} |`
      );
    }),
    "",
    "In-process, the masker alone (`maskBytes` on a line of about 100 bytes holding no secret, one side's cost; the job above pays it twice, agent and service), " +
      "in turns with a loop that only reads the line's bytes (slices of 200,000 calls, median of 15): ns a line.",
    "",
    `| line | ${COUNTS.map((c) => `${fmt(c)} secrets`).join(" | ")} | byte loop (peer) | ${COUNTS.slice(1)
      .map((c) => `${fmt(c)} ÷ loop`)
      .join(" | ")} |`,
    `|---|${COUNTS.map(() => "---:").join("|")}|---:|${COUNTS.slice(1)
      .map(() => "---:")
      .join("|")}|`,
    ...micro.map(([name, m]) => {
      const loop = m.get("loop")!;
      return `| ${name} | ${COUNTS.map((c) => m.get(c)!.toFixed(0)).join(" | ")} | ${loop.toFixed(0)} | ${COUNTS.slice(
        1,
      )
        .map((c) => `${(m.get(c)! / loop).toFixed(2)}×`)
        .join(" | ")} |`;
    }),
    "",
    `Load average (1 min) at the start and end of this run: ${loadAtStart.toFixed(1)} / ${loadAtEnd.toFixed(1)} on ${os.cpus().length} cores` +
      (Math.max(loadAtStart, loadAtEnd) > os.cpus().length
        ? " — measured under load (other work on the machine); the rates are noisy, the ratios less so."
        : "."),
  ].join("\n");
}
