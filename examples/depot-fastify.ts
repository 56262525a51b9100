/**
 * The depot mounted under `/depot` in a Fastify 5 app, next to the app's own JSON route.
 *
 *   npx tsx examples/depot-fastify.ts           # publishes and installs through itself, exits 0
 *   npx tsx examples/depot-fastify.ts --serve   # stays up until SIGTERM / SIGINT
 *
 * The depot lives in its own plugin scope whose content-type parser leaves every body
 * unread (Fastify would otherwise buffer it, up to its 1 MiB bodyLimit), and its route
 * hijacks the reply and hands the raw Node request and response to `createNodeHandler`,
 * so uploads of any size stream straight into the store and archives straight out of it,
 * as Node streams. `applyConnectionLimits` bounds Fastify's server before it listens.
 *
 * Imports name the package, as in a host (in a clone, tsconfig.json's `paths` map them to src/).
 */
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import Fastify from "fastify";
import { createFsStore } from "runner-depot/adapters/fs";
import { applyConnectionLimits, createNodeHandler, createPackageRouter } from "runner-depot/depot";
import { driveDepot } from "./shared/drive-depot.js";
import { serveOrDrive } from "./shared/lifecycle.js";

const dir = await mkdtemp(join(tmpdir(), "runner-depot-example-"));
const store = createFsStore(dir);
const depot = createPackageRouter(store, { base: "/depot" });
const depotHandler = createNodeHandler(depot);

const app = Fastify({ logger: false, requestTimeout: 0 });
applyConnectionLimits(app.server, { maxConnections: 1000 });
app.post("/api/echo", async (request) => ({ echoed: request.body }));
await app.register(async (scope) => {
  scope.removeAllContentTypeParsers();
  scope.addContentTypeParser("*", (_request, _payload, done) => done(null));
  // `all` also answers HEAD (catalog ETag checks, archive sizes) without Fastify's implicit HEAD route.
  scope.all("/depot/*", (request, reply) => {
    reply.hijack();
    void depotHandler(request.raw, reply.raw);
  });
});

const origin = await app.listen({ host: "127.0.0.1", port: 0 });
console.log(`depot-fastify: listening on ${origin} (depot at /depot, POST /api/echo)`);

async function shutdown(): Promise<void> {
  await app.close();
  await store.close?.();
  await rm(dir, { recursive: true, force: true });
}

await serveOrDrive("depot-fastify", shutdown, async () => {
  const echo = await fetch(`${origin}/api/echo`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: '{"hi":1}',
  });
  console.log(`depot-fastify: POST /api/echo -> ${await echo.text()}`);
  const head = await fetch(`${origin}/depot/catalog`, { method: "HEAD" });
  console.log(`depot-fastify: HEAD /depot/catalog -> ${head.status} etag ${head.headers.get("etag")}`);
  await driveDepot(`${origin}/depot`, "depot-fastify");
});
