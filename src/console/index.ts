/**
 * The web console: a `fetch(Request)` handler that shows the runner's jobs (list, live log
 * streamed over server-sent events with ANSI colours and carriage returns rendered, raw
 * download, cancel) and the depot's packages (catalog, versions, dependencies), mountable
 * under any path of any host that speaks fetch. Access is the host's: its own
 * `authorize` check, or {@link createConsoleSessions} for one-time login links and
 * session cookies; state-changing requests are checked for origin and CSRF token.
 * `runner-depot serve` mounts it at `/-/console/`.
 *
 * @example
 * ```ts
 * import { createConsole, createConsoleSessions } from "runner-depot/console";
 * import { createRunnerService } from "runner-depot/runner";
 * import { createPackageRouter, servePackageRouter } from "runner-depot/depot";
 * import { createMemoryQueue, createMemoryStore } from "runner-depot/adapters/memory";
 *
 * const runner = createRunnerService(createMemoryQueue());
 * const depot = createPackageRouter(createMemoryStore());
 * const sessions = createConsoleSessions();
 * const web = createConsole({ runner, depot, sessions, base: "/console" });
 * // Serve both from one fetch handler; open the printed link once to get a session cookie.
 * const server = await servePackageRouter({
 *   fetch: (request) =>
 *     new URL(request.url).pathname.startsWith("/console/") ? web.fetch(request) : depot.fetch(request),
 * }, { port: 8080 });
 * console.log(`${server.url}/console/?token=${sessions.loginToken()}`);
 * ```
 *
 * @module runner-depot/console
 */
// First: throws on an unsupported Node before the rest loads (node-support.ts).
import "../node-check.js";
export { createConsole } from "./console.js";
export type { Console, ConsoleOptions, ConsoleAuthorizeContext } from "./console.js";
export { createConsoleSessions } from "./sessions.js";
export type { ConsoleSessions, ConsoleSessionsOptions, ConsoleSession } from "./sessions.js";
export type { ConsoleDepot } from "./packages.js";
