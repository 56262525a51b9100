/**
 * The depot embedded in a plain node:http server, under `/depot`, next to the host's own
 * route. `createNodeHandler` turns the router into a Node listener that moves archive and
 * upload bytes as Node streams (no Web-stream conversion per chunk), and
 * `applyConnectionLimits` bounds every connection phase (headers, keep-alive, a stalled
 * body answers 408) and caps the connections.
 *
 *   npx tsx examples/depot-node-http.ts           # publishes and installs through itself, exits 0
 *   npx tsx examples/depot-node-http.ts --serve   # stays up until SIGTERM / SIGINT
 *
 * Mounting the router in your own server makes auth your choice: this one is open and
 * binds 127.0.0.1 only; give `createPackageRouter` an `authorize` hook (e.g.
 * `bearerTokens`) before listening anywhere else.
 *
 * Imports name the package, as in a host (in a clone, tsconfig.json's `paths` map them to src/).
 */
import { mkdtemp, rm } from "node:fs/promises";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createFsStore } from "runner-depot/adapters/fs";
import { applyConnectionLimits, createNodeHandler, createPackageRouter } from "runner-depot/depot";
import { driveDepot } from "./shared/drive-depot.js";
import { closeHttpServer, serveOrDrive } from "./shared/lifecycle.js";

const dir = await mkdtemp(join(tmpdir(), "runner-depot-example-"));
const store = createFsStore(dir);
const depot = createPackageRouter(store, { base: "/depot" });
const depotHandler = createNodeHandler(depot);

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
// Before listening: per-phase deadlines instead of a whole-request one (slow uploads complete), and a connection cap.
applyConnectionLimits(server, { maxConnections: 1000 });
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
