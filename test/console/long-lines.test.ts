/**
 * The console's log viewer on a log of long lines, in a real browser (Debian's chromium driven by playwright-core): a
 * `lines` window ends at 4 MiB of text, so a 500-line chunk of 20,000-byte lines takes several windows. The review of
 * 2026-12-02 found the viewer asking for such a chunk from its start again on every draw, so the lines past the first
 * window stayed pending ("…") and the page kept requesting. Each line shown must be the right one, with the number of
 * window requests bounded.
 */
import { randomUUID } from "node:crypto";
import type { Browser, Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  chromiumMissing,
  closeConsoleStack,
  launchChromium,
  signedInPage,
  startConsole,
  type LiveConsole,
} from "../fixtures/chromium.js";
import { createMemoryLogStore } from "../../src/adapters/memory/index.js";
import { createRunnerClient } from "../../src/runner/index.js";

/** 600 lines of 20,000 bytes: the first chunk (500 lines) is ~10 MB, three 4 MiB windows. */
const LINES = 600;
const lineText = (n: number) => `line ${String(n).padStart(4, "0")} `.padEnd(20_000, n % 2 === 0 ? "e" : "o");

describe("the console's log viewer on a log of long lines, in chromium", () => {
  let stack: LiveConsole;
  let browser: Browser;
  let page: Page;
  const id = randomUUID();
  const windows: string[] = [];

  beforeAll(async () => {
    if (chromiumMissing) return;
    stack = await startConsole({ logs: createMemoryLogStore() });
    await stack.runner.expectJob(id, { repoUrl: "https://git.example/long.git", commitSha: "10n6" });
    const client = createRunnerClient({ endpoint: stack.runnerServer.url, requestId: id });
    for (let n = 1; n <= LINES; n++) if (!client.log(lineText(n), false)) await client.drained();
    await client.end({ exitCode: 0, success: true });
    await client.close();
    browser = await launchChromium();
    page = await signedInPage(browser, stack.origin, stack.sessions);
    page.on("request", (request) => {
      if (request.url().includes(`/api/jobs/${id}/lines`)) windows.push(request.url());
    });
  }, 120_000);

  afterAll(async () => {
    if (chromiumMissing) return;
    await closeConsoleStack({
      browser,
      httpServer: stack.httpServer,
      runnerServer: stack.runnerServer,
      runner: stack.runner,
    });
  });

  it("shows a line past the chunk's first window, with a bounded number of window requests", async ({ skip }) => {
    skip(chromiumMissing !== null, chromiumMissing ?? "");
    await page.goto(`${stack.origin}/-/console/jobs/${id}#L400`);
    const row = page.locator(`#log .row.target[data-line="400"]`);
    await row.waitFor({ timeout: 30_000 });
    await page.waitForFunction(() => !document.querySelector("#log .row.pending"), undefined, { timeout: 30_000 });
    expect(await row.locator(".text").textContent()).toBe(lineText(400));
    const rows = await page.$$eval("#log .row", (els) =>
      els.map(
        (el) => [Number((el as HTMLElement).dataset.line), el.querySelector(".text")?.textContent ?? ""] as const,
      ),
    );
    for (const [n, text] of rows) expect(text, `line ${n}`).toBe(lineText(n));
    // Settled: no more requests once every row on screen is drawn (the chunk asked for again would keep them coming).
    const settled = windows.length;
    await page.waitForTimeout(1_000);
    expect(windows.length).toBe(settled);
    // Two chunks at most (the target's and its neighbour's), each in ≤ 3 windows of 4 MiB.
    expect(settled).toBeLessThanOrEqual(6);
  });
});
