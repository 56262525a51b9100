/**
 * Property tests of log search (issue 24, item 3): a literal finds exactly the lines `includes` finds, with every
 * occurrence as a range; a case-insensitive literal what lower-casing finds (ASCII); an RE2 expression the same
 * ranges as the JS engine on patterns both read alike; and a search through a real fs log store — its byte fast
 * path and its read path, across pages and the sparse index's strides — finds exactly the lines `includes` finds.
 */
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createFsLogStore } from "../../src/adapters/fs/index.js";
import type { JobLogStore, LogEntry } from "../../src/runner/ports.js";
import { searchJobLog } from "../../src/runner/service/log-search.js";
import { compileSearch, MAX_PATTERN_CHARS, type MatchRange } from "../../src/runner/service/search-matcher.js";
import { RunnerDepotError } from "../../src/errors.js";
import { fuzzParams, fuzzRuns, fuzzTimeout } from "./settings.js";

/** Every non-overlapping occurrence of `needle` in `line`, left to right. */
function occurrences(line: string, needle: string): MatchRange[] {
  const out: MatchRange[] = [];
  for (let at = line.indexOf(needle); at >= 0; at = line.indexOf(needle, at + needle.length))
    out.push([at, at + needle.length]);
  return out.slice(0, 100);
}

/** Lines over a small alphabet (so needles occur), with the characters a record escapes and non-ASCII. */
const char = fc.constantFrom("a", "b", "A", "B", " ", '"', "\\", "\n", "\t", "\u0001", "é", "😀", "p", "o", "1");
const text = fc.array(char, { maxLength: 24 }).map((cs) => cs.join(""));
const needle = fc.array(char, { minLength: 1, maxLength: 3 }).map((cs) => cs.join(""));

describe("the line matcher", () => {
  it("a case-sensitive literal finds exactly what includes finds, every occurrence", () => {
    for (const params of fuzzParams<[string, string]>("search literal"))
      fc.assert(
        fc.property(text, needle, (line, q) => {
          const got = compileSearch({ pattern: q, matchCase: true })(line);
          expect(got !== null).toBe(line.includes(q));
          if (got) expect(got).toEqual(occurrences(line, q));
        }),
        params,
      );
  });

  it("a case-insensitive literal finds what lower-casing finds (ASCII)", () => {
    const ascii = fc.array(fc.constantFrom("a", "b", "A", "B", " ", "."), { maxLength: 24 }).map((cs) => cs.join(""));
    const q = fc
      .array(fc.constantFrom("a", "b", "A", "B", "."), { minLength: 1, maxLength: 3 })
      .map((cs) => cs.join(""));
    for (const params of fuzzParams<[string, string]>("search literal nocase"))
      fc.assert(
        fc.property(ascii, q, (line, pattern) => {
          const got = compileSearch({ pattern })(line);
          expect(got).toEqual(line.toLowerCase().includes(pattern.toLowerCase()) ? expect.anything() : null);
          if (got) expect(got).toEqual(occurrences(line.toLowerCase(), pattern.toLowerCase()));
        }),
        params,
      );
  });

  it("an RE2 expression matches the ranges the JS engine matches, on patterns both read alike", () => {
    // Safe patterns: literals, classes, the any-character dot, quantifiers, alternation and groups; no \r in lines.
    const atom = fc.constantFrom("a", "b", "A", ".", "[ab]", "[^a]", "\\d", "\\s", "x");
    const quant = fc.constantFrom("", "", "*", "+", "?", "{1,2}");
    const piece = fc.tuple(atom, quant).map(([a, q]) => a + q);
    const seq = fc.array(piece, { minLength: 1, maxLength: 4 }).map((ps) => ps.join(""));
    const pattern = fc.oneof(
      seq,
      fc.tuple(seq, seq).map(([a, b]) => `${a}|${b}`),
      fc.tuple(seq, seq).map(([a, b]) => `(${a})${b}`),
    );
    const line = fc
      .array(fc.constantFrom("a", "b", "A", "x", " ", "1", "é"), { maxLength: 20 })
      .map((cs) => cs.join(""));
    for (const params of fuzzParams<[string, string, boolean]>("search regex"))
      fc.assert(
        fc.property(pattern, line, fc.boolean(), (p, l, matchCase) => {
          const js = new RegExp(p, matchCase ? "g" : "gi");
          const want: MatchRange[] = [...l.matchAll(js)].map((m) => [m.index, m.index + m[0].length]);
          const got = compileSearch({ pattern: p, regex: true, matchCase })(l);
          expect(got ?? []).toEqual(want.slice(0, 100));
        }),
        params,
      );
  });

  it("refuses an empty or over-long pattern, and an expression RE2 does not take, as INVALID_ARGUMENT", () => {
    for (const pattern of ["", "x".repeat(MAX_PATTERN_CHARS + 1)])
      expect(() => compileSearch({ pattern })).toThrow(RunnerDepotError);
    for (const pattern of ["(a)\\1", "(?=a)", "a{1001}", "("]) {
      try {
        compileSearch({ pattern, regex: true });
        expect.unreachable();
      } catch (error) {
        expect((error as RunnerDepotError).code).toBe("INVALID_ARGUMENT");
      }
    }
    // A pattern that backtracks exponentially in a backtracking engine is linear here.
    expect(compileSearch({ pattern: "(x+x+)+y", regex: true })("x".repeat(50_000))).toBeNull();
  });
});

describe("search through a real fs log store", () => {
  let dir: string;
  let logs: JobLogStore;
  let jobs = 0;
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), "runner-depot-search-"));
    logs = createFsLogStore(dir, { fsync: false });
  });
  afterAll(async () => {
    await logs.close?.();
    await rm(dir, { recursive: true, force: true });
  });

  /** Stores `lines` as a job's log (every third line timed), returns its ID. */
  async function store(lines: string[]): Promise<string> {
    const id = `00000000-0000-4000-8000-${String(++jobs).padStart(12, "0")}`;
    await logs.open(id);
    const t0 = Date.now();
    const entries: LogEntry[] = lines.map((line, i) => ({
      stored: [{ line, stderr: i % 5 === 0, ...(i % 3 === 0 ? { time: t0 + i } : {}) }],
      stderr: i % 5 === 0,
      bytes: line.length + 16,
    }));
    for (let at = 0; at < entries.length; at += 500) await logs.append(id, at, entries.slice(at, at + 500));
    return id;
  }

  /** Every matching position, page by page (small pages: the cursor is exercised). */
  async function all(id: string, pattern: string, regex: boolean, limit: number, matchCase = true): Promise<number[]> {
    const out: number[] = [];
    for (let from = 0; ;) {
      const page = await searchJobLog(logs, id, { pattern, regex, matchCase, from, limit });
      for (const m of page.matches) {
        expect(m.ranges.length).toBeGreaterThan(0);
        out.push(m.position);
      }
      if (page.end) return out;
      expect(page.next).toBeGreaterThan(from);
      from = page.next;
    }
  }

  it(
    "finds exactly the lines includes finds, on the fast path and the read path",
    async () => {
      // Long logs sometimes: lines past several strides of the sparse index (256 lines).
      const log = fc.oneof(
        fc.array(text, { maxLength: 40 }),
        fc
          .tuple(fc.array(text, { maxLength: 20 }), fc.integer({ min: 200, max: 900 }))
          .map(([seed, n]) => Array.from({ length: n }, (_, i) => seed[i % Math.max(1, seed.length)] ?? "")),
      );
      const runs = Math.max(20, Math.round(fuzzRuns() / 20));
      for (const params of fuzzParams<[string[], string, number]>("search fs store", { numRuns: runs }))
        await fc.assert(
          fc.asyncProperty(log, needle, fc.integer({ min: 1, max: 7 }), async (lines, q, limit) => {
            const id = await store(lines);
            const want = lines.flatMap((l, i) => (l.includes(q) ? [i] : []));
            expect(await all(id, q, false, limit)).toEqual(want);
            // The same literal as an escaped RE2 expression goes through `read`.
            const escaped = q.replace(/[\\^$.*+?()[\]{}|]/g, "\\$&");
            expect(await all(id, escaped, true, limit)).toEqual(want);
            // Without case: the fast path for an ASCII needle (Latin-1 block, an `i` RegExp), else `read`; the line
            // matcher (held to lower-casing above) says which lines match.
            const nocase = compileSearch({ pattern: q });
            const wantNocase = lines.flatMap((l, i) => (nocase(l) ? [i] : []));
            expect(await all(id, q, false, limit, false)).toEqual(wantNocase);
          }),
          { ...params, numRuns: Math.min(params.numRuns ?? runs, runs) },
        );
    },
    fuzzTimeout(120_000),
  );
});

describe("search through a real fs log store, past its read chunks", () => {
  it("finds needles in lines that straddle the 4 MiB read chunks, or outgrow them, at their positions", async () => {
    const dir = await mkdtemp(join(tmpdir(), "runner-depot-search-big-"));
    const logs = createFsLogStore(dir, { fsync: false });
    try {
      const id = "00000000-0000-4000-8000-00000000b16a";
      await logs.open(id);
      // 40 lines of 100 KiB (one of 5 MiB) with a needle at each line's end, between 3,000 short lines each: ~13 MiB, ~120k lines.
      const lines: string[] = [];
      const want: number[] = [];
      for (let block = 0; block < 40; block++) {
        for (let i = 0; i < 3000; i++) lines.push(`short ${block}.${i} "quoted" \\ back`);
        want.push(lines.length);
        // Block 20's line is longer than a read: the scan's buffer grows for it.
        lines.push(`${"x".repeat(block === 20 ? 5 * 1024 * 1024 : 100 * 1024)} NEEDLE-${block}`);
      }
      for (let at = 0; at < lines.length; at += 4096)
        await logs.append(
          id,
          at,
          lines
            .slice(at, at + 4096)
            .map((line) => ({ stored: [{ line, stderr: false }], stderr: false, bytes: line.length })),
        );
      const found: number[] = [];
      for (let from = 0; ;) {
        const page = await searchJobLog(logs, id, { pattern: "NEEDLE-", matchCase: true, from, limit: 7 });
        for (const m of page.matches) {
          found.push(m.position);
          expect(m.line.slice(m.ranges[0]![0], m.ranges[0]![1])).toBe("NEEDLE-");
        }
        if (page.end) break;
        from = page.next;
      }
      expect(found).toEqual(want);
      const quoted = await searchJobLog(logs, id, { pattern: '"quoted" \\', matchCase: true, from: 90_000, limit: 3 });
      expect(quoted.matches.map((m) => m.position)).toEqual([90_000, 90_001, 90_002]);
    } finally {
      await logs.close?.();
      await rm(dir, { recursive: true, force: true });
    }
  }, 60_000);
});
