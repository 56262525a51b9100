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
import path from "node:path";
import { fileURLToPath } from "node:url";
import { createRunnerClient } from "../src/runner/client.js";
import { mintJobToken } from "../src/runner/token.js";
import { SCRAPE_SECONDS } from "./telemetry-sdk.js";
import { median, pairHeader, pairRow, pairedSlices, startBenchServer, stop, type BenchServer, type Mode } from "./telemetry-pair.js";

/** RUNNER_TELEMETRY_LINES and RUNNER_TELEMETRY_SLICES shrink a trial run; the report states what ran. */
const LINES = Number(process.env.RUNNER_TELEMETRY_LINES) || 100_000;
/** Slices: one job on each server at once. */
const SLICES = Number(process.env.RUNNER_TELEMETRY_SLICES) || 30;
const SECRET = "bench-runner-telemetry-secret-0123456789";
const LINE = "x".repeat(99);

const serverScript = path.join(path.dirname(fileURLToPath(import.meta.url)), "runner-telemetry-server.ts");
const fmt = (n: number, digits = 0) => n.toFixed(digits);

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
  const servers: Partial<Record<Mode, BenchServer>> = {};
  let slices, scrapes: number[];
  try {
    servers.off = await startBenchServer(serverScript, [SECRET], "off");
    servers.on = await startBenchServer(serverScript, [SECRET], "on");
    const both = servers as Record<Mode, BenchServer>;
    for (const server of Object.values(both)) await job(server.hello.port as number, 20_000); // warm-up: JIT, sockets
    slices = await pairedSlices(both, SLICES, async (server) => ({ rate: await job(server.hello.port as number, LINES), units: LINES }));
    scrapes = [];
    for (let i = 0; i < 5; i++) scrapes.push(await both.on.scrape());
  } finally {
    await Promise.all(Object.values(servers).map((server) => stop(server.child)));
  }
  const scrape = median(scrapes);
  const onRate = median(slices.on.map((s) => s.rate));
  const onPerLine = slices.on.reduce((a, s) => a + s.cpu, 0) / slices.on.reduce((a, s) => a + s.units, 0);
  return [
    "## Runner telemetry overhead",
    "",
    `Method: two runner server processes alive side by side (\`createRunnerService\` with the token check, memory log store storing every line, memory queue; \`startRunnerServer\`, gRPC fast path), one without any OpenTelemetry provider (the API's no-ops: the library's default) and one with the SDK registered before the service is created by serve's own code (\`startServeTelemetry\`, src/cli/serve-telemetry.ts): the MeterProvider read by the Prometheus exporter, scraped every ${SCRAPE_SECONDS} s (Prometheus's usual interval; its default is 60 s; a scrape once a second before), the W3C propagators, and a TracerProvider with serve's BatchSpanProcessor settings handing every StreamLogs and publish span to an exporter that drops it (serve exports to OTLP only when configured: the encoding and the network are not measured). Client: \`createRunnerClient\` in the bench process, jobs of ${fmt(LINES)} 100-byte lines, after a 20,000-line warm-up job per server. Paired slices (bench/telemetry-pair.ts): ${SLICES} slices, each one job streamed to both servers at the same moment, so a change in the machine's load falls on both members of a pair (before: whole rounds one server after the other, whose noise was larger than the cost). Rates: the median job, cost from the median of the per-pair ratios; CPU: each server's user + system time over all jobs ÷ lines, cost from the ratio of those totals; the last column is the middle half (25th–75th percentile) of the per-pair costs, the noise of a single slice. The machine is shared (2 cores, other agents' work running).`,
    "",
    ...pairHeader("runner stream"),
    pairRow(`lines/s, ${fmt(LINES)}-line jobs`, "rate", slices, "", 1, 0),
    pairRow("server CPU per line", "cpu", slices, "ns", 1000, 1),
    "",
    `The SDK's work per job is per call and per stored batch, never per line: one StreamLogs span and one publish span, the open-streams gauge twice, calls and jobs ended once, lines and bytes ingested and the append latency once per batch. One scrape (\`GET /metrics\`'s collection and Prometheus text, in the server, median of 5): ${fmt(scrape, 0)} µs of CPU; every ${SCRAPE_SECONDS} s at the line rate above that is ${fmt((scrape / (SCRAPE_SECONDS * onRate * onPerLine)) * 100, 3)} % of the server's CPU.`,
  ].join("\n");
}
