/**
 * Runner telemetry overhead (issue 11): the runner stream into one server process with an
 * OpenTelemetry SDK registered (bench/runner-telemetry-server.ts: meter provider scraped
 * once a second, every span batched to an exporter that drops it) and without one (the
 * API's no-ops, the library's default), same client, rounds alternating which goes first.
 * Rows: lines/s of jobs streamed by createRunnerClient (100-byte lines, sequential jobs)
 * and the server's CPU time per line (user + system), which a loaded machine disturbs
 * less than wall-clock rates; the peer of each "with SDK" figure is the "no provider" one
 * of the same run.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { randomUUID } from "node:crypto";
import path from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { createRunnerClient } from "../src/runner/client.js";
import { mintJobToken } from "../src/runner/token.js";
import { stop } from "./children.js";

/** RUNNER_TELEMETRY_LINES, RUNNER_TELEMETRY_JOBS and RUNNER_TELEMETRY_ROUNDS shrink a trial run; the report states what ran. */
const LINES = Number(process.env.RUNNER_TELEMETRY_LINES) || 200_000;
const JOBS = Number(process.env.RUNNER_TELEMETRY_JOBS) || 5;
const ROUNDS = Number(process.env.RUNNER_TELEMETRY_ROUNDS) || 5;
const SECRET = "bench-runner-telemetry-secret-0123456789";
const LINE = "x".repeat(99);

const serverScript = path.join(path.dirname(fileURLToPath(import.meta.url)), "runner-telemetry-server.ts");
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const fmt = (n: number, digits = 0) => n.toFixed(digits);

interface Server {
  port: number;
  child: ChildProcess;
  /** The server's CPU time so far (user + system), µs. */
  cpu(): Promise<number>;
}

async function startServer(telemetry: boolean): Promise<Server> {
  const child = spawn(process.execPath, ["--import", "tsx", serverScript, SECRET, ...(telemetry ? ["--telemetry"] : [])], { stdio: ["pipe", "pipe", "inherit"] });
  const lines = createInterface({ input: child.stdout! })[Symbol.asyncIterator]();
  const next = async () => {
    const line = await lines.next();
    if (line.done) throw new Error("runner server exited");
    return line.value;
  };
  const port = (JSON.parse(await next()) as { port: number }).port;
  return {
    port,
    child,
    async cpu() {
      child.stdin!.write("cpu\n");
      const usage = JSON.parse(await next()) as { user: number; system: number };
      return usage.user + usage.system;
    },
  };
}

/** One job of `lines` lines and its end through createRunnerClient; lines/s until the end is acknowledged. */
async function job(port: number, lines: number): Promise<number> {
  const requestId = randomUUID();
  const client = createRunnerClient({ endpoint: `http://127.0.0.1:${port}`, requestId, token: mintJobToken(SECRET, requestId) });
  const start = performance.now();
  for (let i = 0; i < lines; i++) {
    if (!client.log(LINE, i % 10 === 9)) await client.drained();
    // A real agent receives lines in pipe-sized bursts; yield like one would.
    if (i % 4096 === 4095) await new Promise<void>((r) => setImmediate(r));
  }
  await client.end({ exitCode: 0, success: true });
  const seconds = (performance.now() - start) / 1000;
  await client.close();
  return lines / seconds;
}

export async function run(): Promise<string> {
  const fresh = () => ({ rate: [] as number[], cpu: [] as number[] });
  const results = { off: fresh(), on: fresh() };
  const perJob = Math.ceil(LINES / JOBS);
  for (let round = 0; round < ROUNDS; round++) {
    const order: Array<"off" | "on"> = round % 2 === 0 ? ["off", "on"] : ["on", "off"];
    for (const mode of order) {
      const server = await startServer(mode === "on");
      try {
        await job(server.port, 20_000); // warm-up: JIT, sockets
        const cpu = await server.cpu();
        const rates: number[] = [];
        for (let j = 0; j < JOBS; j++) rates.push(await job(server.port, perJob));
        results[mode].cpu.push((await server.cpu()) - cpu);
        results[mode].rate.push(median(rates));
      } finally {
        await stop(server.child);
      }
    }
  }
  const [rateOff, rateOn] = [median(results.off.rate), median(results.on.rate)];
  const total = perJob * JOBS;
  const [cpuOff, cpuOn] = [median(results.off.cpu) / total, median(results.on.cpu) / total];
  return [
    "## Runner telemetry overhead",
    "",
    `Method: one runner server process (\`createRunnerService\` with the token check, memory log store storing every line, memory queue; \`startRunnerServer\`, gRPC fast path) without any OpenTelemetry provider (the API's no-ops: the library's default) and with the SDK registered before the service is created, as \`serve\` does: \`@opentelemetry/sdk-metrics\` MeterProvider with a pull reader collected once a second, and \`@opentelemetry/sdk-trace\` TracerProvider batching every StreamLogs and publish span to an exporter that drops it. Client: \`createRunnerClient\` in the bench process, ${JOBS} sequential jobs of ${fmt(perJob)} 100-byte lines per round (median job), after a 20,000-line warm-up job. ${ROUNDS} rounds alternating which mode goes first (5 by default; 3 before), medians across rounds. Peer of each "with SDK" figure: the "no provider" figure of the same run. The machine is shared (2 cores, other agents' work running).`,
    "",
    "| runner stream | no provider (peer) | with SDK | ratio (SDK ÷ none) | cost |",
    "|---|---:|---:|---:|---:|",
    `| lines/s, ${fmt(perJob)}-line jobs | ${fmt(rateOff)} | ${fmt(rateOn)} | ${fmt(rateOn / rateOff, 3)} | ${fmt(((rateOff - rateOn) / rateOff) * 100, 1)} % |`,
    `| server CPU per line | ${fmt(cpuOff * 1000, 1)} ns | ${fmt(cpuOn * 1000, 1)} ns | ${fmt(cpuOn / cpuOff, 3)} | ${fmt(((cpuOn - cpuOff) / cpuOff) * 100, 1)} % |`,
  ].join("\n");
}
