/**
 * The server of bench/log-search.ts, in its own process so its memory is its own: the console (`createConsole` on
 * node:http) over a runner service on the fs log store in the directory given (filled by the bench beforehand).
 * Prints one JSON line `{ "port" }` once listening; then answers each stdin line: `idle` with its RSS after a full
 * GC (it runs with --expose-gc), `watch` by sampling its RSS every 5 ms, `peak` with the highest sample since
 * `watch`. Exits when stdin closes.
 */
import http from "node:http";
import type { AddressInfo } from "node:net";
import { createInterface } from "node:readline";
import { toNodeHandler } from "srvx/node";
import { createFsLogStore } from "../src/adapters/fs/index.js";
import { createMemoryQueue } from "../src/adapters/memory/index.js";
import { createConsole } from "../src/console/index.js";
import { createRunnerService } from "../src/runner/index.js";

const logs = createFsLogStore(process.argv[2]!, { fsync: false });
const runner = createRunnerService(createMemoryQueue(), { logs, retentionMs: false });
const web = createConsole({ runner });
const server = http.createServer(
  toNodeHandler((request: Request) => web.fetch(request)) as unknown as http.RequestListener,
);
await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
process.stdout.write(`${JSON.stringify({ port: (server.address() as AddressInfo).port })}\n`);

let peak = 0;
let sampler: NodeJS.Timeout | undefined;
const gc = (globalThis as { gc?: () => void }).gc;
for await (const line of createInterface({ input: process.stdin })) {
  if (line === "idle") {
    gc?.();
    process.stdout.write(`${JSON.stringify({ rss: process.memoryUsage.rss() })}\n`);
  } else if (line === "watch") {
    peak = process.memoryUsage.rss();
    clearInterval(sampler);
    sampler = setInterval(() => (peak = Math.max(peak, process.memoryUsage.rss())), 5);
  } else if (line === "peak") {
    clearInterval(sampler);
    peak = Math.max(peak, process.memoryUsage.rss());
    process.stdout.write(`${JSON.stringify({ rss: peak })}\n`);
  }
}
clearInterval(sampler);
server.closeAllConnections();
await new Promise((resolve) => server.close(resolve));
await runner.close();
await logs.close?.();
