/**
 * The web console in a real browser (Debian's chromium driven by playwright-core), against
 * a real runner server fed by the real runner client (the agent's side) and a real depot
 * on the same HTTP server, mounted as `serve` mounts it (`/-/console/`, one-time login).
 *
 * Proves: the login URL works once and everything refuses requests without the session;
 * a running job's lines appear live in order, survive a reload and a dropped connection
 * with no gap and no duplicate; ANSI colours render as styled spans; cancel ends the job
 * `cancelled`; a package page lists versions, files and dependencies with working links;
 * axe-core finds no serious violation. CONSOLE_SCREENSHOTS=1 also writes docs/console-*.png.
 * Without chromium every test is skipped with the reason (test/fixtures/chromium.ts).
 */
import { readFileSync } from "node:fs";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { randomUUID } from "node:crypto";
import { fileURLToPath } from "node:url";
import type { Browser, BrowserContext, Page } from "playwright-core";
import { toNodeHandler } from "srvx/node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { chromiumMissing, closeConsoleStack, launchChromium } from "../fixtures/chromium.js";
import { createMemoryQueue, createMemoryStore, type MemoryQueue } from "../../src/adapters/memory/index.js";
import { createConsole, createConsoleSessions, type ConsoleSessions } from "../../src/console/index.js";
import { createPackageRouter } from "../../src/depot/index.js";
import {
  createRunnerClient,
  createRunnerService,
  startRunnerServer,
  type RunnerClient,
  type RunnerServer,
  type RunnerService,
} from "../../src/runner/index.js";
import { publish } from "../fixtures/depot.js";

const ROOT = fileURLToPath(new URL("../..", import.meta.url));
const AXE = readFileSync(join(ROOT, "node_modules/axe-core/axe.min.js"), "utf8");

describe("web console in chromium", () => {
  let browser: Browser;
  let context: BrowserContext;
  let page: Page;
  let runner: RunnerService;
  let runnerServer: RunnerServer;
  let queue: MemoryQueue;
  let sessions: ConsoleSessions;
  let httpServer: http.Server;
  let origin: string;
  const consoleUrl = () => `${origin}/-/console`;

  beforeAll(async () => {
    if (chromiumMissing) return;
    queue = createMemoryQueue();
    runner = createRunnerService(queue);
    runnerServer = await startRunnerServer(runner, { host: "127.0.0.1", port: 0 });
    const depot = createPackageRouter(createMemoryStore(), { onError: () => undefined });
    sessions = createConsoleSessions();
    const webConsole = createConsole({ runner, depot, sessions, base: "/-/console" });
    const handler = toNodeHandler((request: Request) =>
      new URL(request.url).pathname.startsWith("/-/console") ? webConsole.fetch(request) : depot.fetch(request),
    ) as unknown as http.RequestListener;
    httpServer = http.createServer(handler);
    await new Promise<void>((resolve) => httpServer.listen(0, "127.0.0.1", resolve));
    origin = `http://127.0.0.1:${(httpServer.address() as AddressInfo).port}`;

    // Packages: app@1.0.0 and app@1.1.0 (files, a link, a licence) requiring lib, which requires nothing.
    for (const [spec, additions] of [
      ["lib@2.0.0", [{ type: "file" as const, path: "lib/liblib.so", body: "ELF" }]],
      [
        "app@1.0.0",
        [
          { type: "file" as const, path: "bin/app", body: "#!/bin/sh\necho 1\n", mode: "0755" },
          { type: "require" as const, requires: ["lib@^2"] },
        ],
      ],
      [
        "app@1.1.0",
        [
          { type: "file" as const, path: "bin/app", body: "#!/bin/sh\necho 1.1\n", mode: "0755" },
          { type: "dir" as const, path: "share", mode: "0755" },
          { type: "link" as const, path: "bin/app-latest", target: "app" },
          { type: "license" as const, name: "MIT", body: "MIT License" },
          { type: "set" as const, attrs: { description: "The demo app" } },
          { type: "require" as const, requires: ["lib@^2"] },
        ],
      ],
    ] as const) {
      const response = await publish(origin, spec, additions as never);
      expect(response.status, spec).toBe(201);
    }

    browser = await launchChromium();
    context = await browser.newContext({ viewport: { width: 1100, height: 800 } });
    page = await context.newPage();
    page.on("pageerror", (error) => console.error("page error:", error));
  });

  afterAll(async () => {
    if (chromiumMissing) return;
    await closeConsoleStack({ browser, httpServer, runnerServer, runner });
  });

  it("the login URL works once, sets an HttpOnly SameSite=Strict cookie, and nothing works without the session", async ({
    skip,
  }) => {
    skip(chromiumMissing !== null, chromiumMissing ?? "");
    // Without a session: pages ask to sign in, the API answers 401.
    expect((await fetch(`${consoleUrl()}/`)).status).toBe(401);
    const api = await fetch(`${consoleUrl()}/api/jobs`);
    expect(api.status).toBe(401);
    expect(((await api.json()) as { code: string }).code).toBe("UNAUTHENTICATED");

    const token = sessions.loginToken();
    // The login URL shows a "Sign in" button (a link preview's GET spends nothing); pressing it signs in.
    expect((await page.goto(`${consoleUrl()}/?token=${token}`))?.status()).toBe(200);
    const [response] = await Promise.all([
      page.waitForNavigation(),
      page.getByRole("button", { name: "Sign in" }).click(),
    ]);
    // Redirected to the bare URL: the token is gone from the address bar and history.
    expect(page.url()).toBe(`${consoleUrl()}/`);
    expect(response?.status()).toBe(200);
    const cookies = await context.cookies();
    expect(cookies).toHaveLength(1);
    expect(cookies[0]).toMatchObject({ httpOnly: true, sameSite: "Strict", path: "/-/console/" });
    await page.getByRole("heading", { name: "Jobs" }).waitFor();

    // The same token again, in a fresh browser context: refused.
    const other = await browser.newContext();
    const otherPage = await other.newPage();
    await otherPage.goto(`${consoleUrl()}/?token=${token}`);
    const [again] = await Promise.all([
      otherPage.waitForNavigation(),
      otherPage.getByRole("button", { name: "Sign in" }).click(),
    ]);
    expect(again?.status()).toBe(401);
    expect(await other.cookies()).toHaveLength(0);
    await other.close();

    // Cancel without the page's CSRF token, or from another origin: refused even with the cookie.
    const id = randomUUID();
    await runner.expectJob(id);
    const cookie = `${cookies[0]!.name}=${cookies[0]!.value}`;
    const noToken = await fetch(`${consoleUrl()}/api/jobs/${id}/cancel`, {
      method: "POST",
      headers: { cookie, origin },
    });
    expect(noToken.status).toBe(403);
    const csrf = await page.locator('meta[name="csrf-token"]').getAttribute("content");
    const crossSite = await fetch(`${consoleUrl()}/api/jobs/${id}/cancel`, {
      method: "POST",
      headers: { cookie, origin: "http://evil.example", "x-csrf-token": csrf! },
    });
    expect(crossSite.status).toBe(403);
    expect((await runner.logs.get(id))?.status).toBe("open");
    await runner.cancelJob(id);
  });

  /** Opens a session in the browser context (each test can run alone). */
  async function signedIn(): Promise<void> {
    if ((await context.cookies()).length > 0) return;
    await page.goto(`${consoleUrl()}/?token=${sessions.loginToken()}`);
    await Promise.all([page.waitForNavigation(), page.getByRole("button", { name: "Sign in" }).click()]);
    expect(page.url()).toBe(`${consoleUrl()}/`);
  }

  /** Rows the viewer shows: line number → [text, stderr]. */
  async function rows(): Promise<Array<{ n: number; text: string; err: boolean; pending: boolean }>> {
    return page.$$eval("#log .row", (els) =>
      els.map((el) => ({
        n: Number((el as HTMLElement).dataset.line),
        text: el.querySelector(".text")?.textContent ?? "",
        err: el.classList.contains("err"),
        pending: el.classList.contains("pending"),
      })),
    );
  }

  /** Waits until the viewer knows `count` lines and shows the last one. */
  async function waitForLines(count: number): Promise<void> {
    await page
      .waitForFunction(
        (n) => {
          const log = document.getElementById("log");
          const last = log?.querySelector(".row:last-child") as HTMLElement | null;
          return (
            log?.dataset.lines === String(n) && last?.dataset.line === String(n) && !log.querySelector(".row.pending")
          );
        },
        count,
        { timeout: 15_000 },
      )
      .catch(async (error: unknown) => {
        const state = await page.evaluate(() => ({
          ...document.getElementById("log")?.dataset,
          status: document.querySelector(".status")?.textContent,
        }));
        throw new Error(
          `waiting for ${count} lines: ${JSON.stringify(state)} rows ${JSON.stringify((await rows()).slice(-3))}`,
          { cause: error },
        );
      });
  }

  /** Scrolls the whole log through the viewer and returns every line it showed, in order. */
  async function everyLine(): Promise<Map<number, { text: string; err: boolean }>> {
    const seen = new Map<number, { text: string; err: boolean }>();
    const total = Number(await page.locator("#log").getAttribute("data-lines"));
    for (let top = 0; ; top += 400) {
      await page.evaluate((y) => (document.getElementById("log")!.scrollTop = y), top);
      await page.waitForFunction(
        () => !document.querySelector("#log .row.pending") && document.querySelectorAll("#log .row").length > 0,
      );
      await page.evaluate(() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r))));
      for (const row of await rows()) seen.set(row.n, { text: row.text, err: row.err });
      if (seen.has(total)) break;
      if (top > total * 20 + 1000) break;
    }
    return seen;
  }

  it("a running job's lines appear live in order, survive a reload and a dropped connection, render ANSI; cancel ends it cancelled", async ({
    skip,
  }) => {
    skip(chromiumMissing !== null, chromiumMissing ?? "");
    await signedIn();
    const id = randomUUID();
    await runner.expectJob(id, {
      repoUrl: "https://git.example/team/app.git",
      commitSha: "0123456789abcdef0123456789abcdef01234567",
    });
    const client: RunnerClient = createRunnerClient({ endpoint: runnerServer.url, requestId: id, maxCallMs: 50 });
    const expected: Array<{ text: string; err: boolean }> = [];
    const send = async (count: number) => {
      for (let i = 0; i < count; i++) {
        const n = expected.length + 1;
        const err = n % 7 === 0;
        const text =
          n === 3
            ? "\u001b[1;31merror:\u001b[0m \u001b[32mcompiled\u001b[0m 3"
            : n === 5
              ? "progress 10%\rprogress 100%"
              : `step ${n}${err ? " (stderr)" : ""}`;
        client.log(text, err);
        expected.push({ text: n === 5 ? "progress 100%" : n === 3 ? "error: compiled 3" : text, err });
      }
      await client.flush();
    };

    await send(20);
    await page.goto(`${consoleUrl()}/jobs/${id}`);
    await waitForLines(20);
    // Live: lines sent after the page opened arrive over the event stream.
    await send(30);
    await waitForLines(50);
    expect(await page.locator("#log").getAttribute("data-stream")).toBe("open");

    // ANSI: styled spans, bold red then green; the progress line collapsed to its last state.
    await page.evaluate(() => (document.getElementById("log")!.scrollTop = 0));
    const red = page.locator('#log .row[data-line="3"] span.a-b.a-f1');
    await red.waitFor();
    expect(await red.textContent()).toBe("error:");
    expect(await red.evaluate((el) => getComputedStyle(el).color)).toBe("rgb(255, 123, 114)");
    expect(await red.evaluate((el) => getComputedStyle(el).fontWeight)).toBe("700");
    expect(await page.locator('#log .row[data-line="3"] span.a-f2').textContent()).toBe("compiled");
    expect(await page.locator('#log .row[data-line="5"] .text').textContent()).toBe("progress 100%");
    // Line numbers link to their line.
    expect(await page.locator('#log .row[data-line="5"] a.ln').getAttribute("href")).toBe("#L5");

    // A reload replays the stored log, then follows again.
    await page.reload();
    await waitForLines(50);
    await send(25);
    await waitForLines(75);

    // A dropped connection: the server cuts every socket; EventSource reconnects with
    // Last-Event-ID and the stream continues exactly where it stopped.
    httpServer.closeAllConnections();
    await send(25);
    await waitForLines(100);
    expect(await page.locator("#log").getAttribute("data-stream-errors")).toBe("0");

    const shown = await everyLine();
    expect(shown.size).toBe(100);
    for (let n = 1; n <= 100; n++) expect(shown.get(n), `line ${n}`).toEqual(expected[n - 1]);
    // Never all lines in the DOM: only the rows on screen.
    expect((await rows()).length).toBeLessThan(60);

    if (process.env.CONSOLE_SCREENSHOTS === "1") {
      // The running job, from its first line.
      await page.evaluate(() => (document.getElementById("log")!.scrollTop = 0));
      await page.waitForFunction(() => !document.querySelector("#log .row.pending"));
      await page.screenshot({ path: join(ROOT, "docs/console-job.png"), fullPage: true });
      await page.evaluate(() => (document.getElementById("log")!.scrollTop = 1e9));
    }

    // Cancel: the job ends with outcome cancelled, on the page and on the queue.
    await page.getByRole("button", { name: "Cancel job" }).click();
    await page.waitForFunction(() => document.getElementById("log")?.dataset.stream === "ended");
    await page.getByText("Ended (cancelled").waitFor();
    await page.getByRole("button", { name: "Cancel job" }).waitFor({ state: "hidden" });
    expect(queue.results.find((r) => r.requestId === id)).toMatchObject({ outcome: "cancelled", exitCode: -1 });
    // The agent learns it at its next call: the orchestrator answers ok = false, reason cancelled.
    client.log("after the cancel");
    expect((await client.stopped).reason).toBe("cancelled");
    await client.close();
  });

  it("each line shows its time: the wall clock, or since the job started once switched; a server time is marked", async ({
    skip,
  }) => {
    skip(chromiumMissing !== null, chromiumMissing ?? "");
    // A context in UTC, so the wall clock reads the same on any machine.
    const utc = await browser.newContext({ viewport: { width: 1100, height: 800 }, timezoneId: "UTC" });
    const tab = await utc.newPage();
    await tab.goto(`${consoleUrl()}/?token=${sessions.loginToken()}`);
    await Promise.all([tab.waitForNavigation(), tab.getByRole("button", { name: "Sign in" }).click()]);
    const id = randomUUID();
    const start = Date.parse("2026-11-29T08:00:00.000Z");
    // The job starts (its first item) at `start`; the lines' own times come from the agent, one from the server.
    await runner.logs.append(
      id,
      0,
      [
        { stored: [{ line: "first", stderr: false, time: start + 250.5 }], stderr: false, bytes: 5 },
        { stored: [{ line: "a minute on", stderr: false, time: start + 61_500 }], stderr: false, bytes: 11 },
        {
          stored: [{ line: "an hour on", stderr: true, time: start + 3_723_004, serverTime: true }],
          stderr: true,
          bytes: 10,
        },
      ],
      new Date(start),
    );
    await runner.cancelJob(id);
    await tab.goto(`${consoleUrl()}/jobs/${id}`);
    const times = () =>
      tab.$$eval("#log .row", (els) =>
        els.map((el) => {
          const ts = el.querySelector(".ts") as HTMLElement;
          return [ts.textContent, ts.classList.contains("server")];
        }),
      );
    await tab.locator('#log .row[data-line="3"] .ts').waitFor();
    expect(await times()).toEqual([
      ["08:00:00.250", false],
      ["08:01:01.500", false],
      ["09:02:03.004", true],
    ]);
    expect(await tab.locator('#log .row[data-line="1"] .ts').getAttribute("title")).toBe("2026-11-29T08:00:00.250500Z");
    expect(await tab.locator('#log .row[data-line="3"] .ts').getAttribute("title")).toMatch(/received by the server/);
    await tab.getByLabel("Times:").selectOption("since");
    await tab.waitForFunction(
      () => document.querySelector('#log .row[data-line="1"] .ts')?.textContent === "+0:00.251",
    );
    expect(await times()).toEqual([
      ["+0:00.251", false],
      ["+1:01.500", false],
      ["+1:02:03.004", true],
    ]);
    await utc.close();
  });

  it("a package page lists versions, files with modes and link targets, licences and dependencies with working links", async ({
    skip,
  }) => {
    skip(chromiumMissing !== null, chromiumMissing ?? "");
    await signedIn();
    await page.goto(`${consoleUrl()}/packages/app`);
    await page.locator("#versions").waitFor();
    const versions = await page.locator("#versions tbody tr td:first-child").allTextContents();
    expect(versions).toEqual(["1.1.0", "1.0.0"]);
    const files = await page
      .locator("#files tbody tr")
      .evaluateAll((trs) => trs.map((tr) => [...tr.querySelectorAll("td")].map((td) => td.textContent)));
    expect(files).toContainEqual(["file", "bin/app", "-rwxr-xr-x (0755)", "19 B", ""]);
    expect(files).toContainEqual(["link", "bin/app-latest", "lrwxrwxrwx (0777)", "—", "→ app"]);
    expect(files).toContainEqual(["dir", "share", "drwxr-xr-x (0755)", "—", ""]);
    await page.getByText("The demo app", { exact: true }).waitFor();
    expect(await page.locator("dd", { hasText: "MIT" }).count()).toBe(1);
    const install = await page.locator(".install code").first().textContent();
    expect(install).toBe(`runner-depot install app@1.1.0 ./packages --url ${origin}`);

    // Another version through its link.
    await page.getByRole("link", { name: "1.0.0" }).click();
    await page.waitForURL(/version=1\.0\.0/);
    await page.locator("#files").waitFor();
    expect(await page.locator("#files tbody tr").count()).toBe(1);

    if (process.env.CONSOLE_SCREENSHOTS === "1") {
      await page.goto(`${consoleUrl()}/packages/app`);
      await page.locator("#files").waitFor();
      await page.screenshot({ path: join(ROOT, "docs/console-package.png"), fullPage: true });
    }

    // The dependency is a link to its page, which lists app as a dependant.
    await page.locator("#dependencies").getByRole("link", { name: "lib" }).click();
    await page.waitForURL(`${consoleUrl()}/packages/lib`);
    await page.locator("#dependants").waitFor();
    expect(await page.locator("#dependants a").allTextContents()).toEqual(["app"]);
    await page.locator("#dependants").getByRole("link", { name: "app" }).click();
    await page.waitForURL(`${consoleUrl()}/packages/app`);

    // The catalog on the home page, filtered by name.
    await page.goto(`${consoleUrl()}/`);
    await page.getByLabel("Filter by name").fill("li");
    await page.waitForFunction(
      () => [...document.querySelectorAll("#packages tbody a")].map((a) => a.textContent).join() === "lib",
    );
  });

  it("a package page shows yanked versions with their reason, as text, in the list and on the version", async ({
    skip,
  }) => {
    skip(chromiumMissing !== null, chromiumMissing ?? "");
    for (const v of ["1.0.0", "1.1.0"])
      expect((await publish(origin, `yk@${v}`, [{ type: "file", path: "f", body: v }])).status).toBe(201);
    const reason = "breaks <b>TLS</b> on arm64 — use 1.0.0";
    const yank = await fetch(`${origin}/yank/yk@1.1.0`, {
      method: "POST",
      headers: { "Pkg-Reason": encodeURIComponent(reason) },
    });
    expect(yank.status).toBe(200);
    await signedIn();
    await page.goto(`${consoleUrl()}/packages/yk?version=1.1.0`);
    await page.locator("#versions").waitFor();
    // The yanked row is marked, with the reason as text (the markup stays literal); the other is not.
    const row = page.locator('#versions tr[data-version="1.1.0"]');
    expect(await row.getAttribute("class")).toBe("yanked");
    expect(await row.locator(".yank-badge").textContent()).toBe("yanked");
    expect(await row.locator(".yank-reason").textContent()).toBe(reason);
    expect(await row.locator("b").count()).toBe(0);
    expect(await page.locator('#versions tr[data-version="1.0.0"] .yank-badge').count()).toBe(0);
    // The selected version's summary says it is yanked and why; latest skips it.
    expect(await page.locator("#yanked").textContent()).toBe(reason);
    expect(
      await page.locator("dt", { hasText: "Latest" }).locator("xpath=following-sibling::dd[1]").textContent(),
    ).toBe("1.0.0");
    // The version that is not yanked has no such line.
    await page.goto(`${consoleUrl()}/packages/yk?version=1.0.0`);
    await page.locator("#versions").waitFor();
    expect(await page.locator("#yanked").count()).toBe(0);
  });

  it("axe-core finds no serious or critical violation on the home, job and package pages, at desktop and phone width", async ({
    skip,
  }) => {
    skip(chromiumMissing !== null, chromiumMissing ?? "");
    await signedIn();
    const id = randomUUID();
    await runner.expectJob(id);
    await runner.logs.append(id, 0, [
      { stored: [{ line: "\u001b[33mwarning\u001b[0m: x", stderr: true }], stderr: true, bytes: 10 },
    ]);
    for (const width of [1100, 375]) {
      await page.setViewportSize({ width, height: 800 });
      // yk@1.1.0 is yanked by the test before: its badge and reason are checked too.
      for (const path of ["/", `/jobs/${id}`, "/packages/app", "/packages/yk?version=1.1.0"]) {
        await page.goto(`${consoleUrl()}${path}`);
        await page.locator("main h1").waitFor();
        await page.waitForFunction(
          () => !document.querySelector(".loading") && !document.querySelector("#log .row.pending"),
        );
        // Evaluated, not a script tag: the console's CSP rightly refuses inline scripts.
        await page.evaluate(AXE);
        const result = await page.evaluate(async () => {
          const axe = (
            window as unknown as {
              axe: {
                run(
                  ctx: Document,
                  opts: object,
                ): Promise<{ violations: Array<{ id: string; impact: string; nodes: unknown[] }> }>;
              };
            }
          ).axe;
          return axe.run(document, { resultTypes: ["violations"] });
        });
        const serious = result.violations.filter((v) => v.impact === "serious" || v.impact === "critical");
        expect(
          serious.map((v) => `${v.id} (${v.impact}, ${v.nodes.length} nodes)`),
          `${path} at ${width}px`,
        ).toEqual([]);
        // Readable at phone width: nothing wider than the screen but the scrolling log and tables.
        const overflow = await page.evaluate(
          () => document.documentElement.scrollWidth - document.documentElement.clientWidth,
        );
        expect(overflow, `${path} at ${width}px scrolls sideways`).toBeLessThanOrEqual(0);
      }
    }
    await page.setViewportSize({ width: 1100, height: 800 });
    await runner.cancelJob(id);
  });

  it("keyboard: the skip link, the log and the controls are reachable with Tab", async ({ skip }) => {
    skip(chromiumMissing !== null, chromiumMissing ?? "");
    await signedIn();
    const id = randomUUID();
    await runner.expectJob(id);
    await page.goto(`${consoleUrl()}/jobs/${id}`);
    await page.locator("#log").waitFor();
    await page.keyboard.press("Tab");
    expect(await page.evaluate(() => document.activeElement?.textContent)).toBe("Skip to content");
    const reached = new Set<string>();
    for (let i = 0; i < 12; i++) {
      await page.keyboard.press("Tab");
      reached.add(await page.evaluate(() => document.activeElement?.id || document.activeElement?.textContent || ""));
    }
    expect(reached).toContain("log");
    expect(reached).toContain("follow");
    expect(reached).toContain("Cancel job");
    await runner.cancelJob(id);
  });
});
