/**
 * The depot mounted under `/depot` in an Express 5 app, next to the app's own JSON route.
 *
 *   npx tsx examples/depot-express.ts           # publishes and installs through itself, exits 0
 *   npx tsx examples/depot-express.ts --serve   # stays up until SIGTERM / SIGINT
 *
 * Two things keep uploads streaming and URLs right:
 * - body parsers (`express.json()`) go on the app's own routes only, never in front of
 *   the depot, so its request bodies reach it unread;
 * - the depot is a route (`app.all`), not `app.use("/depot", …)`: `use` strips the mount
 *   path from `req.url`, and the router, created with `base: "/depot"`, must see it to
 *   answer `Location` headers and package URLs that point back under `/depot`.
 *
 * Imports name the package, as in a host (in a clone, tsconfig.json's `paths` map them to src/).
 */
import { mkdtemp, rm } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import express from "express";
import { createFsStore } from "runner-depot/adapters/fs";
import { applyConnectionLimits, createNodeHandler, createPackageRouter } from "runner-depot/depot";
import { driveDepot } from "./shared/drive-depot.js";
import { closeHttpServer, serveOrDrive } from "./shared/lifecycle.js";

const dir = await mkdtemp(join(tmpdir(), "runner-depot-example-"));
const store = createFsStore(dir);
const depot = createPackageRouter(store, { base: "/depot" });
// Archive and upload bytes move as Node streams between the socket and the store.
const depotHandler = createNodeHandler(depot);

const app = express();
app.post("/api/echo", express.json(), (req, res) => {
  res.json({ echoed: req.body });
});
app.all("/depot/{*rest}", (req, res) => {
  void depotHandler(req, res);
});

// The server is created here rather than by app.listen so its bounds apply before it listens.
const server: Server = createServer(app);
applyConnectionLimits(server, { maxConnections: 1000 });
await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
const origin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
console.log(`depot-express: listening on ${origin} (depot at /depot, POST /api/echo)`);

async function shutdown(): Promise<void> {
  await closeHttpServer(server);
  await store.close?.();
  await rm(dir, { recursive: true, force: true });
}

await serveOrDrive("depot-express", shutdown, async () => {
  const echo = await fetch(`${origin}/api/echo`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: '{"hi":1}',
  });
  console.log(`depot-express: POST /api/echo -> ${await echo.text()}`);
  await driveDepot(`${origin}/depot`, "depot-express");
});
