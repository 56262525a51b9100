/**
 * The runner server of bench/runner-telemetry.ts, in its own process: createRunnerService
 * (memory queue, memory log store: the smallest per-line cost, so telemetry's share shows
 * the most) + startRunnerServer with the token check on. `--telemetry` registers an
 * OpenTelemetry SDK first, as serve does: a MeterProvider with a pull reader (collected
 * once a second, like a scrape) and a TracerProvider batching every span to an exporter
 * that drops it. Prints one JSON line `{ "port" }` when listening, then answers each `cpu`
 * line on stdin with one JSON line of its `process.cpuUsage()`; exits when stdin closes.
 */
import { createInterface } from "node:readline";
import { createMemoryLogStore } from "../src/adapters/memory/log-store.js";
import { createMemoryQueue } from "../src/adapters/memory/queue.js";
import { startRunnerServer } from "../src/runner/server.js";
import { createRunnerService } from "../src/runner/service.js";
import { registerTelemetrySdk } from "./telemetry-sdk.js";

const withTelemetry = process.argv.includes("--telemetry");
const secret = process.argv[2]!;
let scrape: NodeJS.Timeout | undefined;
if (withTelemetry) scrape = registerTelemetrySdk();
const queue = createMemoryQueue();
const runner = createRunnerService(queue, { secret, logs: createMemoryLogStore(), retentionMs: false });
const server = await startRunnerServer(runner, { port: 0 });
process.stdout.write(`${JSON.stringify({ port: server.port })}\n`);

const commands = createInterface({ input: process.stdin });
commands.on("line", (line) => {
  if (line.trim() === "cpu") process.stdout.write(`${JSON.stringify(process.cpuUsage())}\n`);
});
commands.on("close", () => {
  clearInterval(scrape);
  void server
    .close()
    .then(() => runner.close())
    .finally(() => {
      process.exitCode = 0;
    });
});
