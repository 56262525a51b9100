/**
 * The web console mounted under `/console` in a Hono 4 app on Node (@hono/node-server).
 *
 *   npx tsx examples/console-hono.ts           # signs in, follows a job, exits 0
 *   npx tsx examples/console-hono.ts --serve   # stays up; open the printed login URL
 *
 * Hono and the console both speak web-standard Request/Response: the route hands
 * `c.req.raw` to `console.fetch` as it is. A route keeps the `/console` prefix the
 * console (created with `base: "/console"`) needs; `app.mount()` would strip it.
 *
 * Imports name the package, as in a host (in a clone, tsconfig.json's `paths` map them to src/).
 */
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import { serve } from "@hono/node-server";
import { Hono } from "hono";
import { createConsoleDemo, driveConsole } from "./shared/console-demo.js";
import { closeHttpServer, serveOrDrive } from "./shared/lifecycle.js";

const demo = await createConsoleDemo("/console");

const app = new Hono();
app.get("/healthz", (c) => c.json({ ok: true }));
app.all("/console", (c) => demo.console.fetch(c.req.raw));
app.all("/console/*", (c) => demo.console.fetch(c.req.raw));

const server = await new Promise<Server>((resolve) => {
  const s = serve({ fetch: app.fetch, hostname: "127.0.0.1", port: 0 }, () => resolve(s as Server));
});
server.requestTimeout = 0;
const origin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
console.log(`console-hono: listening on ${origin} (console at /console)`);
console.log(`console-hono: login URL ${origin}/console/?token=${demo.sessions.loginToken()}`);

await serveOrDrive(
  "console-hono",
  async () => {
    await closeHttpServer(server);
    await demo.close();
  },
  () => driveConsole(`${origin}/console`, demo, "console-hono"),
);
