/**
 * The depot mounted under `/depot` in a Hono 4 app on Node (@hono/node-server), next to
 * the app's own route.
 *
 *   npx tsx examples/depot-hono.ts           # publishes and installs through itself, exits 0
 *   npx tsx examples/depot-hono.ts --serve   # stays up until SIGTERM / SIGINT
 *
 * Hono and the depot both speak web-standard Request/Response, so the route hands
 * `c.req.raw` (a native streaming Request) to `depot.fetch` as it is. `app.mount()` would
 * strip the prefix; a route keeps it, which the router (created with `base: "/depot"`)
 * needs to answer URLs under `/depot`.
 *
 * Imports name the package, as in a host (in a clone, tsconfig.json's `paths` map them to src/).
 */
import { mkdtemp, rm } from "node:fs/promises";
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { serve } from "@hono/node-server";
import { Hono } from "hono";
import { createFsStore } from "runner-depot/adapters/fs";
import { createPackageRouter } from "runner-depot/depot";
import { driveDepot } from "./shared/drive-depot.js";
import { closeHttpServer, serveOrDrive } from "./shared/lifecycle.js";

const dir = await mkdtemp(join(tmpdir(), "runner-depot-example-"));
const store = createFsStore(dir);
const depot = createPackageRouter(store, { base: "/depot" });

const app = new Hono();
app.get("/healthz", (c) => c.json({ ok: true }));
app.all("/depot/*", (c) => depot.fetch(c.req.raw));

const server = await new Promise<Server>((resolve) => {
  const s = serve({ fetch: app.fetch, hostname: "127.0.0.1", port: 0 }, () => resolve(s as Server));
});
server.requestTimeout = 0;
const origin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
console.log(`depot-hono: listening on ${origin} (depot at /depot, GET /healthz)`);

async function shutdown(): Promise<void> {
  await closeHttpServer(server);
  await store.close?.();
  await rm(dir, { recursive: true, force: true });
}

await serveOrDrive("depot-hono", shutdown, async () => {
  console.log(`depot-hono: GET /healthz -> ${await (await fetch(`${origin}/healthz`)).text()}`);
  await driveDepot(`${origin}/depot`, "depot-hono");
});
