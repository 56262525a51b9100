/**
 * Log search (issue 24, item 3) through real servers and a real browser: a job streams 300,000 lines through the
 * agent's client over gRPC into a runner service on the fs log store with an fs archive; a string that occurs on 3
 * of them is found on exactly those 3 lines — by the console's search endpoint, the control API's, and the
 * console's search box in chromium, which jumps to each match (loading only the window around it) and marks it —
 * on a live job and on an archived one.
 */
import { mkdtemp, rm } from "node:fs/promises";
import type http from "node:http";
import os from "node:os";
import path from "node:path";
import { randomUUID } from "node:crypto";
import type { Browser, Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  chromiumMissing,
  closeConsoleStack,
  launchChromium,
  signedInPage,
  startConsole,
} from "../fixtures/chromium.js";
import { createFsLogArchive, createFsLogStore } from "../../src/adapters/fs/index.js";
import { createControlApi } from "../../src/cli/serve/control.js";
import { servePackageRouter } from "../../src/depot/server/serve.js";
import type { ConsoleSessions } from "../../src/console/index.js";
import { createArchivingLogStore } from "../../src/runner/archive/archiving-store.js";
import { createRunnerClient, type RunnerServer, type RunnerService } from "../../src/runner/index.js";
import { SCAN_LINES, type LogSearchPage } from "../../src/runner/service/log-search.js";
import { until } from "../fixtures/runner-service.js";

/** Lines of each job: more than one request scans on the read path (SCAN_LINES). */
const LINES = 300_000;
/** The 0-based positions of the 3 lines holding the needle. */
const HITS = [1_234, 150_000, 299_990];
const NEEDLE = "Needle-XYZ";

/** Line `i` (0-based): near misses everywhere ("needle-xy" and a digit), the needle on the HITS lines. */
function lineText(i: number): string {
  return HITS.includes(i) ? `FAILED: ${NEEDLE} at step ${i}` : `step ${i} compiling needle-xy${i % 10} module`;
}

describe("log search through real servers and chromium", () => {
  let dir: string;
  let runner: RunnerService;
  let runnerServer: RunnerServer;
  let sessions: ConsoleSessions;
  let httpServer: http.Server;
  let control: { url: string; close(): Promise<void> };
  let origin: string;
  let browser: Browser;
  let page: Page;
  const live = randomUUID();
  const archived = randomUUID();
  const windowRequests: string[] = [];

  async function stream(id: string, end: boolean): Promise<void> {
    await runner.expectJob(id, { repoUrl: "https://git.example/search.git", commitSha: "5ea4c4" });
    const client = createRunnerClient({ endpoint: runnerServer.url, requestId: id });
    for (let i = 0; i < LINES; i++) if (!client.log(lineText(i), i % 7 === 0)) await client.drained();
    if (end) await client.end({ exitCode: 1, success: false });
    else await client.flush();
    await client.close();
    await until(async () => (await runner.logs.get(id))?.storedLines === LINES, "all lines stored");
  }

  beforeAll(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), "console-search-"));
    const logs = createArchivingLogStore(createFsLogStore(path.join(dir, "live"), { fsync: false }), {
      archive: createFsLogArchive(path.join(dir, "archive"), { fsync: false }),
    });
    ({ runner, runnerServer, sessions, httpServer, origin } = await startConsole({ logs }));
    const api = createControlApi({
      runner,
      logs: runner.logs,
      secret: "s".repeat(32),
      adminToken: "admin",
      runnerUrl: "http://127.0.0.1:1",
    });
    control = await servePackageRouter({ isOpen: false, fetch: api }, { host: "127.0.0.1", port: 0 });

    await stream(live, false);
    await stream(archived, true);
    await until(async () => (await runner.logs.get(archived))?.archived !== undefined, "the ended job archived");
    expect((await runner.logs.get(live))?.status).toBe("open");

    if (chromiumMissing) return;
    browser = await launchChromium();
    page = await signedInPage(browser, origin, sessions);
    page.on("request", (request) => {
      if (/\/api\/jobs\/[^/]+\/lines/.test(request.url())) windowRequests.push(request.url());
    });
  }, 300_000);

  afterAll(async () => {
    await control?.close();
    await closeConsoleStack({ browser, httpServer, runnerServer, runner });
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  /** Every match of a search, page by page, through `get` (a console or control API fetch). */
  async function allMatches(
    get: (query: string) => Promise<LogSearchPage>,
    q: string,
    extra = "",
    start = 0,
  ): Promise<LogSearchPage["matches"]> {
    const out: LogSearchPage["matches"] = [];
    let requests = 0;
    for (let from = start; ; requests++) {
      const result = await get(`q=${encodeURIComponent(q)}${extra}&from=${from}&limit=2`);
      out.push(...result.matches);
      if (result.end) break;
      expect(result.next).toBeGreaterThan(from);
      from = result.next;
    }
    expect(requests).toBeGreaterThan(0);
    return out;
  }

  const viaControl = (id: string) => async (query: string) => {
    const response = await fetch(`${control.url}/-/jobs/${id}/search?${query}`, {
      headers: { authorization: "Bearer admin" },
    });
    expect(response.status).toBe(200);
    return (await response.json()) as LogSearchPage;
  };
  const viaConsole = (id: string) => async (query: string) => {
    const response = await fetch(`${origin}/-/console/api/jobs/${id}/search?${query}`, {
      headers: { cookie: await sessionCookie() },
    });
    expect(response.status).toBe(200);
    return (await response.json()) as LogSearchPage;
  };
  async function sessionCookie(): Promise<string> {
    const cookies = await page.context().cookies();
    return cookies.map((c) => `${c.name}=${c.value}`).join("; ");
  }

  for (const [name, id] of [
    ["live", () => live],
    ["archived", () => archived],
  ] as const) {
    it(`finds the 3 lines of the ${name} job, and only them, through the control API and the console (every mode)`, async () => {
      for (const [query, extra] of [
        [NEEDLE, "&case=1"],
        [NEEDLE.toLowerCase(), ""],
        ["need?le-x[y]z", "&regex=1"],
        ["Needle-X.Z at", "&regex=1&case=1"],
      ] as const) {
        const matches = await allMatches(viaControl(id()), query, extra);
        expect(
          matches.map((m) => m.position),
          `${query}${extra}`,
        ).toEqual(HITS);
        for (const m of matches) {
          expect(m.line).toBe(lineText(m.position));
          expect(m.ranges).toEqual([[8, 8 + NEEDLE.length + (query.endsWith(" at") ? 3 : 0)]]);
        }
      }
      // The console's endpoint (signed in through the browser) answers the same, from any cursor.
      if (!chromiumMissing) {
        const rest = await allMatches(viaConsole(id()), NEEDLE, "&case=1", HITS[0]! + 1);
        expect(rest.map((m) => m.position)).toEqual(HITS.slice(1));
      }
      // One request on the read path (an expression, or any archived search) scans at most SCAN_LINES lines, fewer
      // once it has matched for MATCH_MS (how many depends on the machine): the client goes on from `next`. The fs
      // fast path (a literal on the live job) scans the 9 MB in 4 MiB calls, well within MATCH_MS.
      for (const query of [`q=nothing-like-this&regex=1`, ...(name === "live" ? [] : [`q=nothing-like-this`])]) {
        const page = await viaControl(id())(query);
        expect(page, query).toMatchObject({ matches: [], end: false, storedLines: LINES });
        expect(page.next).toBeGreaterThan(0);
        expect(page.next).toBeLessThanOrEqual(SCAN_LINES);
        expect(page.scanned).toBe(page.next);
      }
      if (name === "live")
        expect(await viaControl(id())(`q=nothing-like-this`)).toMatchObject({ next: LINES, end: true });
    }, 120_000);
  }

  it("refuses what it must before searching: an over-long pattern, a bad expression, a bad flag, an unknown job", async () => {
    const problems: Array<[string, string, number, string]> = [
      [live, `q=${"x".repeat(1025)}`, 400, "invalid-argument"],
      [live, "q=", 400, "invalid-argument"],
      [live, `q=${encodeURIComponent("(a)\\1")}&regex=1`, 400, "invalid-argument"],
      [live, "q=x&case=yes", 400, "invalid-argument"],
      [live, "q=x&limit=1001", 400, "invalid-argument"],
      [randomUUID(), "q=x", 404, "not-found"],
    ];
    for (const [id, query, status, type] of problems) {
      const response = await fetch(`${control.url}/-/jobs/${id}/search?${query}`, {
        headers: { authorization: "Bearer admin" },
      });
      expect(response.status, query).toBe(status);
      expect(((await response.json()) as { type: string }).type).toContain(type);
    }
    const anonymous = await fetch(`${control.url}/-/jobs/${live}/search?q=x`);
    expect(anonymous.status).toBe(401);
  });

  /** The search box's state, once no request is under way. */
  async function searchState(): Promise<{ found: string; current: string; end: string; status: string }> {
    return page.$eval("#log-search", (form) => ({
      found: (form as HTMLElement).dataset.found ?? "",
      current: (form as HTMLElement).dataset.current ?? "",
      end: (form as HTMLElement).dataset.end ?? "",
      status: form.querySelector("#search-status")?.textContent ?? "",
    }));
  }

  /** Waits until line `number` (1-based) is drawn with its current match marked; the marks' texts. */
  async function currentMatchAt(number: number): Promise<string[]> {
    await page.waitForFunction(
      (n) => document.querySelector(`#log .row[data-line="${n}"] mark.hit.current`) !== null,
      number,
      { timeout: 30_000 },
    );
    return page.$$eval(`#log .row[data-line="${number}"] mark.hit`, (els) => els.map((e) => e.textContent ?? ""));
  }

  for (const [name, id, matchCase] of [
    ["live", () => live, false],
    ["archived", () => archived, true],
  ] as const) {
    it(`the console's search box on the ${name} job jumps to each of the 3 matches, marks it, and loads only the window around it`, async ({
      skip,
    }) => {
      skip(chromiumMissing !== null, chromiumMissing ?? "");
      await page.goto(`${origin}/-/console/jobs/${id()}`);
      await page.waitForFunction((n) => document.getElementById("log")?.dataset.lines === String(n), LINES, {
        timeout: 60_000,
      });
      if (matchCase) await page.locator("#search-case").check();
      await page.locator("#search-q").fill(matchCase ? NEEDLE : NEEDLE.toLowerCase());
      const before = windowRequests.length;
      await page.locator("#search-q").press("Enter");
      expect(await currentMatchAt(HITS[0]! + 1)).toEqual([NEEDLE]);
      await page.waitForFunction(() => document.getElementById("log-search")?.dataset.end === "true", undefined, {
        timeout: 30_000,
      });
      expect(await searchState()).toMatchObject({ found: "3", current: String(HITS[0]! + 1) });
      expect((await searchState()).status).toBe(`Match 1 of 3 (line ${HITS[0]! + 1})`);
      // Next, next, then around to the first; back once to the last.
      for (const [k, hit] of [HITS[1]!, HITS[2]!, HITS[0]!].entries()) {
        await page.locator("#search-next").click();
        expect(await currentMatchAt(hit + 1)).toEqual([NEEDLE]);
        expect((await searchState()).status).toBe(`Match ${[2, 3, 1][k]} of 3 (line ${hit + 1})`);
      }
      await page.locator("#search-prev").click();
      expect(await currentMatchAt(HITS[2]! + 1)).toEqual([NEEDLE]);
      // Only the match's line is marked: no other row on screen holds a mark.
      const marked = await page.$$eval("#log .row:has(mark.hit)", (rows) =>
        rows.map((r) => (r as HTMLElement).dataset.line),
      );
      expect(marked).toEqual([String(HITS[2]! + 1)]);
      // Five jumps cost a window or two each (500-line chunks), never the 600 chunks of the log.
      const fetched = windowRequests.slice(before);
      expect(fetched.length).toBeLessThanOrEqual(5 * 2 + 2);
      for (const url of fetched) expect(new URL(url).searchParams.get("limit")).toBe("500");
    }, 120_000);
  }
});
