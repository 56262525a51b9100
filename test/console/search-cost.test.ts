/**
 * What a pattern may cost a log search (docs/decisions/log-search.md, "An expression's cost"), through a real runner
 * server (the lines sent over gRPC) and the console's search endpoint on node:http. An attack round found a
 * 36-character expression (`(?:x?){1000}` three times) that matched every line in 4–15 ms and held the server's one
 * thread for ~14 s a request; a review then found an expression whose every find rescans the line, and a literal
 * whose indexOf is O(line × pattern). An expression over MAX_PROGRAM_SIZE instructions is now refused, an expression's
 * ranges are looked for in a line's first RANGE_CHARS, and a request ends its page after MATCH_MS of matching, inside
 * a line between its ranges too, saying where to go on. No time is asserted: each page ends short of every other
 * bound, or a line's ranges short of MAX_RANGES_PER_LINE, which only the time bound does.
 */
import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { LogSearchPage } from "../../src/runner/service/log-search.js";
import { MAX_PROGRAM_SIZE, MAX_RANGES_PER_LINE } from "../../src/runner/service/search-matcher.js";
import { startConsoleHttp, type ConsoleHttp } from "../fixtures/console-http.js";

/** Lines of each job: one read page (2,048 lines). */
const LINES = 2_048;
let stack: ConsoleHttp;
let url: string;
/** 2,048 lines of 4,096 `x`; 64 lines of 16,384 `x`; 2,048 lines of 16,000 `a`. */
const jobs = { xs: randomUUID(), long: randomUUID(), as: randomUUID() };

beforeAll(async () => {
  stack = await startConsoleHttp();
  url = stack.url;
  await stack.job(
    jobs.xs,
    Array.from({ length: LINES }, () => "x".repeat(4096)),
  );
  await stack.job(
    jobs.long,
    Array.from({ length: 64 }, () => "x".repeat(16_384)),
  );
  await stack.job(
    jobs.as,
    Array.from({ length: LINES }, () => "a".repeat(16_000)),
  );
}, 180_000);

afterAll(async () => {
  await stack?.close();
});

const search = (q: string, from = 0, job = jobs.xs, regex = true) =>
  fetch(
    `${url}/api/jobs/${job}/search?q=${encodeURIComponent(q)}&regex=${regex ? 1 : 0}&case=1&limit=1000&from=${from}`,
  );
const page = async (answer: Promise<Response>) => (await (await answer).json()) as LogSearchPage;

describe("an expression's cost in a log search", () => {
  it("refuses an expression over MAX_PROGRAM_SIZE instructions with INVALID_ARGUMENT", async () => {
    const answer = await search("(?:x?){1000}(?:y?){1000}(?:z?){1000}");
    expect(answer.status).toBe(400);
    const problem = (await answer.json()) as { code: string; detail: string };
    expect(problem.code).toBe("INVALID_ARGUMENT");
    expect(problem.detail).toBe(
      `the expression compiles to 6002 instructions, over the ${MAX_PROGRAM_SIZE} a search takes; make it smaller`,
    );
  });

  it("ends a page of a costly expression after its matching time, and the next page goes on from there", async () => {
    // 242 instructions, under the cap; ~5–15 ms a 4,096-byte line here, so the page (limit 1,000, 8 MiB of text,
    // 2,048 lines) would take tens of seconds without the time bound.
    const q = "(?:x?){120}";
    const first = await page(search(q));
    expect(first.end).toBe(false);
    expect(first.scanned).toBeGreaterThanOrEqual(1);
    expect(first.scanned).toBeLessThan(1000);
    expect(first.matches.map((m) => m.position)).toEqual(Array.from({ length: first.scanned }, (_, i) => i));
    expect(first.next).toBe(first.scanned);
    const second = await page(search(q, first.next));
    expect(second.matches[0]?.position).toBe(first.next);
    expect(second.scanned).toBeLessThan(1000);
  });

  it("stops looking for a line's ranges at the request's time", async () => {
    // Every find rescans to the end (~0.1–0.3 s over 16 KiB lines, ~0.03–0.1 s over RANGE_CHARS): 100 of them a line.
    const first = await page(search("(?:.*(?:x?){100}y|x)", 0, jobs.long));
    expect(first.end).toBe(false);
    expect(first.scanned).toBeLessThan(64);
    const ranges = first.matches.flatMap((m) => m.ranges);
    expect(ranges.length).toBeGreaterThanOrEqual(1);
    expect(first.matches.every((m) => m.ranges.length <= MAX_RANGES_PER_LINE)).toBe(true);
    expect(ranges.length).toBeLessThan(first.scanned * MAX_RANGES_PER_LINE);
  });

  it("ends a page of a literal whose indexOf is O(line × pattern) after its matching time", async () => {
    // 1,024 characters that fail late at every offset of a line of 16,000 `a`: ~5–11 ms a line.
    const q = `${"a".repeat(64)}b${"a".repeat(959)}`;
    const first = await page(search(q, 0, jobs.as, false));
    expect(first).toMatchObject({ matches: [], end: false });
    expect(first.scanned).toBeGreaterThanOrEqual(1);
    expect(first.scanned).toBeLessThan(1000);
    expect(first.next).toBe(first.scanned);
  });
});
