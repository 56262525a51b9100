/**
 * Runner telemetry overhead (issue 11): the runner stream into two server processes alive
 * side by side, one with an OpenTelemetry SDK registered as serve registers it
 * (bench/runner-telemetry-server.ts, bench/telemetry-sdk.ts) and one without (the API's
 * no-ops, the library's default), same client, measured in paired slices
 * (bench/telemetry-pair.ts). Rows: lines/s of jobs streamed by createRunnerClient
 * (100-byte lines) and the server's CPU time per line (user + system), which a loaded
 * machine disturbs less than wall-clock rates.
 */
import { randomUUID } from "node:crypto";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { createRunnerClient } from "../src/runner/client/runner-client.js";
import { mintJobToken } from "../src/runner/protocol/token.js";
import { SCRAPE_SECONDS, type SdkVariant } from "./telemetry-sdk.js";
import {
  append,
  inRounds,
  median,
  pairHeader,
  pairRow,
  pairedSlices,
  startBenchServer,
  type Mode,
  type Slice,
} from "./telemetry-pair.js";

/** RUNNER_TELEMETRY_LINES, RUNNER_TELEMETRY_SLICES and RUNNER_TELEMETRY_ROUNDS shrink a trial run; the report states what ran. */
const LINES = Number(process.env.RUNNER_TELEMETRY_LINES) || 100_000;
/** Rounds, each with a fresh pair of server processes (a process's JIT and heap make it faster or slower for its whole life). */
const ROUNDS = Number(process.env.RUNNER_TELEMETRY_ROUNDS) || 6;
/** Slices per round: one job on each server at once. */
const SLICES = Number(process.env.RUNNER_TELEMETRY_SLICES) || 6;
const SECRET = "bench-runner-telemetry-secret-0123456789";
const LINE = "x".repeat(99);

const serverScript = path.join(path.dirname(fileURLToPath(import.meta.url)), "runner-telemetry-server.ts");
const fmt = (n: number, digits = 0) => n.toFixed(digits);

/** One job of `lines` lines and its end through createRunnerClient; lines/s until the end is acknowledged. */
async function job(port: number, lines: number): Promise<number> {
  const requestId = randomUUID();
  const client = createRunnerClient({
    endpoint: `http://127.0.0.1:${port}`,
    requestId,
    token: mintJobToken(SECRET, requestId),
  });
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

/** ROUNDS rounds of paired slices, the "on" server registering `variant`. */
async function compare(variant: SdkVariant): Promise<{ slices: Record<Mode, Slice[]>; scrapes: number[] }> {
  const slices: Record<Mode, Slice[]> = { off: [], on: [] };
  const scrapes: number[] = [];
  await inRounds(
    ROUNDS,
    (mode) => startBenchServer(serverScript, [SECRET], mode, variant),
    async (both) => {
      for (const server of Object.values(both)) await job(server.hello.port as number, 20_000); // warm-up: JIT, sockets
      append(
        slices,
        await pairedSlices(both, SLICES, async (server) => ({
          rate: await job(server.hello.port as number, LINES),
          units: LINES,
        })),
      );
      scrapes.push(await both.on.scrape());
    },
  );
  return { slices, scrapes };
}

export async function run(): Promise<string> {
  const started = new Date();
  const loadBefore = os.loadavg();
  const metricsOnly = await compare("metrics");
  const withTraces = await compare("traces");
  const loadAfter = os.loadavg();
  const slices = withTraces.slices;
  const scrape = median([...metricsOnly.scrapes, ...withTraces.scrapes]);
  const onRate = median(slices.on.map((s) => s.rate));
  const onPerLine = slices.on.reduce((a, s) => a + s.cpu, 0) / slices.on.reduce((a, s) => a + s.units, 0);
  const load = (l: number[]) => l.map((x) => x.toFixed(2)).join(", ");
  const rows = (c: Record<Mode, Slice[]>, what: string) => [
    pairRow(`${what}: lines/s, ${fmt(LINES)}-line jobs`, "rate", c, "", 1, 0),
    pairRow(`${what}: server CPU per line`, "cpu", c, "ns", 1000, 1),
  ];
  return [
    "## Runner telemetry overhead",
    "",
    `Method: two runner server processes alive side by side (\`createRunnerService\` with the token check, memory log store storing every line, memory queue; \`startRunnerServer\`, gRPC fast path), one without any OpenTelemetry provider (the API's no-ops: the library's default) and one with the SDK registered before the service is created by serve's own code (\`startServeTelemetry\`, src/cli/serve-telemetry.ts): the MeterProvider read by the Prometheus exporter, scraped every ${SCRAPE_SECONDS} s (Prometheus's usual interval; its default is 60 s; a scrape once a second before), and the W3C propagators, which is all serve registers by default ("meter provider" rows); with traces on ("meter + tracer" rows), as serve runs with an OTLP endpoint, also a TracerProvider with serve's BatchSpanProcessor settings handing every StreamLogs and publish span to an exporter that drops it (the OTLP encoding and the network are not measured). Client: \`createRunnerClient\` in the bench process, jobs of ${fmt(LINES)} 100-byte lines, after a 20,000-line warm-up job per server. Paired slices (bench/telemetry-pair.ts): ${ROUNDS} rounds per variant, each with a fresh pair of server processes and ${SLICES} slices, a slice being one job streamed to both servers at the same moment, so a change in the machine's load falls on both members of a pair (before: whole rounds one server after the other, whose noise was larger than the cost). Rates: the median job, cost from the median of the per-pair ratios; CPU: each server's user + system time over all jobs ÷ lines, cost from the ratio of those totals (it keeps the rare slices a major GC falls in); the last column is the median of the per-pair costs and their middle half (25th–75th percentile), the noise of a single slice. An A/A trial (both servers without a provider, 4 × 8 pairs) measured 2.2 % on the CPU row: differences of that size are noise. The machine is shared (2 cores, other agents' work running): load average ${load(loadBefore)} (1, 5, 15 min) at the start (${started.toISOString().slice(11, 16)} UTC), ${load(loadAfter)} at the end.`,
    "",
    ...pairHeader("runner stream"),
    ...rows(metricsOnly.slices, "meter provider"),
    ...rows(withTraces.slices, "meter + tracer"),
    "",
    `The SDK's work is per StreamLogs call (its span, the open-streams gauge twice, the call count; createRunnerClient opened 14 calls for one 100,000-line job in a trial), per stored batch (lines, bytes, append latency: 353 batches for that job) and per job end (a publish span and its duration, the outcome), never per line. One scrape (\`GET /metrics\`'s collection and Prometheus text, in the server, median over the rounds): ${fmt(scrape, 0)} µs of CPU; every ${SCRAPE_SECONDS} s at the line rate above that is ${fmt((scrape / (SCRAPE_SECONDS * onRate * onPerLine)) * 100, 3)} % of the server's CPU.`,
  ].join("\n");
}
