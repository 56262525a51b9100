/**
 * The console's log viewer on a log at the service's cap (256 MiB), in a real browser
 * (Debian's chromium driven by playwright-core): a job streams 1,048,576 lines of 256
 * bytes and one more through the real agent client into a real runner server on the fs
 * log store, so the service itself stores its truncation marker at the cap; the page
 * shows the end, jumps to any line, and scrolls through the whole log.
 *
 * Proves "smooth on a 256 MiB log" by what makes it so, not by a stopwatch: only the rows
 * on screen are ever in the DOM, each position costs at most a couple of 500-line chunk
 * requests, the page's JavaScript heap stays a small fraction of the log, and every line
 * shown is the right one. Frame times are printed for the report, never asserted.
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
import { LINE_RECORD_OVERHEAD } from "../../src/runner/service/log-cap.js";

/** Each line counts its bytes + LINE_RECORD_OVERHEAD toward the cap (log-cap.ts): 256 a line. */
const LINE_BYTES = 256 - LINE_RECORD_OVERHEAD;
/** 256 MiB of lines counting 256 bytes each: exactly the service's default jobLogBytes. */
const FULL_LINES = (256 * 1024 * 1024) / (LINE_BYTES + LINE_RECORD_OVERHEAD);
/** The line the agent sends after the cap: stored as the service's truncation marker. */
const STORED = FULL_LINES + 1;
const LOG_BYTES = FULL_LINES * (LINE_BYTES + LINE_RECORD_OVERHEAD);

/** Line `n` (1-based) as the agent sends it: ASCII, exactly LINE_BYTES bytes; every 10th on stderr. */
function lineText(n: number): string {
  const head = `line ${String(n).padStart(8, "0")} `;
  return head + "abcdefghijklmnopqrstuvwxyz0123456789".repeat(8).slice(0, LINE_BYTES - head.length);
}

describe("the console's log viewer on a 256 MiB log, in chromium", () => {
  let dataDir: string;
  let runner: RunnerService;
  let runnerServer: RunnerServer;
  let sessions: ConsoleSessions;
  let httpServer: http.Server;
  let origin: string;
  let browser: Browser;
  let page: Page;
  const id = randomUUID();
  const chunkRequests: string[] = [];

  beforeAll(async () => {
    if (chromiumMissing) return;
    dataDir = await mkdtemp(path.join(os.tmpdir(), "console-large-"));
    // tailBytes 0: the cap's old rule (later lines counted, not stored), so the log holds exactly 256 MiB; the
    // tail kept past the cap is shown in cut-log.test.ts.
    ({ runner, runnerServer, sessions, httpServer, origin } = await startConsole({
      logs: createFsLogStore(dataDir, { fsync: false }),
      limits: { tailBytes: 0 },
    }));

    // The job, through the agent's own client over gRPC: the cap, then one line past it.
    await runner.expectJob(id, { repoUrl: "https://git.example/big.git", commitSha: "b16b00b5" });
    const client = createRunnerClient({ endpoint: runnerServer.url, requestId: id });
    for (let n = 1; n <= STORED; n++) {
      if (!client.log(lineText(n), n % 10 === 0)) await client.drained();
    }
    await client.end({ exitCode: 0, success: true });
    await client.close();
    const stored = await runner.logs.get(id);
    expect(stored).toMatchObject({
      status: "finished",
      storedLines: STORED,
      storedBytes: LOG_BYTES,
      logTruncated: true,
    });

    browser = await launchChromium();
    page = await signedInPage(browser, origin, sessions);
    page.on("request", (request) => {
      if (request.url().includes(`/api/jobs/${id}/lines`)) chunkRequests.push(request.url());
    });
    expect(page.url()).toBe(`${origin}/-/console/`);
  }, 600_000);

  afterAll(async () => {
    if (chromiumMissing) return;
    await closeConsoleStack({ browser, httpServer, runnerServer, runner });
    if (dataDir) await rm(dataDir, { recursive: true, force: true });
  });

  /** The rows in the DOM: line number, text, stderr, marker; waits until none is pending. */
  async function settledRows(): Promise<Array<{ n: number; text: string; err: boolean; marker: boolean }>> {
    await page.waitForFunction(
      () => document.querySelectorAll("#log .row").length > 0 && !document.querySelector("#log .row.pending"),
      undefined,
      { timeout: 30_000 },
    );
    await page.evaluate(() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r))));
    await page.waitForFunction(() => !document.querySelector("#log .row.pending"), undefined, { timeout: 30_000 });
    return page.$$eval("#log .row", (els) =>
      els.map((el) => ({
        n: Number((el as HTMLElement).dataset.line),
        text: el.querySelector(".text")?.textContent ?? "",
        err: el.classList.contains("err"),
        marker: el.classList.contains("marker"),
      })),
    );
  }

  function expectRight(rows: Array<{ n: number; text: string; err: boolean; marker: boolean }>): void {
    expect(rows.length).toBeGreaterThan(0);
    // Only the rows on screen: 800 px of 20 px rows, whatever the log's length.
    expect(rows.length).toBeLessThan(60);
    for (const row of rows) {
      if (row.n === STORED) continue;
      expect(row, `line ${row.n}`).toEqual({ n: row.n, text: lineText(row.n), err: row.n % 10 === 0, marker: false });
    }
    // Consecutive line numbers: no gap, no repeat on screen.
    for (let k = 1; k < rows.length; k++) expect(rows[k]!.n).toBe(rows[k - 1]!.n + 1);
  }

  /** The page's JavaScript heap after a full garbage collection: what it keeps. */
  async function heapBytes(): Promise<number> {
    const cdp = await page.context().newCDPSession(page);
    await cdp.send("HeapProfiler.collectGarbage");
    const { usedSize } = await cdp.send("Runtime.getHeapUsage");
    await cdp.detach();
    return usedSize;
  }

  it("opens at the end, with the service's truncation marker shown as such", async ({ skip }) => {
    skip(chromiumMissing !== null, chromiumMissing ?? "");
    await page.goto(`${origin}/-/console/jobs/${id}`);
    await page.waitForFunction((n) => document.getElementById("log")?.dataset.lines === String(n), STORED, {
      timeout: 60_000,
    });
    const rows = await settledRows();
    expectRight(rows);
    const last = rows.at(-1)!;
    expect(last.n).toBe(STORED);
    expect(last.marker).toBe(true);
    expect(last.text).toBe(
      `Note from runner-depot: [runner-depot] log truncated: the job log reached its ${LOG_BYTES}-byte limit; later lines are counted, not stored`,
    );
    expect(await page.locator(".summary").textContent()).toContain("(log truncated at its cap)");
  });

  it("jumps to any line by its link and scrolls the whole log with a bounded DOM, bounded fetches and a small heap", async ({
    skip,
  }) => {
    skip(chromiumMissing !== null, chromiumMissing ?? "");
    // Line links: the first line, the middle, the last full line.
    for (const n of [1, FULL_LINES / 2 + 7, FULL_LINES]) {
      await page.evaluate((hash) => (location.hash = hash), `#L${n}`);
      const rows = await settledRows();
      expectRight(rows);
      expect(rows.some((r) => r.n === n)).toBe(true);
      expect(await page.locator(`#log .row.target[data-line="${n}"]`).count()).toBe(1);
    }

    // The scrollbar across the whole log: 40 positions, top to bottom, each one drawn right.
    const scrollHeight = await page.evaluate(() => document.getElementById("log")!.scrollHeight);
    const before = chunkRequests.length;
    const frames: number[] = [];
    for (let k = 0; k <= 40; k++) {
      const y = Math.round((k / 40) * scrollHeight);
      const frameMs = await page.evaluate(
        (top) =>
          new Promise<number>((resolve) => {
            const start = performance.now();
            document.getElementById("log")!.scrollTop = top;
            requestAnimationFrame(() => requestAnimationFrame(() => resolve(performance.now() - start)));
          }),
        y,
      );
      frames.push(frameMs);
      expectRight(await settledRows());
    }
    // Each position needs the one or two chunks its rows fall in, never the log.
    const fetched = chunkRequests.length - before;
    expect(fetched).toBeLessThanOrEqual(2 * 41);
    for (const url of chunkRequests) expect(new URL(url).searchParams.get("limit")).toBe("500");

    // Small steps, as a wheel or the arrow keys make them: 200 frames of 60 px.
    await page.evaluate(
      () => (document.getElementById("log")!.scrollTop = document.getElementById("log")!.scrollHeight / 3),
    );
    await settledRows();
    await page.locator("#log").focus();
    const stepFrames = await page.evaluate(
      () =>
        new Promise<number[]>((resolve) => {
          const log = document.getElementById("log")!;
          const times: number[] = [];
          let last = performance.now();
          const step = (now: number) => {
            times.push(now - last);
            last = now;
            if (times.length > 200) return resolve(times.slice(1));
            log.scrollTop += 60;
            requestAnimationFrame(step);
          };
          requestAnimationFrame(step);
        }),
    );
    expectRight(await settledRows());

    // The page holds what it shows plus a bounded cache, not the 256 MiB log.
    const heap = await heapBytes();
    expect(heap).toBeLessThan(LOG_BYTES / 4);
    const sorted = [...stepFrames].sort((a, b) => a - b);
    console.log(
      `256 MiB log (${STORED} lines): ${fetched} chunk requests for 41 scrollbar positions; ` +
        `scrollbar jump to drawn frame p50 ${frames.sort((a, b) => a - b)[20]!.toFixed(1)} ms; ` +
        `60 px steps: frame p50 ${sorted[100]!.toFixed(1)} ms, p95 ${sorted[190]!.toFixed(1)} ms, max ${sorted.at(-1)!.toFixed(1)} ms; ` +
        `page JS heap ${(heap / 1024 / 1024).toFixed(1)} MiB`,
    );
  });
});
