/**
 * A reader's page is bounded in bytes, not only in lines (an attack round of 2026-12-02: the raw download read 1,000
 * lines a pull, ~64 MB for a job of 64 KiB lines, and eight stalled readers held ~80 MiB each). Through a real runner
 * server (the lines sent over gRPC) and the console on node:http, every store read that the raw download, the
 * `lines` window, a search and `follow()` make is recorded: each brings at most its caller's `maxBytes` and one line,
 * and the reader still gets every line.
 */
import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createMemoryLogStore } from "../../src/adapters/memory/index.js";
import type { JobLogStore, LogReadOptions } from "../../src/runner/ports.js";
import type { LogSearchPage } from "../../src/runner/service/log-search.js";
import { collectAll } from "../../src/testing/helpers.js";
import { startConsoleHttp, type ConsoleHttp } from "../fixtures/console-http.js";

/** 240 lines of 60,000 bytes: 14.4 MB, which a 1,000-line page would read at once. */
const LINE = 60_000;
const COUNT = 240;
const texts = Array.from({ length: COUNT }, (_, i) => `${i} `.padEnd(LINE, i % 2 === 0 ? "a" : "b"));

/** Each read: the bytes of text it returned, and the bound it was asked with. */
const reads: Array<{ bytes: number; maxBytes?: number }> = [];
let stack: ConsoleHttp;
const id = randomUUID();

/** The memory store, its `read` recorded (a wrapper made with Object.create keeps the rest as it is). */
function recorded(store: JobLogStore): JobLogStore {
  const out: JobLogStore = Object.create(store);
  out.read = async (requestId: string, from?: number, limit?: number, options?: LogReadOptions) => {
    const page = await store.read(requestId, from, limit, options);
    reads.push({ bytes: page.reduce((n, l) => n + l.line.length, 0), maxBytes: options?.maxBytes });
    return page;
  };
  return out;
}

beforeAll(async () => {
  stack = await startConsoleHttp({ logs: recorded(createMemoryLogStore()) });
  await stack.job(id, texts);
}, 120_000);

afterAll(async () => {
  await stack?.close();
});

/** The largest page `run` made the store read, after checking each read was asked with a bound. */
async function largestRead(run: () => Promise<void>): Promise<number> {
  reads.length = 0;
  await run();
  expect(reads.length).toBeGreaterThan(0);
  for (const read of reads) expect(read.maxBytes).toBeGreaterThan(0);
  return Math.max(...reads.map((r) => r.bytes));
}

describe("console and follow(): a page of a log of long lines is bounded in bytes", () => {
  it("the raw download reads ~1 MiB a pull and sends every line", async () => {
    let body = "";
    const largest = await largestRead(async () => {
      const answer = await fetch(`${stack.url}/api/jobs/${id}/raw`);
      expect(answer.status).toBe(200);
      body = await answer.text();
    });
    expect(body).toBe(texts.map((t) => `${t}\n`).join(""));
    expect(largest).toBeLessThanOrEqual(1024 * 1024 + LINE);
    expect(reads.length).toBeGreaterThanOrEqual(Math.ceil((COUNT * LINE) / (1024 * 1024)));
  });

  it("a `lines` window reads at most its 4 MiB, and the next window goes on from where it ends", async () => {
    const seen: string[] = [];
    const largest = await largestRead(async () => {
      while (seen.length < COUNT) {
        const answer = await fetch(`${stack.url}/api/jobs/${id}/lines?from=${seen.length}&limit=2000`);
        const page = (await answer.json()) as { lines: Array<[string, number, number]> };
        expect(page.lines.length).toBeGreaterThan(0);
        expect(page.lines.length).toBeLessThan(COUNT);
        for (const [text] of page.lines) seen.push(text);
      }
    });
    expect(seen).toEqual(texts);
    expect(largest).toBeLessThanOrEqual(4 * 1024 * 1024 + LINE);
  });

  it("a search reads 4 MiB at most a store read", async () => {
    const largest = await largestRead(async () => {
      const answer = await fetch(`${stack.url}/api/jobs/${id}/search?q=${encodeURIComponent("^239 b")}&regex=1`);
      expect(answer.status).toBe(200);
      const page = (await answer.json()) as LogSearchPage;
      expect(page.matches.map((m) => m.position)).toEqual([239]);
      expect(page.end).toBe(true);
    });
    expect(largest).toBeLessThanOrEqual(4 * 1024 * 1024 + LINE);
  });

  it("follow() of the ended job reads 512 KiB at most a page and yields every line", async () => {
    let lines: string[] = [];
    const largest = await largestRead(async () => {
      lines = (await collectAll(stack.runner.follow(id))).map((l) => l.line);
    });
    expect(lines).toEqual(texts);
    expect(largest).toBeLessThanOrEqual(512 * 1024 + LINE);
  });
});
