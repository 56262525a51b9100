/**
 * What an expression may cost a log search (docs/decisions/log-search.md, "An expression's cost"), through a real
 * runner server (the lines sent over gRPC) and the console's search endpoint on node:http. An attack round found a
 * 36-character expression (`(?:x?){1000}` three times) that matched every line in 4–15 ms and held the server's one
 * thread for ~14 s a request: an expression over MAX_PROGRAM_SIZE instructions is now refused, and a request ends its
 * page after MATCH_MS of matching, saying where to go on. No time is asserted: the page ends short of every other
 * bound, which only the time bound does.
 */
import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { LogSearchPage } from "../../src/runner/service/log-search.js";
import { MAX_PROGRAM_SIZE } from "../../src/runner/service/search-matcher.js";
import { startConsoleHttp, type ConsoleHttp } from "../fixtures/console-http.js";

/** Lines of the job, each 4,096 `x`: one read page (2,048 lines), every line matched by the expressions below. */
const LINES = 2_048;
let stack: ConsoleHttp;
let url: string;
const id = randomUUID();

beforeAll(async () => {
  stack = await startConsoleHttp();
  url = stack.url;
  await stack.job(
    id,
    Array.from({ length: LINES }, () => "x".repeat(4096)),
  );
}, 120_000);

afterAll(async () => {
  await stack?.close();
});

const search = (q: string, from = 0) =>
  fetch(`${url}/api/jobs/${id}/search?q=${encodeURIComponent(q)}&regex=1&case=1&limit=1000&from=${from}`);

describe("an expression's cost in a log search", () => {
  it("refuses an expression over MAX_PROGRAM_SIZE instructions before reading a line", async () => {
    const answer = await search("(?:x?){1000}(?:y?){1000}(?:z?){1000}");
    expect(answer.status).toBe(400);
    const problem = (await answer.json()) as { code: string; detail: string };
    expect(problem.code).toBe("INVALID_ARGUMENT");
    expect(problem.detail).toBe(
      `the expression compiles to 6002 instructions, over the ${MAX_PROGRAM_SIZE} a search takes; make it smaller`,
    );
  });

  it("ends a page of a costly expression after its matching time, and the next page goes on from there", async () => {
    // 502 instructions, under the cap; ~10–30 ms a 4,096-byte line here, so the page (limit 1,000, 8 MiB of text,
    // 2,048 lines) would take tens of seconds without the time bound.
    const q = "(?:x?){250}";
    const first = (await (await search(q)).json()) as LogSearchPage;
    expect(first.end).toBe(false);
    expect(first.scanned).toBeGreaterThanOrEqual(1);
    expect(first.scanned).toBeLessThan(1000);
    expect(first.matches.map((m) => m.position)).toEqual(Array.from({ length: first.scanned }, (_, i) => i));
    expect(first.next).toBe(first.scanned);
    const second = (await (await search(q, first.next)).json()) as LogSearchPage;
    expect(second.matches[0]?.position).toBe(first.next);
    expect(second.scanned).toBeLessThan(1000);
  });
});
