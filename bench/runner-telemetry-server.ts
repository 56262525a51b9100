/**
 * The runner server of bench/runner-telemetry.ts, in its own process: createRunnerService
 * (memory queue, memory log store: the smallest per-line cost, so telemetry's share shows
 * the most) + startRunnerServer with the token check on. `--telemetry=metrics` or `--telemetry=traces` registers an
 * OpenTelemetry SDK first, as serve does (bench/telemetry-sdk.ts). Prints one JSON line
 * `{ "port" }` when listening, then answers the bench's `cpu` and `scrape` lines on stdin
 * (telemetry-sdk.ts); exits when stdin closes.
 */
import { createMemoryLogStore } from "../src/adapters/memory/log-store.js";
import { createMemoryQueue } from "../src/adapters/memory/queue.js";
import { startRunnerServer } from "../src/runner/server/start-server.js";
import { createRunnerService } from "../src/runner/index.js";
import { answerBench, registerTelemetrySdk, sdkVariantOf } from "./telemetry-sdk.js";

const secret = process.argv[2]!;
const variant = sdkVariantOf(process.argv);
const telemetry = variant ? registerTelemetrySdk(variant) : undefined;
const queue = createMemoryQueue();
const runner = createRunnerService(queue, { secret, logs: createMemoryLogStore(), retentionMs: false });
const server = await startRunnerServer(runner, { port: 0 });
process.stdout.write(`${JSON.stringify({ port: server.port })}\n`);

answerBench(telemetry, () => {
  void server
    .close()
    .then(() => runner.close())
    .then(() => telemetry?.stop())
    .finally(() => {
      process.exitCode = 0;
    });
});
