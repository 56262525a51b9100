/**
 * The runner service inside Fastify 5 with `http2: true` (h2c), next to an ordinary route.
 *
 *   npx tsx examples/runner-fastify.ts           # answers one gRPC call to itself, prints, exits 0
 *   npx tsx examples/runner-fastify.ts --serve   # stays up until SIGTERM / SIGINT
 *
 * `@connectrpc/connect-fastify` 2.1.1 would do the mounting (peer fastify ^4.22.1 || ^5.1.0,
 * connect(-node) 2.1.1, engines node >= 20), but the project does not depend on it, so
 * this example hands Fastify's raw HTTP/2 request and response to `createRunnerHandler`
 * instead: a scope whose content-type parser leaves the body unread, and a route that
 * hijacks the reply. That keeps gRPC, gRPC-web and Connect requests streaming.
 *
 * Imports go to the package's source by relative path: `runner-depot` itself only
 * resolves after a build and an install (in a host: `from "runner-depot/runner"`).
 */
import { randomUUID } from "node:crypto";
import http2 from "node:http2";
import Fastify from "fastify";
import { createMemoryQueue } from "runner-depot/adapters/memory";
import { createRunnerClient, createRunnerHandler, createRunnerService } from "runner-depot/runner";
import { getOverH2c, serveOrDrive, trackH2Sessions } from "./shared/lifecycle.js";

const queue = createMemoryQueue();
const runner = createRunnerService(queue);
const runnerHandler = createRunnerHandler(runner);

const app = Fastify({ http2: true, logger: false });
app.get("/healthz", async () => ({ ok: true, activeRequests: runnerHandler.activeRequests }));
await app.register(async (scope) => {
  // connect reads the request stream itself; Fastify must not buffer or parse it.
  scope.removeAllContentTypeParsers();
  scope.addContentTypeParser("*", (_request, _payload, done) => done(null));
  scope.post("/runner.v1.Runner/*", (request, reply) => {
    reply.hijack();
    // Plugin scopes are typed with Fastify's default (HTTP/1) raw types; this server is HTTP/2.
    runnerHandler.handler(
      request.raw as unknown as http2.Http2ServerRequest,
      reply.raw as unknown as http2.Http2ServerResponse,
    );
  });
});

const sessions = trackH2Sessions(app.server as http2.Http2Server);
const address = await app.listen({ host: "127.0.0.1", port: 0 });
console.log(`runner-fastify: listening on ${address} (h2c; gRPC at /runner.v1.Runner/StreamLogs, GET /healthz)`);

async function shutdown(): Promise<void> {
  await runnerHandler.shutdown(1000);
  sessions.closeAll();
  await app.close();
  await runner.close();
  await queue.close?.();
}

await serveOrDrive("runner-fastify", shutdown, async () => {
  const health = await getOverH2c(address, "/healthz");
  console.log(`runner-fastify: GET /healthz -> ${health}`);

  const requestId = randomUUID();
  const client = createRunnerClient({ endpoint: address, requestId });
  for (let i = 1; i <= 3; i++) client.log(`step ${i} of 3`);
  await client.end({ exitCode: 0, success: true, repoUrl: "https://example.org/repo.git", commitSha: "0123abc" });
  await client.close();

  const result = await queue.next();
  console.log(
    `runner-fastify: result outcome=${result.outcome} exitCode=${result.exitCode} stdout=${result.lines.stdout} requestId=${result.requestId === requestId}`,
  );
});
