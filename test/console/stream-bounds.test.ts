/**
 * Issue 30 items 8 and 9 on the console, served as `serve` serves it (servePackageRouter's
 * Node handler, real sockets): one session cannot hold every live stream, a stream's slot is
 * freed when its client's socket closes (not at the next 15 s keep-alive), and the session
 * cookie is Secure behind a TLS terminator when the host says so.
 */
import { randomUUID } from "node:crypto";
import { request as httpRequest } from "node:http";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { consoleLogin } from "../fixtures/console-login.js";
import { createMemoryQueue } from "../../src/adapters/memory/index.js";
import { createConsole, createConsoleSessions, type ConsoleOptions } from "../../src/console/index.js";
import { servePackageRouter, type PackageServer } from "../../src/depot/server/serve.js";
import { createRunnerService, type RunnerService } from "../../src/runner/index.js";

let runner: RunnerService;
const servers: PackageServer[] = [];
beforeAll(() => {
  runner = createRunnerService(createMemoryQueue());
});
afterAll(async () => {
  for (const s of servers) await s.close();
  await runner.close();
});

async function start(options: ConsoleOptions) {
  const sessions = createConsoleSessions();
  const web = createConsole({ runner, sessions, base: "/c", ...options });
  const server = await servePackageRouter({ isOpen: false, fetch: (r) => web.fetch(r) });
  servers.push(server);
  const login = async (headers: Record<string, string> = {}) => {
    const answer = await consoleLogin(`${server.url}/c/?token=${sessions.loginToken()}`, headers);
    expect(answer.status).toBe(303);
    return answer.headers.get("set-cookie")!;
  };
  return { url: `${server.url}/c`, login };
}

async function openJob(): Promise<string> {
  const id = randomUUID();
  await runner.expectJob(id);
  return id;
}

describe("console live streams (issue 30 item 8)", () => {
  it("one session holds at most maxStreamsPerSession streams; another session still gets one", async () => {
    const { url, login } = await start({ maxStreams: 6, maxStreamsPerSession: 2 });
    const id = await openJob();
    const cookie = (await login()).split(";")[0]!;
    const events = () => fetch(`${url}/api/jobs/${id}/events`, { headers: { cookie } });
    const held = [await events(), await events()];
    expect(held.map((r) => r.status)).toEqual([200, 200]);
    const third = await events();
    expect(third.status).toBe(503);
    expect([third.status, ((await third.json()) as { code: string }).code]).toEqual([503, "UNAVAILABLE"]);
    const other = (await login()).split(";")[0]!;
    const theirs = await fetch(`${url}/api/jobs/${id}/events`, { headers: { cookie: other } });
    expect(theirs.status).toBe(200);
    for (const r of [...held, theirs]) await r.body!.cancel();
  });

  it("a stream's slot is freed when its client's socket closes, well before the next keep-alive", async () => {
    const { url, login } = await start({ maxStreams: 1 });
    const id = await openJob();
    const cookie = (await login()).split(";")[0]!;
    // A raw request whose socket is destroyed once the headers arrive: no read, no cancel.
    await new Promise<void>((resolve, reject) => {
      const req = httpRequest(`${url}/api/jobs/${id}/events`, { headers: { cookie } }, (res) => {
        expect(res.statusCode).toBe(200);
        req.destroy();
        resolve();
      });
      req.on("error", () => undefined);
      req.once("error", reject);
      req.end();
    });
    // The keep-alive comment comes after 15 s; the slot must be back long before.
    let status = 503;
    const until = Date.now() + 5000;
    while (status === 503 && Date.now() < until) {
      await new Promise((r) => setTimeout(r, 50));
      const again = await fetch(`${url}/api/jobs/${id}/events`, { headers: { cookie } });
      status = again.status;
      await again.body?.cancel();
    }
    expect(status, "the slot was still held 5 s after the client's socket closed").toBe(200);
  });
});

describe("the session cookie behind a TLS terminator (issue 30 item 9)", () => {
  it("is Secure with secureCookies, or with trustProxy and X-Forwarded-Proto: https; never on an untrusted header", async () => {
    const forced = await start({ secureCookies: true });
    expect(await forced.login()).toMatch(/; Secure$/);
    const trusting = await start({ trustProxy: true });
    expect(await trusting.login({ "x-forwarded-proto": "https" })).toMatch(/; Secure$/);
    expect(await trusting.login()).not.toMatch(/Secure/);
    const plain = await start({});
    expect(await plain.login({ "x-forwarded-proto": "https" })).not.toMatch(/Secure/);
  });
});
