/**
 * The console over real HTTP (node:http + srvx, real fetch): the event stream's resume
 * protocol, the line windows and raw download, access (login once, host authorize, Origin
 * and CSRF on cancel), bounds and errors, and the catalog paging against a depot that
 * pages by `Link: rel="next"` as well as one that answers whole.
 */
import { randomUUID } from "node:crypto";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { toNodeHandler } from "srvx/node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { consoleLogin } from "../fixtures/console-login.js";
import { createMemoryQueue, createMemoryStore } from "../../src/adapters/memory/index.js";
import { createConsole, createConsoleSessions, type ConsoleOptions } from "../../src/console/index.js";
import { createPackageRouter } from "../../src/depot/index.js";
import { createRunnerService, type RunnerService } from "../../src/runner/index.js";
import { logEntry } from "../../src/testing/helpers.js";
import { publish } from "../fixtures/depot.js";

interface Served {
  url: string;
  close(): Promise<void>;
}

async function serve(handler: (request: Request) => Promise<Response>): Promise<Served> {
  const server = http.createServer(toNodeHandler(handler) as unknown as http.RequestListener);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** Reads SSE events from a response until `stop` says so (or the stream ends). */
async function readEvents(
  response: Response,
  stop: (events: Array<{ event: string; id: string; data: string }>) => boolean,
) {
  const events: Array<{ event: string; id: string; data: string }> = [];
  const reader = response.body!.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut: number;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const fields = Object.fromEntries(
        block
          .split("\n")
          .filter((l) => !l.startsWith(":"))
          .map((l) => [l.slice(0, l.indexOf(":")), l.slice(l.indexOf(":") + 2)]),
      );
      if (fields.event) events.push({ event: fields.event, id: fields.id ?? "", data: fields.data ?? "" });
      // Checked per event, so a test can stop exactly after the one it wants.
      if (stop(events)) {
        await reader.cancel();
        return events;
      }
    }
  }
  return events;
}

const linesOf = (events: Array<{ event: string; data: string }>) =>
  events
    .filter((e) => e.event === "lines")
    .flatMap((e) => (JSON.parse(e.data) as { lines: Array<[string, number]> }).lines);

describe("console over HTTP: jobs", () => {
  let runner: RunnerService;
  let served: Served;
  let base: string;
  beforeAll(async () => {
    runner = createRunnerService(createMemoryQueue());
    const web = createConsole({ runner, base: "/ops/console", maxStreams: 3 });
    served = await serve((request) => web.fetch(request));
    base = `${served.url}/ops/console`;
  });
  afterAll(async () => {
    await served.close();
    await runner.close();
  });

  async function job(lines: number): Promise<string> {
    const id = randomUUID();
    await runner.expectJob(id);
    if (lines > 0)
      await runner.logs.append(
        id,
        0,
        Array.from({ length: lines }, (_, i) => logEntry(`line ${i + 1}`, i % 3 === 2)),
      );
    return id;
  }

  it("events: a reconnect with Last-Event-ID continues exactly after the last line received, live lines included", async () => {
    const id = await job(1200);
    const first = await readEvents(
      await fetch(`${base}/api/jobs/${id}/events`),
      (e) => e.filter((x) => x.event === "lines").length >= 1,
    );
    const firstLines = linesOf(first);
    const lastId = first.filter((e) => e.event === "lines").at(-1)!.id;
    expect(Number(lastId)).toBe(firstLines.length);
    // Cut after the first event: most of the log is still to come.
    expect(firstLines.length).toBeGreaterThan(0);
    expect(firstLines.length).toBeLessThanOrEqual(500);
    // Lines added while disconnected, then a reconnect as EventSource makes it.
    await runner.logs.append(id, 1200, [logEntry("line 1201")]);
    const rest = fetch(`${base}/api/jobs/${id}/events`, { headers: { "last-event-id": lastId } });
    const pending = rest.then((r) => readEvents(r, (e) => e.some((x) => x.event === "end")));
    await new Promise((r) => setTimeout(r, 50));
    await runner.cancelJob(id);
    const second = await pending;
    const all = [...firstLines, ...linesOf(second)].map(([text]) => text);
    expect(all).toEqual(Array.from({ length: 1201 }, (_, i) => `line ${i + 1}`));
    const end = second.find((e) => e.event === "end")!;
    expect(JSON.parse(end.data)).toMatchObject({ status: "cancelled", outcome: "cancelled", storedLines: 1201 });
    // Every lines event says where it starts, and its ID is where it ends.
    let at = Number(lastId);
    for (const e of second.filter((x) => x.event === "lines")) {
      const data = JSON.parse(e.data) as { from: number; lines: unknown[] };
      expect(data.from).toBe(at);
      at += data.lines.length;
      expect(Number(e.id)).toBe(at);
    }
  });

  it("events of an ended job replay from ?from= and end; stderr and markers keep their flags", async () => {
    const id = randomUUID();
    await runner.logs.append(id, 0, [
      logEntry("out"),
      logEntry("err", true),
      {
        stored: [{ line: "x".repeat(10) }, { line: "[runner-depot] line cut", marker: true }].map((l) => ({
          stderr: false,
          ...l,
        })),
        stderr: false,
        bytes: 10,
      },
    ]);
    await runner.cancelJob(id);
    const events = await readEvents(await fetch(`${base}/api/jobs/${id}/events?from=1`), () => false);
    expect(linesOf(events)).toEqual([
      ["err", 1],
      ["xxxxxxxxxx", 0],
      ["[runner-depot] line cut", 2],
    ]);
    expect(events.at(-1)!.event).toBe("end");
  });

  it("line windows: from and limit, bounded, errors with their codes", async () => {
    const id = await job(30);
    const page = (await (await fetch(`${base}/api/jobs/${id}/lines?from=10&limit=5`)).json()) as {
      from: number;
      lines: Array<[string, number]>;
    };
    expect(page).toEqual({
      from: 10,
      lines: [
        ["line 11", 0],
        ["line 12", 1],
        ["line 13", 0],
        ["line 14", 0],
        ["line 15", 1],
      ],
    });
    for (const [query, status] of [
      ["from=-1", 400],
      ["limit=0", 400],
      ["limit=2001", 400],
      ["from=abc", 400],
    ] as const) {
      const response = await fetch(`${base}/api/jobs/${id}/lines?${query}`);
      expect(response.status, query).toBe(status);
      expect(((await response.json()) as { code: string }).code).toBe("INVALID_ARGUMENT");
    }
    expect((await fetch(`${base}/api/jobs/${randomUUID()}/lines`)).status).toBe(404);
    expect((await fetch(`${base}/api/jobs/not-a-uuid`)).status).toBe(400);
    expect((await fetch(`${base}/api/jobs/${id}/events`, { headers: { "last-event-id": "12x" } })).status).toBe(400);
  });

  it("raw download: the stored log as text, as an attachment", async () => {
    const id = await job(2500);
    const response = await fetch(`${base}/api/jobs/${id}/raw`);
    expect(response.headers.get("content-disposition")).toBe(`attachment; filename="job-${id}.log"`);
    expect(await response.text()).toBe(Array.from({ length: 2500 }, (_, i) => `line ${i + 1}\n`).join(""));
  });

  it("lines carry their time (third) and the server-time flag (4); ?timestamps=1 prefixes the raw log with RFC 3339", async () => {
    const id = randomUUID();
    const agent = 1_764_405_000_123.456; // 2025-11-29T08:30:00.123456Z
    await runner.logs.append(id, 0, [
      { stored: [{ line: "stamped", stderr: false, time: agent }], stderr: false, bytes: 7 },
      { stored: [{ line: "received", stderr: true, time: agent + 1.5, serverTime: true }], stderr: true, bytes: 8 },
      logEntry("untimed"),
    ]);
    await runner.cancelJob(id);
    const page = (await (await fetch(`${base}/api/jobs/${id}/lines`)).json()) as { lines: unknown[] };
    expect(page.lines).toEqual([
      ["stamped", 0, agent],
      ["received", 5, agent + 1.5],
      ["untimed", 0],
    ]);
    const events = await readEvents(await fetch(`${base}/api/jobs/${id}/events?from=0`), () => false);
    expect(linesOf(events)).toEqual(page.lines);
    const plain = await (await fetch(`${base}/api/jobs/${id}/raw`)).text();
    expect(plain).toBe("stamped\nreceived\nuntimed\n");
    const timed = await (await fetch(`${base}/api/jobs/${id}/raw?timestamps=1`)).text();
    expect(timed).toBe("2025-11-29T08:30:00.123456Z stamped\n2025-11-29T08:30:00.124956Z received\nuntimed\n");
    const bad = await fetch(`${base}/api/jobs/${id}/raw?timestamps=yes`);
    expect(bad.status).toBe(400);
    expect(((await bad.json()) as { code: string }).code).toBe("INVALID_ARGUMENT");
  });

  it("the job list filters by state and pages; a bad cursor is 400", async () => {
    const id = await job(0);
    const open = (await (await fetch(`${base}/api/jobs?status=open&limit=500`)).json()) as {
      jobs: Array<{ requestId: string; status: string }>;
    };
    expect(open.jobs.map((j) => j.requestId)).toContain(id);
    expect(open.jobs.every((j) => j.status === "open")).toBe(true);
    const first = (await (await fetch(`${base}/api/jobs?limit=1`)).json()) as { jobs: unknown[]; next: string };
    expect(first.jobs).toHaveLength(1);
    const second = (await (await fetch(`${base}/api/jobs?limit=1&cursor=${first.next}`)).json()) as { jobs: unknown[] };
    expect(second.jobs).not.toEqual(first.jobs);
    expect((await fetch(`${base}/api/jobs?cursor=%00`)).status).toBe(400);
    expect((await fetch(`${base}/api/jobs?status=running`)).status).toBe(400);
  });

  it("at most maxStreams event streams at once: the next one gets 503 until one closes", async () => {
    const id = await job(1);
    const open = await Promise.all([1, 2, 3].map(() => fetch(`${base}/api/jobs/${id}/events`)));
    expect(open.map((r) => r.status)).toEqual([200, 200, 200]);
    const over = await fetch(`${base}/api/jobs/${id}/events`);
    expect(over.status).toBe(503);
    await open[0]!.body!.cancel();
    let status = 503;
    // Until the server saw the stream close (up to 1,000 tries: 100 was thin under load).
    for (let i = 0; i < 1000 && status === 503; i++) {
      await new Promise((r) => setTimeout(r, 20));
      const again = await fetch(`${base}/api/jobs/${id}/events`);
      status = again.status;
      await again.body?.cancel();
    }
    expect(status).toBe(200);
    for (const r of open.slice(1)) await r.body!.cancel();
    await runner.cancelJob(id);
  });

  it("paths outside base are 404; every answer carries the security headers; assets cache by version", async () => {
    expect((await fetch(`${served.url}/ops/consolex`)).status).toBe(404);
    const page = await fetch(`${base}/`);
    expect(page.headers.get("content-security-policy")).toContain("script-src 'self'");
    expect(page.headers.get("x-frame-options")).toBe("DENY");
    const html = await page.text();
    const script = /src="([^"]+)"/.exec(html)![1]!;
    expect(script.startsWith("/ops/console/assets/console.js?v=")).toBe(true);
    expect((await fetch(`${served.url}${script}`)).headers.get("cache-control")).toContain("immutable");
    expect((await fetch(`${base}/assets/console.js`)).headers.get("cache-control")).toBe("no-cache");
    expect((await fetch(`${base}/api/jobs`, { method: "PUT" })).status).toBe(405);
    // Pages of their own for the nav's links; an unknown page (or Packages without a depot) is a 404 page, not JSON.
    const jobsPage = await fetch(`${base}/jobs`);
    expect(jobsPage.status).toBe(200);
    const jobsHtml = await jobsPage.text();
    expect(jobsHtml).toContain('data-page="jobs"');
    expect(jobsHtml).toContain('<a href="/ops/console/jobs">Jobs</a>');
    expect(jobsHtml).toContain('<a href="/ops/console/packages">Packages</a>');
    for (const missing of ["packages", "nope"]) {
      const answer = await fetch(`${base}/${missing}`);
      expect(answer.status, missing).toBe(404);
      expect(answer.headers.get("content-type"), missing).toMatch(/^text\/html/);
      expect(await answer.text(), missing).toContain("There is no such console page.");
    }
  });
});

describe("console over HTTP: access", () => {
  let runner: RunnerService;
  const served: Served[] = [];
  beforeAll(() => {
    runner = createRunnerService(createMemoryQueue());
  });
  afterAll(async () => {
    for (const s of served) await s.close();
    await runner.close();
  });
  async function start(options: ConsoleOptions): Promise<string> {
    const web = createConsole({ runner, ...options });
    const s = await serve((request) => web.fetch(request));
    served.push(s);
    return s.url;
  }

  it("host authorize: refused requests get 401; cancel needs the same origin and the page's CSRF token", async () => {
    const url = await start({
      authorize: (request, { action }) =>
        request.headers.get("x-user") === "ops" && (action === "read" || request.headers.get("x-role") === "admin"),
    });
    expect((await fetch(`${url}/api/jobs`)).status).toBe(401);
    const page = await (await fetch(`${url}/`, { headers: { "x-user": "ops" } })).text();
    const csrf = /name="csrf-token" content="([^"]+)"/.exec(page)![1]!;
    const id = randomUUID();
    await runner.expectJob(id);
    const cancel = (headers: Record<string, string>) =>
      fetch(`${url}/api/jobs/${id}/cancel`, {
        method: "POST",
        headers: { "x-user": "ops", "x-role": "admin", ...headers },
      });
    expect((await cancel({ "x-csrf-token": csrf })).status).toBe(403); // no Origin
    expect((await cancel({ origin: "http://127.0.0.1:1", "x-csrf-token": csrf })).status).toBe(403);
    expect((await cancel({ origin: url, "x-csrf-token": csrf.slice(1) + "A" })).status).toBe(403);
    expect(
      (
        await fetch(`${url}/api/jobs/${id}/cancel`, {
          method: "POST",
          headers: { "x-user": "ops", origin: url, "x-csrf-token": csrf },
        })
      ).status,
    ).toBe(403); // read-only user
    expect((await runner.logs.get(id))?.status).toBe("open");
    const ok = await cancel({ origin: url, "x-csrf-token": csrf });
    expect(ok.status).toBe(200);
    expect(await ok.json()).toMatchObject({ cancelled: true, result: { outcome: "cancelled" } });
    const again = await cancel({ origin: url, "x-csrf-token": csrf });
    expect(again.status).toBe(409);
    expect((await fetch(`${url}/api/jobs/${id}/cancel`, { headers: { "x-user": "ops" } })).status).toBe(405);
  });

  it("login URLs: each works once, sets the session cookie, and the session opens the API; an unknown token is 401", async () => {
    const sessions = createConsoleSessions();
    const url = await start({ sessions, base: "/c" });
    const token = sessions.loginToken();
    // A link preview's GETs show the sign-in page and spend nothing; the person's POST does.
    for (let i = 0; i < 2; i++) {
      const preview = await fetch(`${url}/c/jobs/${randomUUID()}?token=${token}`, { redirect: "manual" });
      expect(preview.status).toBe(200);
      expect(preview.headers.get("set-cookie")).toBeNull();
      expect(await preview.text()).toContain(`action="/c/login"`);
    }
    const login = await consoleLogin(`${url}/c/jobs/${randomUUID()}?token=${token}`);
    expect(login.status).toBe(303);
    expect(login.headers.get("location")).toMatch(/^\/c\/jobs\/[0-9a-f-]{36}$/);
    const setCookie = login.headers.get("set-cookie")!;
    expect(setCookie).toMatch(
      /^runner_depot_console=[A-Za-z0-9_-]{43}; Path=\/c\/; HttpOnly; SameSite=Strict; Max-Age=\d+$/,
    );
    const cookie = setCookie.split(";")[0]!;
    expect((await fetch(`${url}/c/api/jobs`, { headers: { cookie } })).status).toBe(200);
    expect((await consoleLogin(`${url}/c/?token=${token}`)).status).toBe(401);
    expect((await consoleLogin(`${url}/c/?token=${"A".repeat(43)}`)).status).toBe(401);
    // The form's POST only from the console's origin (login CSRF), only to a page under the console, bounded.
    const post = (body: string, origin = url) =>
      fetch(`${url}/c/login`, {
        method: "POST",
        redirect: "manual",
        headers: { origin, "content-type": "application/x-www-form-urlencoded" },
        body,
      });
    expect((await post(`token=${sessions.loginToken()}`, "http://evil.example")).status).toBe(403);
    const offsite = await post(`token=${sessions.loginToken()}&next=${encodeURIComponent("//evil.example/")}`);
    expect(offsite.headers.get("location")).toBe("/c/");
    expect((await post(`token=${"A".repeat(2000)}`)).status).toBe(413);
    expect((await fetch(`${url}/c/login`, { redirect: "manual" })).status).toBe(405);
    expect(
      (await fetch(`${url}/c/api/jobs`, { headers: { cookie: "runner_depot_console=" + "B".repeat(43) } })).status,
    ).toBe(401);
    // A token in an API URL is not a login.
    expect((await fetch(`${url}/c/api/jobs?token=${sessions.loginToken()}`)).status).toBe(401);
  });

  it("sessions are bounded: old login tokens and the least recently used sessions go first; expired ones fail", async () => {
    const sessions = createConsoleSessions({ maxLoginTokens: 2, maxSessions: 2, loginTtlMs: 60_000 });
    const [a, b, c] = [sessions.loginToken(), sessions.loginToken(), sessions.loginToken()];
    expect(sessions.redeem(a)).toBeNull();
    const s1 = sessions.redeem(b)!;
    const s2 = sessions.redeem(c)!;
    expect(sessions.session(s1.id)).not.toBeNull();
    const s3 = sessions.redeem(sessions.loginToken())!;
    // s2 was least recently used (s1 was just looked at).
    expect(sessions.session(s2.id)).toBeNull();
    expect(sessions.session(s1.id)?.csrf).toBe(s1.csrf);
    expect(sessions.session(s3.id)).not.toBeNull();
    const expired = createConsoleSessions({ loginTtlMs: -1 });
    expect(expired.redeem(expired.loginToken())).toBeNull();
    const idle = createConsoleSessions({ idleMs: -1 });
    expect(idle.session(idle.redeem(idle.loginToken())!.id)).toBeNull();
  });
});

describe("console over HTTP: packages", () => {
  let served: Served;
  let depotServed: Served;
  beforeAll(async () => {
    const depot = createPackageRouter(createMemoryStore(), { onError: () => undefined });
    depotServed = await serve((request) => depot.fetch(request));
    for (let i = 0; i < 12; i++) {
      const requires = i > 0 ? [{ type: "require" as const, requires: ["pkg-00@^1"] }] : [];
      const response = await publish(depotServed.url, `pkg-${String(i).padStart(2, "0")}@1.0.0`, [
        { type: "file", path: "f", body: `${i}` },
        ...requires,
      ]);
      expect(response.status).toBe(201);
    }
    // The console over the real depot, which pages in creation order (Link: rel="next")…
    const whole = createConsole({ depot, base: "/whole", dependantScan: 5, catalogPageSize: 3 });
    // …and the same depot behind a wrapper that pages it by name with its own Link cursors.
    const paged = createConsole({
      base: "/paged",
      depot: {
        async fetch(request) {
          const url = new URL(request.url);
          if (url.pathname !== "/catalog" || request.method !== "GET") return depot.fetch(request);
          // The whole catalog from the real depot (one page of up to 1,000), re-paged here by name.
          const body = (await (await depot.fetch(new Request(`${url.origin}/catalog`))).json()) as {
            packages: Record<string, unknown>;
          };
          const names = Object.keys(body.packages).sort();
          const after = url.searchParams.get("after") ?? "";
          const limit = 4;
          const slice = names.filter((n) => n > after).slice(0, limit);
          const headers = new Headers({ "content-type": "application/json" });
          if (names.filter((n) => n > after).length > limit)
            headers.set("link", `</catalog?after=${slice.at(-1)}&limit=${limit}>; rel="next"`);
          return new Response(
            JSON.stringify({ packages: Object.fromEntries(slice.map((n) => [n, body.packages[n]])) }),
            { headers },
          );
        },
      },
    });
    served = await serve((request) =>
      new URL(request.url).pathname.startsWith("/whole") ? whole.fetch(request) : paged.fetch(request),
    );
  });
  afterAll(async () => {
    await served.close();
    await depotServed.close();
  });

  async function walk(prefix: string, query: string): Promise<string[]> {
    const names: string[] = [];
    let cursor = "";
    for (let guard = 0; guard < 50; guard++) {
      const response = await fetch(`${served.url}${prefix}/api/packages?${query}${cursor ? `&cursor=${cursor}` : ""}`);
      const page = (await response.json()) as { packages: Array<{ name: string }>; next: string | null };
      expect(response.status, JSON.stringify(page)).toBe(200);
      names.push(...page.packages.map((p) => p.name));
      if (!page.next) break;
      cursor = page.next;
    }
    return names;
  }

  it("the catalog pages over depots that page differently: every package once, in order; a filter keeps only matches", async () => {
    const all = Array.from({ length: 12 }, (_, i) => `pkg-${String(i).padStart(2, "0")}`);
    expect(await walk("/whole", "limit=5")).toEqual(all);
    expect(await walk("/paged", "limit=5")).toEqual(all);
    expect(await walk("/paged", "limit=3&q=pkg-1")).toEqual(["pkg-10", "pkg-11"]);
    expect(await walk("/whole", "limit=50&q=PKG-0")).toEqual(all.slice(0, 10));
    expect((await fetch(`${served.url}/whole/api/packages?cursor=!!`)).status).toBe(400);
    // The Packages page the nav links to (issue 29: it was a raw JSON 404).
    const page = await fetch(`${served.url}/whole/packages`);
    expect(page.status).toBe(200);
    expect(await page.text()).toContain('data-page="packages"');
  });

  it("a package: versions, dependants (a bounded scan, said so), a version's files; unknown ones 404", async () => {
    const pkg = (await (await fetch(`${served.url}/paged/api/packages/pkg-00`)).json()) as {
      latest: string;
      dependants: string[];
      dependantsComplete: boolean;
    };
    expect(pkg.latest).toBe("1.0.0");
    expect(pkg.dependants).toEqual(Array.from({ length: 11 }, (_, i) => `pkg-${String(i + 1).padStart(2, "0")}`));
    expect(pkg.dependantsComplete).toBe(true);
    const bounded = (await (await fetch(`${served.url}/whole/api/packages/pkg-00`)).json()) as {
      dependants: string[];
      dependantsComplete: boolean;
    };
    expect(bounded.dependantsComplete).toBe(false);
    expect(bounded.dependants.length).toBeLessThan(11);
    const version = (await (await fetch(`${served.url}/whole/api/packages/pkg-03/1.0.0`)).json()) as {
      requires: unknown[];
      items: unknown[];
    };
    expect(version.requires).toEqual([{ name: "pkg-00", range: "^1" }]);
    expect(version.items).toEqual([{ type: "file", path: "f", mode: 420, size: 1 }]);
    expect((await fetch(`${served.url}/whole/api/packages/nope`)).status).toBe(404);
    expect((await fetch(`${served.url}/whole/api/packages/pkg-03/9.9.9`)).status).toBe(404);
    expect((await fetch(`${served.url}/whole/api/packages/bad%20name`)).status).toBe(400);
  });
});
