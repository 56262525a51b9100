/**
 * The web console mounted under `/console` in a Fastify 5 app.
 *
 *   npx tsx examples/console-fastify.ts           # signs in, follows a job, exits 0
 *   npx tsx examples/console-fastify.ts --serve   # stays up; open the printed login URL
 *
 * The route hijacks the reply and hands the raw Node request and response to the console
 * through the depot's createNodeHandler (any `{ fetch }`), so the event stream is written as it comes (Fastify's
 * own reply would wait for the whole body).
 *
 * Imports name the package, as in a host (in a clone, tsconfig.json's `paths` map them to src/).
 */
import Fastify from "fastify";
import { createNodeHandler } from "runner-depot/depot";
import { createConsoleDemo, driveConsole } from "./shared/console-demo.js";
import { serveOrDrive } from "./shared/lifecycle.js";

const demo = await createConsoleDemo("/console");
const consoleHandler = createNodeHandler(demo.console);

// forceCloseConnections: an open event stream (a browser on a running job's page) must not
// hold app.close() until the job ends.
const app = Fastify({ logger: false, requestTimeout: 0, forceCloseConnections: true });
app.get("/healthz", async () => ({ ok: true }));
// The console reads its own bodies (the login form): Fastify's parsers stay out of its scope.
await app.register(async (scope) => {
  scope.removeAllContentTypeParsers();
  scope.addContentTypeParser("*", (_request, _payload, done) => done(null));
  for (const path of ["/console", "/console/*"]) {
    scope.all(path, (request, reply) => {
      reply.hijack();
      void consoleHandler(request.raw, reply.raw);
    });
  }
});

const origin = await app.listen({ host: "127.0.0.1", port: 0 });
console.log(`console-fastify: listening on ${origin} (console at /console)`);
console.log(`console-fastify: login URL ${origin}/console/?token=${demo.sessions.loginToken()}`);

await serveOrDrive(
  "console-fastify",
  async () => {
    await app.close();
    await demo.close();
  },
  () => driveConsole(`${origin}/console`, demo, "console-fastify"),
);
