/**
 * Log sections in the console (docs/decisions/log-sections.md), in a real browser (Debian's chromium driven by
 * playwright-core) against a real console server over a runner server on the fs log store, the jobs' lines sent by
 * the agent's own client over gRPC:
 * - a log of 1,048,577 lines: the section holding line 900,000 folds and opens, the viewer still fetching only
 *   the 500-line chunks on screen;
 * - a job that exits 1 opens its failing section (the last one open); nesting, GitHub groups and a section still
 *   open at the end render with their depth and durations;
 * - the sections endpoint and the raw download of one section, through the same server.
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
import { createFsLogStore } from "../../src/adapters/fs/index.js";
import type { ConsoleSessions } from "../../src/console/index.js";
import { createRunnerClient, type RunnerServer, type RunnerService } from "../../src/runner/index.js";

const TOTAL = 1_048_577;
const T = 1_700_000_000;
const gitlabStart = (name: string, t: number, header = "", options = "") =>
  `\x1b[0Ksection_start:${t}:${name}${options}\r\x1b[0K${header}`;
const gitlabEnd = (name: string, t: number) => `\x1b[0Ksection_end:${t}:${name}\r\x1b[0K`;

/**
 * The big log's line at index `i` (0-based): sections `part_0` … `part_7` over each 100,000 lines, then `holder`
 * (800,000–999,999) and inside it `inner` (899,000–901,000): line 900,000 (1-based, index 899,999) lies in both.
 */
function bigLine(i: number): string {
  if (i === 800_000) return gitlabStart("holder", T + 800, "Holder");
  if (i === 899_000) return gitlabStart("inner", T + 899, "Inner");
  if (i === 901_000) return gitlabEnd("inner", T + 901);
  if (i === 999_999) return gitlabEnd("holder", T + 1000);
  if (i % 100_000 === 0 && i < 800_000) return gitlabStart(`part_${i / 100_000}`, T + i / 1000);
  if (i % 100_000 === 99_999 && i < 800_000)
    return gitlabEnd(`part_${(i - 99_999) / 100_000}`, T + Math.floor(i / 1000) + 61);
  return `line ${i + 1}`;
}

/** The failing job's lines: nesting, a collapsed section, a GitHub group, two sections still open at the exit. */
const FAILING = [
  gitlabStart("setup", T, "Set up", "[collapsed=true]"),
  "setting up",
  gitlabEnd("setup", T + 2),
  "::group::Dependencies",
  "resolving",
  "::endgroup::",
  gitlabStart("build", T + 3, "Build"),
  "configuring",
  gitlabStart("compile", T + 4, "Compile"),
  "cc -c main.c",
  "error: boom",
];

describe("log sections in the console, in chromium", () => {
  let dataDir: string;
  let runner: RunnerService;
  let runnerServer: RunnerServer;
  let sessions: ConsoleSessions;
  let httpServer: http.Server;
  let origin: string;
  let browser: Browser;
  let page: Page;
  const big = randomUUID();
  const failing = randomUUID();
  const chunkRequests: string[] = [];

  async function send(id: string, count: number, lineAt: (i: number) => string, exitCode: number) {
    await runner.expectJob(id, { repoUrl: "https://git.example/s.git", commitSha: "5ec710" });
    const client = createRunnerClient({ endpoint: runnerServer.url, requestId: id });
    for (let i = 0; i < count; i++) if (!client.log(lineAt(i), false)) await client.drained();
    await client.end({ exitCode, success: exitCode === 0 });
    await client.close();
  }

  beforeAll(async () => {
    if (chromiumMissing) return;
    dataDir = await mkdtemp(path.join(os.tmpdir(), "console-sections-"));
    ({ runner, runnerServer, sessions, httpServer, origin } = await startConsole({
      logs: createFsLogStore(dataDir, { fsync: false }),
    }));

    await send(big, TOTAL, bigLine, 0);
    await send(failing, FAILING.length, (i) => FAILING[i]!, 1);
    expect(await runner.logs.get(big)).toMatchObject({ status: "finished", storedLines: TOTAL });

    browser = await launchChromium();
    page = await signedInPage(browser, origin, sessions);
    page.on("request", (request) => {
      if (request.url().includes(`/api/jobs/${big}/lines`)) chunkRequests.push(request.url());
    });
  }, 600_000);

  afterAll(async () => {
    if (chromiumMissing) return;
    await closeConsoleStack({ browser, httpServer, runnerServer, runner });
    if (dataDir) await rm(dataDir, { recursive: true, force: true });
  });

  interface Row {
    n: number;
    text: string;
    section: string | null;
    expanded: string | null;
    depth: string | null;
    dur: string | null;
    failed: boolean;
  }

  /** The rows in the DOM once none is pending. */
  async function settledRows(): Promise<Row[]> {
    await page.evaluate(() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r))));
    await page.waitForFunction(
      () => document.querySelectorAll("#log .row").length > 0 && !document.querySelector("#log .row.pending"),
      undefined,
      { timeout: 30_000 },
    );
    return page.$$eval("#log .row", (els) =>
      els.map((el) => {
        const e = el as HTMLElement;
        return {
          n: Number(e.dataset.line),
          text: e.querySelector(".text")?.textContent ?? "",
          section: e.dataset.section ?? null,
          expanded: e.querySelector("button.fold")?.getAttribute("aria-expanded") ?? null,
          depth: e.dataset.depth ?? null,
          dur: e.querySelector(".dur")?.textContent ?? null,
          failed: e.classList.contains("section-failed"),
        };
      }),
    );
  }

  const rowCount = () => page.evaluate(() => Number(document.getElementById("log")!.dataset.rows));

  it("folds and opens the section holding line 900,000 of a 1,048,577-line log, fetching only what is on screen", async ({
    skip,
  }) => {
    skip(chromiumMissing !== null, chromiumMissing ?? "");
    await page.goto(`${origin}/-/console/jobs/${big}#L900000`);
    await page.waitForFunction(() => document.getElementById("log")?.dataset.sections === "10", undefined, {
      timeout: 60_000,
    });
    let rows = await settledRows();
    expect(rows.find((r) => r.n === 900_000)?.text).toBe("line 900000");
    expect(await rowCount()).toBe(TOTAL);

    // Scroll to the header of `inner` (line 899,001) and fold it: its 2,000 other lines leave the layout.
    await page.evaluate(() => (location.hash = "#L899001"));
    rows = await settledRows();
    const head = rows.find((r) => r.n === 899_001)!;
    expect(head).toMatchObject({ section: "inner", expanded: "true", depth: "1", dur: "2s" });
    await page.locator('#log .row[data-line="899001"] button.fold').click();
    await page.waitForFunction((n) => document.getElementById("log")!.dataset.rows === String(n), TOTAL - 2000);
    rows = await settledRows();
    expect(rows.find((r) => r.n === 899_001)).toMatchObject({ section: "inner", expanded: "false" });
    expect(rows.some((r) => r.n > 899_001 && r.n <= 901_001)).toBe(false);
    // The row after the folded header is the line after the section's end marker.
    const at = rows.findIndex((r) => r.n === 899_001);
    expect(rows[at + 1]).toMatchObject({ n: 901_002, text: "line 901002" });

    // Open it again: line 900,000 is back where it was.
    await page.locator('#log .row[data-line="899001"] button.fold').click();
    await page.waitForFunction((n) => document.getElementById("log")!.dataset.rows === String(n), TOTAL);
    await page.evaluate(() => (location.hash = "#L900000"));
    rows = await settledRows();
    expect(rows.find((r) => r.n === 900_000)?.text).toBe("line 900000");

    // Fold the outer `holder` (200,000 lines, duration 200 s); a link to line 900,000 opens it again.
    await page.evaluate(() => (location.hash = "#L800001"));
    await settledRows();
    await page.locator('#log .row[data-line="800001"] button.fold').click();
    await page.waitForFunction(
      (n) => document.getElementById("log")!.dataset.rows === String(n),
      TOTAL - (1_000_000 - 800_001),
    );
    rows = await settledRows();
    expect(rows.find((r) => r.n === 800_001)).toMatchObject({ section: "holder", expanded: "false", dur: "3m 20s" });
    expect(rows.some((r) => r.n > 800_001 && r.n <= 1_000_000)).toBe(false);
    await page.evaluate(() => (location.hash = "#L900000"));
    rows = await settledRows();
    expect(rows.find((r) => r.n === 900_000)?.text).toBe("line 900000");
    expect(await rowCount()).toBe(TOTAL);

    // Every fetch was a 500-line window: folding never loads the log.
    expect(chunkRequests.length).toBeLessThan(40);
    for (const url of chunkRequests) expect(new URL(url).searchParams.get("limit")).toBe("500");
  });

  it("opens a failed job's failing section; nesting, groups and still-open sections render", async ({ skip }) => {
    skip(chromiumMissing !== null, chromiumMissing ?? "");
    await page.goto(`${origin}/-/console/jobs/${failing}`);
    await page.waitForFunction(() => document.getElementById("log")?.dataset.sections === "4", undefined, {
      timeout: 30_000,
    });
    // setup (collapsed=true) and the GitHub group are folded: 11 lines show as 11 - 2 - 2 rows.
    await page.waitForFunction(() => document.getElementById("log")!.dataset.rows === "7");
    const rows = await settledRows();
    expect(rows.map((r) => r.n)).toEqual([1, 4, 7, 8, 9, 10, 11]);
    expect(rows[0]).toMatchObject({ section: "setup", expanded: "false", depth: "0", dur: "2s", failed: false });
    expect(rows[0]!.text).toContain("Set up");
    expect(rows[1]).toMatchObject({
      section: "Dependencies",
      expanded: "false",
      depth: "0",
      dur: expect.stringMatching(/^\d+ ms$/),
    });
    expect(rows[2]).toMatchObject({ section: "build", expanded: "true", depth: "0", dur: "still open", failed: false });
    // The failing section: the innermost one still open when the job exited 1, open, its error on screen.
    expect(rows[4]).toMatchObject({
      section: "compile",
      expanded: "true",
      depth: "1",
      dur: "still open",
      failed: true,
    });
    expect(rows[6]).toMatchObject({ n: 11, text: "error: boom" });
    // Opening the group shows its lines.
    await page.locator('#log .row[data-line="4"] button.fold').click();
    await page.waitForFunction(() => document.getElementById("log")!.dataset.rows === "9");
    expect((await settledRows()).map((r) => r.n)).toEqual([1, 4, 5, 6, 7, 8, 9, 10, 11]);
  });

  it("a live job's sections appear as their markers stream in; its failure opens the one still open", async ({
    skip,
  }) => {
    skip(chromiumMissing !== null, chromiumMissing ?? "");
    const live = randomUUID();
    await runner.expectJob(live, { repoUrl: "https://git.example/s.git", commitSha: "11fe" });
    const client = createRunnerClient({ endpoint: runnerServer.url, requestId: live });
    try {
      client.log("starting", false);
      await page.goto(`${origin}/-/console/jobs/${live}`);
      await page.waitForFunction(() => document.getElementById("log")?.dataset.stream === "open");
      for (const line of [gitlabStart("fetch", T, "Fetch"), "fetched", gitlabEnd("fetch", T + 3)])
        client.log(line, false);
      await page.waitForSelector('#log .row[data-section="fetch"] .dur:text-is("3s")', { timeout: 30_000 });
      for (const line of ["::group::Tests", "test 1 ok", "test 2 FAILED"]) client.log(line, false);
      await page.waitForSelector('#log .row[data-section="Tests"]', { timeout: 30_000 });
      await client.end({ exitCode: 2, success: false });
      // Ended non-zero: the group still open is the failing one, opened though GitHub groups start folded.
      await page.waitForSelector('#log .row.section-failed[data-section="Tests"] button[aria-expanded="true"]', {
        timeout: 30_000,
      });
      const rows = await settledRows();
      expect(rows.find((r) => r.text === "test 2 FAILED")).toBeDefined();
      expect(rows.find((r) => r.section === "fetch")).toMatchObject({ dur: "3s", failed: false });
    } finally {
      await client.close();
    }
  });

  it("answers the sections and a section's raw lines through the console API", async ({ skip }) => {
    skip(chromiumMissing !== null, chromiumMissing ?? "");
    const got = await page.evaluate(async (id) => {
      const sections = await (await fetch(`/-/console/api/jobs/${id}/sections`)).json();
      const raw = await (await fetch(`/-/console/api/jobs/${id}/raw?section=compile`)).text();
      const missing = (await fetch(`/-/console/api/jobs/${id}/raw?section=nope`)).status;
      return { sections, raw, missing };
    }, failing);
    expect(got.sections).toMatchObject({ storedLines: 11, status: "finished", exitCode: 1, dropped: 0, unmatched: 0 });
    expect(
      got.sections.sections.map((s: { name: string; start: number; end: number | null }) => [s.name, s.start, s.end]),
    ).toEqual([
      ["setup", 0, 2],
      ["Dependencies", 3, 5],
      ["build", 6, null],
      ["compile", 8, null],
    ]);
    expect(got.raw).toBe(`${FAILING.slice(8).join("\n")}\n`);
    expect(got.missing).toBe(404);
  });
});
