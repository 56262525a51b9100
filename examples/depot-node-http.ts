/**
 * The depot embedded in a plain node:http server, under `/depot`, next to the host's own
 * route. srvx's `toNodeHandler` turns the router's `fetch(Request)` into a Node listener
 * and hands it native streaming request bodies.
 *
 *   npx tsx examples/depot-node-http.ts           # publishes and installs through itself, exits 0
 *   npx tsx examples/depot-node-http.ts --serve   # stays up until SIGTERM / SIGINT
 *
 * Mounting the router in your own server makes auth your choice: this one is open and
 * binds 127.0.0.1 only; give `createPackageRouter` an `authorize` hook (e.g.
 * `bearerTokens`) before listening anywhere else.
 *
 * Imports go to the package's source by relative path: `runner-depot` itself only
 * resolves after a build and an install (in a host: `from "runner-depot/depot"` and
 * `from "runner-depot/adapters/fs"`).
 */
import { mkdtemp, rm } from "node:fs/promises";
import http, { type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { toNodeHandler } from "srvx/node";
import { createFsStore } from "../src/adapters/fs/index.js";
import { createPackageRouter } from "../src/depot/index.js";
import { driveDepot } from "./shared/drive-depot.js";
import { closeHttpServer, serveOrDrive } from "./shared/lifecycle.js";

const dir = await mkdtemp(join(tmpdir(), "runner-depot-example-"));
const store = createFsStore(dir);
const depot = createPackageRouter(store, { base: "/depot" });
// toNodeHandler's type covers HTTP/1 and HTTP/2 listeners; this server is HTTP/1.
const depotHandler = toNodeHandler((request: Request) => depot.fetch(request)) as (req: IncomingMessage, res: ServerResponse) => Promise<void>;

const server = http.createServer((req, res) => {
  if (req.url === "/depot" || req.url?.startsWith("/depot/")) return void depotHandler(req, res);
  if (req.url === "/healthz") {
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify({ ok: true }));
    return;
  }
  res.writeHead(404, { "content-type": "text/plain" });
  res.end("not found\n");
});
// Uploads may take long on slow links: no whole-request deadline.
server.requestTimeout = 0;
await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
const origin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
console.log(`depot-node-http: listening on ${origin} (depot at /depot, GET /healthz), store ${dir}`);

async function shutdown(): Promise<void> {
  await closeHttpServer(server);
  await store.close?.();
  await rm(dir, { recursive: true, force: true });
}

await serveOrDrive("depot-node-http", shutdown, async () => {
  console.log(`depot-node-http: GET /healthz -> ${await (await fetch(`${origin}/healthz`)).text()}`);
  await driveDepot(`${origin}/depot`, "depot-node-http");
});
