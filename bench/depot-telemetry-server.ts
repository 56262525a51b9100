/**
 * The depot server of bench/depot-telemetry.ts, in its own process: an fs store (fsync
 * off: the rows measure downloads) in the directory given as the first argument, and
 * `--telemetry` as the second registers an OpenTelemetry SDK first, as serve does: a
 * MeterProvider with a pull reader (collected once a second, like a scrape) and a
 * TracerProvider batching every span to an exporter that drops them. Prints one JSON line
 * `{ "url" }` when listening, then answers each `cpu` line on stdin with one JSON line of
 * its `process.cpuUsage()`; exits on SIGTERM or when stdin closes.
 */
import { createInterface } from "node:readline";
import { createFsStore } from "../src/adapters/fs/store.js";
import { createPackageRouter } from "../src/depot/router.js";
import { servePackageRouter } from "../src/depot/serve.js";
import { registerTelemetrySdk } from "./telemetry-sdk.js";

const dir = process.argv[2]!;
const withTelemetry = process.argv[3] === "--telemetry";
let scrape: NodeJS.Timeout | undefined;
if (withTelemetry) scrape = registerTelemetrySdk();
const store = createFsStore(dir, { unsafeNoSync: true });
const http = await servePackageRouter(createPackageRouter(store), { host: "127.0.0.1", port: 0 });
process.stdout.write(`${JSON.stringify({ url: http.url })}\n`);

const shutdown = async () => {
  clearInterval(scrape);
  await http.close().catch(() => undefined);
  process.exit(0);
};
process.on("SIGTERM", () => void shutdown());
const commands = createInterface({ input: process.stdin });
commands.on("line", (line) => {
  if (line.trim() === "cpu") process.stdout.write(`${JSON.stringify(process.cpuUsage())}\n`);
});
commands.on("close", () => void shutdown());
