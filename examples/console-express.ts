/**
 * The web console mounted under `/console` in an Express 5 app.
 *
 *   npx tsx examples/console-express.ts           # signs in, follows a job, exits 0
 *   npx tsx examples/console-express.ts --serve   # stays up; open the printed login URL
 *
 * A route (`app.all`), not `app.use("/console", …)`: `use` strips the mount path from
 * `req.url`, and the console, created with `base: "/console"`, needs it to answer. No body
 * parser in front of it (cancel has no body, and the console reads none).
 *
 * Imports name the package, as in a host (in a clone, tsconfig.json's `paths` map them to src/).
 */
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import express from "express";
import { createNodeHandler } from "runner-depot/depot";
import { createConsoleDemo, driveConsole } from "./shared/console-demo.js";
import { closeHttpServer, serveOrDrive } from "./shared/lifecycle.js";

const demo = await createConsoleDemo("/console");
const consoleHandler = createNodeHandler(demo.console);

const app = express();
app.get("/healthz", (_req, res) => {
  res.json({ ok: true });
});
app.all(["/console", "/console/{*rest}"], (req, res) => {
  void consoleHandler(req, res);
});

const server = await new Promise<Server>((resolve) => {
  const s = app.listen(0, "127.0.0.1", () => resolve(s));
});
server.requestTimeout = 0;
const origin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
console.log(`console-express: listening on ${origin} (console at /console)`);
console.log(`console-express: login URL ${origin}/console/?token=${demo.sessions.loginToken()}`);

await serveOrDrive(
  "console-express",
  async () => {
    await closeHttpServer(server);
    await demo.close();
  },
  () => driveConsole(`${origin}/console`, demo, "console-express"),
);
