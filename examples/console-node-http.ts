/**
 * The web console mounted under `/console` on a plain node:http server, beside the depot
 * under `/depot` and the server's own route.
 *
 *   npx tsx examples/console-node-http.ts           # signs in, follows a job, exits 0
 *   npx tsx examples/console-node-http.ts --serve   # stays up; open the printed login URL
 *
 * The console is a web-standard fetch handler: the depot's createNodeHandler adapts any
 * `{ fetch }` (and the console's Server-Sent Events stream) to node:http. Its page, script and style come from the
 * package itself: nothing to build, nothing from a CDN.
 *
 * Imports name the package, as in a host (in a clone, tsconfig.json's `paths` map them to src/).
 */
import http from "node:http";
import type { AddressInfo } from "node:net";
import { createNodeHandler } from "runner-depot/depot";
import { createConsoleDemo, driveConsole } from "./shared/console-demo.js";
import { closeHttpServer, serveOrDrive } from "./shared/lifecycle.js";

const demo = await createConsoleDemo("/console");
const consoleHandler = createNodeHandler(demo.console);
const depotHandler = createNodeHandler(demo.depot);

const server = http.createServer((req, res) => {
  if (req.url === "/console" || req.url?.startsWith("/console/")) return void consoleHandler(req, res);
  if (req.url?.startsWith("/depot/")) return void depotHandler(req, res);
  res.writeHead(404).end();
});
// Event streams stay open as long as a job runs.
server.requestTimeout = 0;
await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
const origin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
console.log(`console-node-http: listening on ${origin} (console at /console)`);
console.log(`console-node-http: login URL ${origin}/console/?token=${demo.sessions.loginToken()}`);

await serveOrDrive(
  "console-node-http",
  async () => {
    await closeHttpServer(server);
    await demo.close();
  },
  () => driveConsole(`${origin}/console`, demo, "console-node-http"),
);
