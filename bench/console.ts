/**
 * Console benchmark: a 256 MiB job log (fs log store, about 2.7 million lines of ~100
 * bytes) behind the console on node:http. Measured:
 * - a 500-line window (`api/jobs/<id>/lines`) at the log's start, middle and end (median
 *   of 15 each): the end's cost ÷ the start's is the peer ratio (O(window), not O(log));
 * - in Debian's chromium (when /usr/bin/chromium exists): the job page until its first
 *   rows show, then 15 jumps to random lines (`#L<n>`) until their rows show, and how many
 *   rows the DOM holds (the viewer is virtualised).
 *
 * `BENCH_LOG_MIB=32 npm run bench -- console` runs a smaller log.
 */
import { existsSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import http from "node:http";
import type { AddressInfo } from "node:net";
import os from "node:os";
import path from "node:path";
import { randomUUID } from "node:crypto";
import { toNodeHandler } from "srvx/node";
import { createFsLogStore } from "../src/adapters/fs/index.js";
import { createMemoryQueue } from "../src/adapters/memory/index.js";
import { createConsole } from "../src/console/index.js";
import { createRunnerService } from "../src/runner/index.js";
import type { LogEntry } from "../src/runner/ports.js";

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const ms = (n: number) => n.toFixed(1);

export async function run(): Promise<string> {
  const mib = Number(process.env.BENCH_LOG_MIB) > 0 ? Number(process.env.BENCH_LOG_MIB) : 256;
  const dir = await mkdtemp(path.join(os.tmpdir(), "bench-console-"));
  const logs = createFsLogStore(dir, { fsync: false });
  const runner = createRunnerService(createMemoryQueue(), { logs, limits: { jobLogBytes: 1024 * 1024 * 1024 } });
  const id = randomUUID();
  await runner.expectJob(id, { repoUrl: "https://git.example/big.git" });
  // ~100-byte lines with some colour, written in batches of 10,000 items.
  const target = mib * 1024 * 1024;
  let bytes = 0;
  let at = 0;
  const fillStart = performance.now();
  while (bytes < target) {
    const batch: LogEntry[] = [];
    for (let i = 0; i < 10_000 && bytes < target; i++, at++) {
      const line = `${at % 50 === 0 ? "\u001b[32m" : ""}step ${String(at).padStart(9, "0")} ${"x".repeat(70)}${at % 50 === 0 ? "\u001b[0m" : ""}`;
      bytes += line.length;
      batch.push({ stored: [{ line, stderr: at % 97 === 0 }], stderr: at % 97 === 0, bytes: line.length });
    }
    await logs.append(id, at - batch.length, batch);
  }
  const fillMs = performance.now() - fillStart;
  const lines = at;

  const web = createConsole({ runner });
  const server = http.createServer(
    toNodeHandler((request: Request) => web.fetch(request)) as unknown as http.RequestListener,
  );
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const origin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const rows: string[] = [];
  try {
    const windowAt = async (from: number) => {
      const times: number[] = [];
      for (let i = 0; i < 15; i++) {
        const t = performance.now();
        const body = (await (await fetch(`${origin}/api/jobs/${id}/lines?from=${from}&limit=500`)).json()) as {
          lines: unknown[];
        };
        times.push(performance.now() - t);
        if (body.lines.length === 0) throw new Error("empty window");
      }
      return median(times);
    };
    // The first read of a job builds its line index once (one pass over the file): timed apart.
    const indexStart = performance.now();
    await fetch(`${origin}/api/jobs/${id}/lines?from=${lines - 500}&limit=500`).then((r) => r.arrayBuffer());
    const indexMs = performance.now() - indexStart;
    const start = await windowAt(0);
    const middle = await windowAt(Math.floor(lines / 2));
    const end = await windowAt(lines - 500);
    rows.push(`| 500-line window at the start (peer) | ${ms(start)} ms | 1.00 |`);
    rows.push(`| 500-line window in the middle | ${ms(middle)} ms | ${(middle / start).toFixed(2)} |`);
    rows.push(`| 500-line window at the end | ${ms(end)} ms | ${(end / start).toFixed(2)} |`);
    rows.push(`| first read of the job (builds the fs store's line index) | ${ms(indexMs)} ms | |`);

    if (existsSync("/usr/bin/chromium")) {
      const { chromium } = await import("playwright-core");
      const browser = await chromium.launch({
        executablePath: "/usr/bin/chromium",
        args: [
          "--headless",
          "--no-sandbox",
          "--disable-gpu",
          "--disable-quic",
          "--no-first-run",
          "--disable-background-networking",
          "--disable-component-update",
          "--disable-sync",
        ],
      });
      try {
        const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
        const ready = () =>
          page.waitForFunction(
            () => document.querySelectorAll("#log .row").length > 0 && !document.querySelector("#log .row.pending"),
            undefined,
            { timeout: 60_000 },
          );
        const t0 = performance.now();
        await page.goto(`${origin}/jobs/${id}`);
        await ready();
        const openMs = performance.now() - t0;
        const jumps: number[] = [];
        let seed = 7;
        for (let i = 0; i < 15; i++) {
          seed = (seed * 1103515245 + 12345) % 2 ** 31;
          const line = 1 + (seed % lines);
          const t = performance.now();
          await page.evaluate((n) => (location.hash = `#L${n}`), line);
          await page.waitForFunction(
            (n) => !!document.querySelector(`#log .row[data-line="${n}"]:not(.pending)`),
            line,
            { timeout: 60_000 },
          );
          jumps.push(performance.now() - t);
        }
        const domRows = await page.evaluate(() => document.querySelectorAll("#log .row").length);
        const heap = await page.evaluate(
          () => (performance as unknown as { memory?: { usedJSHeapSize: number } }).memory?.usedJSHeapSize ?? 0,
        );
        rows.push(`| chromium: job page open until its rows show | ${ms(openMs)} ms | |`);
        rows.push(
          `| chromium: jump to a random line until it shows (median of 15) | ${ms(median(jumps))} ms | max ${ms(Math.max(...jumps))} ms |`,
        );
        rows.push(
          `| chromium: rows in the DOM / JS heap after the jumps | ${domRows} rows / ${(heap / 1048576).toFixed(1)} MiB | of ${lines.toLocaleString("en")} lines |`,
        );
      } finally {
        await browser.close();
      }
    }
  } finally {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
    await runner.close();
    await logs.close?.();
    await rm(dir, { recursive: true, force: true });
  }
  return [
    `## Console: a ${mib} MiB job log`,
    "",
    `${lines.toLocaleString("en")} lines (${(bytes / 1048576).toFixed(0)} MiB) in the fs log store (written in ${(fillMs / 1000).toFixed(1)} s, fsync off), served by \`createConsole\` on node:http, read with \`fetch\` from the same process. The peer of each window is the window at the log's start, same run.`,
    "",
    "| measure | figure | ratio / note |",
    "|---|---:|---:|",
    ...rows,
  ].join("\n");
}
