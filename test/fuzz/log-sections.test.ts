/**
 * Property tests of section markers (docs/decisions/log-sections.md): parseSectionMarker on any line never throws
 * and keeps its bounds; a GitLab or GitHub marker with any name reads back as written (cut to 256 bytes); and the
 * record foldSections builds is the same however the lines are cut into appends, keeps its bounds and nesting, and
 * a follower seeded mid-log (sectionsBefore) reaches the same record — what every store and follow() rely on.
 */
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { parseSectionMarker } from "../../src/runner/protocol/section-marker.js";
import {
  foldSections,
  MAX_SECTION_DEPTH,
  MAX_SECTION_NAME_BYTES,
  MAX_SECTIONS,
  sectionsBefore,
} from "../../src/runner/service/log-sections.js";
import type { LogSectionEvent, LogSections, StoredLine } from "../../src/runner/ports.js";
import { fuzzParams, fuzzTimeout } from "./settings.js";

const ESC = "\x1b[0K";
/** Names as jobs print them, odd ones included: unicode, spaces, slashes, astral characters, very long. */
const name = fc.oneof(
  fc.constantFrom("build", "a.b-c_d", "step 1/2", "naïve ✓", "🚀", "x".repeat(300), "é".repeat(200)),
  fc.string({ unit: "grapheme", minLength: 1, maxLength: 40 }),
);
const cleanName = name.filter((n) => n.length > 0 && !/[[\r\x1b]/.test(n));
const time = fc.integer({ min: 0, max: 9_999_999_999 });

const markerLine = fc.oneof(
  fc
    .tuple(cleanName, time, fc.boolean())
    .map(([n, t, c]) => `${ESC}section_start:${t}:${n}${c ? "[collapsed=true]" : ""}\r${ESC}${n}`),
  fc.tuple(cleanName, time).map(([n, t]) => `${ESC}section_end:${t}:${n}\r${ESC}`),
  cleanName.map((n) => `section_start:1:${n}`),
  name.map((n) => `::group::${n}`),
  fc.constant("::endgroup::"),
);
/** Few names, so ends match starts often. */
const smallName = fc.constantFrom("a", "b", "c");
const line = fc.oneof(
  { weight: 3, arbitrary: smallName.map((n) => `${ESC}section_start:1700000000:${n}\r${ESC}`) },
  { weight: 3, arbitrary: smallName.map((n) => `${ESC}section_end:1700000001:${n}\r${ESC}`) },
  { weight: 2, arbitrary: smallName.map((n) => `::group::${n}`) },
  { weight: 2, arbitrary: fc.constant("::endgroup::") },
  { weight: 3, arbitrary: fc.string({ maxLength: 12 }) },
  { weight: 1, arbitrary: markerLine },
);
const stored = (text: string, i: number): StoredLine => ({ line: text, stderr: false, time: 1_700_000_000_000 + i });

function invariants(record: LogSections | undefined): void {
  const sections = record?.sections ?? [];
  expect(sections.length).toBeLessThanOrEqual(MAX_SECTIONS);
  const stack: number[] = [];
  for (let i = 0; i < sections.length; i++) {
    const s = sections[i]!;
    expect(Buffer.byteLength(s.name, "utf8")).toBeLessThanOrEqual(MAX_SECTION_NAME_BYTES);
    expect(s.depth).toBeLessThan(MAX_SECTION_DEPTH);
    if (i > 0) expect(s.start).toBeGreaterThan(sections[i - 1]!.start);
    if (s.end !== null) expect(s.end).toBeGreaterThan(s.start);
    // Its parent: the last earlier section still holding it, whose depth is one less.
    while (stack.length > 0) {
      const p = sections[stack.at(-1)!]!;
      if (p.end === null || p.end >= s.start) break;
      stack.pop();
    }
    expect(s.depth).toBe(stack.length);
    if (stack.length > 0) {
      const p = sections[stack.at(-1)!]!;
      // Nested inside its parent: it ends no later, and a parent still open holds only... anything.
      if (p.end !== null) expect(s.end !== null && s.end <= p.end).toBe(true);
    }
    stack.push(i);
  }
}

describe("log sections (fast-check)", () => {
  it(
    "parseSectionMarker never throws on any line, and keeps its bounds",
    () => {
      const anyLine = fc.oneof(
        fc.string({ unit: "binary", maxLength: 600 }),
        fc.tuple(fc.constantFrom(ESC, "", "::", "section_"), fc.string({ maxLength: 300 })).map(([a, b]) => a + b),
        markerLine,
      );
      for (const params of fuzzParams("section marker parse"))
        fc.assert(
          fc.property(anyLine, (text) => {
            const m = parseSectionMarker(text);
            if (m === null) return;
            expect(["start", "end"]).toContain(m.kind);
            expect(Buffer.byteLength(m.name, "utf8")).toBeLessThanOrEqual(MAX_SECTION_NAME_BYTES);
            if (m.time !== null) expect(Number.isFinite(m.time)).toBe(true);
          }),
          params,
        );
    },
    fuzzTimeout(20_000),
  );

  it(
    "a marker with any name reads back as written, cut to 256 bytes at a character boundary",
    () => {
      for (const params of fuzzParams("section marker round trip"))
        fc.assert(
          fc.property(cleanName, time, fc.boolean(), fc.constantFrom("gitlab", "github"), (n, t, c, format) => {
            const text =
              format === "gitlab"
                ? `${ESC}section_start:${t}:${n}${c ? "[collapsed=true]" : ""}\r${ESC}H`
                : `::group::${n}`;
            const m = parseSectionMarker(text)!;
            expect(m).not.toBeNull();
            expect(n.startsWith(m.name)).toBe(true);
            const bytes = Buffer.byteLength(m.name, "utf8");
            if (Buffer.byteLength(n, "utf8") <= MAX_SECTION_NAME_BYTES) expect(m.name).toBe(n);
            // Cut no shorter than needed: the next character would not have fitted.
            else
              expect(bytes + Buffer.byteLength(String.fromCodePoint(n.codePointAt(m.name.length)!))).toBeGreaterThan(
                MAX_SECTION_NAME_BYTES,
              );
            expect(m.format).toBe(format);
            if (format === "gitlab") {
              expect(m.time).toBe(String(t).length >= 13 ? t : t * 1000);
              expect(m.collapsed).toBe(c);
            }
          }),
          params,
        );
    },
    fuzzTimeout(20_000),
  );

  it(
    "the record is the same however the lines are cut into appends, bounded and nested, and a follower seeded anywhere agrees",
    () => {
      const logs = fc.tuple(fc.array(line, { maxLength: 120 }), fc.array(fc.nat(), { maxLength: 8 }), fc.nat());
      for (const params of fuzzParams("section fold"))
        fc.assert(
          fc.property(logs, ([texts, cuts, seed]) => {
            const lines = texts.map(stored);
            const whole = foldSections(undefined, lines, 0);
            invariants(whole);
            // Cut into appends at arbitrary points.
            const points = [...new Set(cuts.map((c) => (texts.length === 0 ? 0 : c % texts.length)))].sort(
              (a, b) => a - b,
            );
            let record: LogSections | undefined;
            let at = 0;
            for (const p of [...points, texts.length]) {
              record = foldSections(record, lines.slice(at, p), at);
              at = p;
            }
            expect(record).toEqual(whole);
            // A follower from line `from`: seeded with the record as it stood before, folding the rest, it reaches
            // the same record, and its events are the starts and ends at or after `from`.
            const from = texts.length === 0 ? 0 : seed % (texts.length + 1);
            const events: LogSectionEvent[] = [];
            const seeded = foldSections(sectionsBefore(whole, from), lines.slice(from), from, (e) => events.push(e));
            expect(seeded?.sections ?? []).toEqual(whole?.sections ?? []);
            const want = (whole?.sections ?? []).flatMap((s) => [
              ...(s.start >= from ? [["start", s.name, s.start]] : []),
              ...(s.end !== null && s.end >= from ? [["end", s.name, s.end]] : []),
            ]);
            const key = (e: unknown[]) => `${String(e[2]).padStart(6, "0")} ${e[0]} ${e[1]}`;
            expect(
              events
                .map((e) => [e.section, e.name, e.position])
                .map(key)
                .sort(),
            ).toEqual(want.map(key).sort());
          }),
          params,
        );
    },
    fuzzTimeout(60_000),
  );

  it("a million section_starts and as many ends keep the record at its bounds", () => {
    const lines: StoredLine[] = [];
    for (let i = 0; i < 1_000_000; i++) lines.push({ line: `section_start:1:s${i % 7}`, stderr: false });
    for (let i = 0; i < 1_000_000; i++) lines.push({ line: `section_end:2:s${i % 7}`, stderr: false });
    const record = foldSections(undefined, lines, 0)!;
    expect(record.sections).toHaveLength(MAX_SECTION_DEPTH);
    expect(record.dropped).toBe(1_000_000 - MAX_SECTION_DEPTH);
    const pairs: StoredLine[] = [];
    for (let i = 0; i < 500_000; i++)
      pairs.push({ line: `::group::${"g".repeat(300)}`, stderr: false }, { line: "::endgroup::", stderr: false });
    const flat = foldSections(undefined, pairs, 0)!;
    expect(flat.sections).toHaveLength(MAX_SECTIONS);
    expect(flat.dropped).toBe(500_000 - MAX_SECTIONS);
    expect(flat.unmatched).toBe(500_000 - MAX_SECTIONS);
    // The record's size is bounded by the counts and the name bound, whatever the log printed.
    expect(JSON.stringify(flat).length).toBeLessThan(MAX_SECTIONS * (MAX_SECTION_NAME_BYTES + 200));
  });
});
