/**
 * The depot server of bench/depot-telemetry.ts, in its own process: an fs store (fsync
 * off: the rows measure downloads) in the directory given as the first argument, and
 * `--telemetry=metrics` or `--telemetry=traces` registers an OpenTelemetry SDK first, as serve does
 * (bench/telemetry-sdk.ts). Prints one JSON line `{ "url" }` when listening, then answers
 * the bench's `cpu` and `scrape` lines on stdin (telemetry-sdk.ts); exits on SIGTERM or
 * when stdin closes.
 */
import { createFsStore } from "../src/adapters/fs/store.js";
import { createPackageRouter } from "../src/depot/server/router.js";
import { servePackageRouter } from "../src/depot/server/serve.js";
import { answerBench, registerTelemetrySdk, sdkVariantOf } from "./telemetry-sdk.js";

const dir = process.argv[2]!;
const variant = sdkVariantOf(process.argv);
const telemetry = variant ? registerTelemetrySdk(variant) : undefined;
const store = createFsStore(dir, { unsafeNoSync: true });
const http = await servePackageRouter(createPackageRouter(store), { host: "127.0.0.1", port: 0 });
process.stdout.write(`${JSON.stringify({ url: http.url })}\n`);

const shutdown = async () => {
  await telemetry?.stop();
  await http.close().catch(() => undefined);
  process.exit(0);
};
process.on("SIGTERM", () => void shutdown());
answerBench(telemetry, () => void shutdown());
