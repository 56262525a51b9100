/**
 * The runner service mounted on a host's own node:http2 server, next to another route.
 *
 *   npx tsx examples/runner-http2.ts           # answers one gRPC call to itself, prints, exits 0
 *   npx tsx examples/runner-http2.ts --serve   # stays up until SIGTERM / SIGINT
 *
 * Imports name the package, as in a host (in a clone, tsconfig.json's `paths` map them to src/).
 */
import { randomUUID } from "node:crypto";
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { createMemoryQueue } from "runner-depot/adapters/memory";
import { createRunnerClient, createRunnerHandler, createRunnerService } from "runner-depot/runner";
import { getOverH2c, serveOrDrive, trackH2Sessions } from "./shared/lifecycle.js";

const queue = createMemoryQueue();
const runner = createRunnerService(queue, {
  onEnd: (result) =>
    console.log(
      `runner-http2: job ${result.requestId} ended, exit ${result.exitCode}, ${result.lines.stdout} stdout + ${result.lines.stderr} stderr lines`,
    ),
});
// Without requestPathPrefix the service answers at /runner.v1.Runner/StreamLogs, as gRPC clients expect.
const runnerHandler = createRunnerHandler(runner);

const server = http2.createServer((req, res) => {
  if (req.url.startsWith("/runner.v1.Runner/")) return runnerHandler.handler(req, res);
  if (req.url === "/healthz") {
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify({ ok: true, activeRequests: runnerHandler.activeRequests }));
    return;
  }
  res.writeHead(404, { "content-type": "text/plain" });
  res.end("not found\n");
});
const sessions = trackH2Sessions(server);
await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
const { port } = server.address() as AddressInfo;
const endpoint = `http://127.0.0.1:${port}`;
console.log(`runner-http2: listening on ${endpoint} (gRPC at /runner.v1.Runner/StreamLogs, GET /healthz)`);

async function shutdown(): Promise<void> {
  await runnerHandler.shutdown(1000);
  sessions.closeAll();
  await new Promise<void>((resolve) => server.close(() => resolve()));
  await runner.close();
  await queue.close?.();
}

await serveOrDrive("runner-http2", shutdown, async () => {
  const health = await getOverH2c(endpoint, "/healthz");
  console.log(`runner-http2: GET /healthz -> ${health}`);

  // A real gRPC client-streaming call: a few lines and the end.
  const requestId = randomUUID();
  const client = createRunnerClient({ endpoint, requestId });
  client.log("compiling…");
  client.log("warning: something mild", true);
  client.log("tests passed");
  await client.end({ exitCode: 0, success: true, repoUrl: "https://example.org/repo.git", commitSha: "0123abc" });
  await client.close();

  const result = await queue.next();
  const stored: string[] = [];
  for await (const line of runner.follow(requestId)) stored.push(`${line.stderr ? "err" : "out"}: ${line.line}`);
  console.log(`runner-http2: stored lines: ${JSON.stringify(stored)}`);
  console.log(
    `runner-http2: result outcome=${result.outcome} success=${result.success} requestId=${result.requestId === requestId}`,
  );
});
