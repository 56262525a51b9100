/**
 * A cut log in the console (docs/decisions/log-tail.md), in a real browser (Debian's chromium driven by
 * playwright-core) against a real console over a runner server on the fs log store: the viewer shows the head, the
 * one drop marker standing for the dropped positions, and the tail ending in the job's last line, with no empty
 * rows for what was dropped.
 */
import { mkdtemp, rm } from "node:fs/promises";
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
  type LiveConsole,
} from "../fixtures/chromium.js";
import { createFsLogStore } from "../../src/adapters/fs/index.js";
import { createRunnerClient } from "../../src/runner/index.js";

const LINES = 20_000;

describe("a cut log in the console, in chromium", () => {
  let dataDir: string;
  let stack: LiveConsole;
  let browser: Browser;
  let page: Page;
  const id = randomUUID();

  beforeAll(async () => {
    if (chromiumMissing) return;
    dataDir = await mkdtemp(path.join(os.tmpdir(), "console-cut-"));
    stack = await startConsole({
      logs: createFsLogStore(dataDir, { fsync: false }),
      limits: { jobLogBytes: 64 * 1024 },
    });
    await stack.runner.expectJob(id, { repoUrl: "https://git.example/c.git", commitSha: "c0ffee" });
    const client = createRunnerClient({ endpoint: stack.runnerServer.url, requestId: id });
    for (let i = 1; i <= LINES; i++) if (!client.log(`line ${i}`, false)) await client.drained();
    client.log("FATAL: the end", true);
    await client.end({ exitCode: 1, success: false });
    await client.close();
    browser = await launchChromium();
    page = await signedInPage(browser, stack.origin, stack.sessions);
  }, 300_000);

  afterAll(async () => {
    if (chromiumMissing) return;
    await closeConsoleStack({ browser, ...stack });
    if (dataDir) await rm(dataDir, { recursive: true, force: true });
  });

  /** The rows in the DOM once none is pending: [line number, text]. */
  async function settledRows(): Promise<Array<[number, string]>> {
    await page.evaluate(() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r))));
    await page.waitForFunction(
      () => document.querySelectorAll("#log .row").length > 0 && !document.querySelector("#log .row.pending"),
      undefined,
      { timeout: 30_000 },
    );
    return page.$$eval("#log .row", (els) =>
      els.map((el) => [Number((el as HTMLElement).dataset.line), el.querySelector(".text")?.textContent ?? ""]),
    );
  }

  it("shows head, one marker and the tail ending in FATAL, and no rows for the dropped lines", async ({ skip }) => {
    skip(chromiumMissing !== null, chromiumMissing ?? "");
    const state = (await stack.runner.logs.get(id))!;
    const cut = state.cut!;
    expect(cut.lines).toBeGreaterThan(0);
    await page.goto(`${stack.origin}/-/console/jobs/${id}`);
    // Rows: every position but the dropped ones.
    await page.waitForFunction(
      (n) => document.getElementById("log")?.dataset.rows === String(n),
      state.storedLines - cut.lines,
      { timeout: 30_000 },
    );

    // Around the cut: the head's last line, the marker, then the tail's first kept line.
    await page.evaluate((n) => (location.hash = `#L${n}`), cut.at);
    let rows = await settledRows();
    const at = rows.findIndex(([n]) => n === cut.at + 1);
    expect(rows[at]![1]).toMatch(/log cut: \d+ lines \(\d+ bytes\) dropped here/);
    expect(rows[at - 1]).toEqual([cut.at, `line ${cut.at}`]);
    const next = rows[at + 1]!;
    expect(next[0]).toBe(cut.at + cut.lines + 2);
    expect(next[1]).toMatch(/^line \d+$/);
    expect(rows.filter(([, text]) => /log cut/.test(text))).toHaveLength(1);

    // The last row is the job's last line.
    await page.evaluate((n) => (location.hash = `#L${n}`), state.storedLines);
    rows = await settledRows();
    expect(rows.at(-1)).toEqual([state.storedLines, "FATAL: the end"]);
    expect(rows.every(([, text]) => text !== "")).toBe(true);
  });
});
