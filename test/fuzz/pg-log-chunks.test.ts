/**
 * Fuzz target: the PostgreSQL log store's chunk encoding (encodeLines) and the decoder of chunk
 * rows read back (decodeRows). The server's part (cutting a batch into rows with `substring`)
 * is done here the same way, so any lines, cut into any chunk sizes, read back from any window
 * equal what was written.
 */
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { decodeRows, encodeLines, LINE_META_BYTES } from "../../src/adapters/postgres/log-lines.js";
import type { ChunkRow } from "../../src/adapters/postgres/log-lines.js";
import type { StoredLine } from "../../src/runner/ports.js";
import { fuzzParams } from "./settings.js";

/** What the INSERT's SELECT makes of a batch (chunksFrom in log-lines.ts), positions from `first`. */
function rowsOf(lines: StoredLine[], first: number, limits: { lines: number; bytes: number }): ChunkRow[] {
  const batch = encodeLines(lines, 0, lines.length, limits);
  const cuts = batch.cuts;
  const rows: ChunkRow[] = [];
  for (let i = 0; i < cuts.length; i += 4) {
    const [l0, n, b0, bn] = cuts.slice(i, i + 4) as [number, number, number, number];
    rows.push({
      first: String(first + l0),
      bytes: batch.bytes.subarray(b0, b0 + bn),
      ends: batch.ends.subarray(4 * l0, 4 * (l0 + n)),
      flags: batch.flags.subarray(LINE_META_BYTES * l0, LINE_META_BYTES * (l0 + n)),
    });
  }
  return rows;
}

const line = fc.record({
  line: fc.oneof(fc.string({ unit: "binary", maxLength: 40 }), fc.string({ unit: "grapheme-ascii", maxLength: 300 })),
  stderr: fc.boolean(),
  marker: fc.boolean(),
  // No time, or any µs a double keeps exactly as ms (line-time.ts).
  micros: fc.oneof(fc.constant(0), fc.integer({ min: 1, max: 2 ** 42 * 1000 - 1 })),
  serverTime: fc.boolean(),
});

describe("fuzz: PostgreSQL log chunks", () => {
  it("any lines, any chunk bounds, any window: read back as written (UTF-8 round trip)", () => {
    const input = fc.record({
      lines: fc.array(line, { maxLength: 60 }),
      first: fc.nat({ max: 1_000_000 }),
      limits: fc.record({ lines: fc.integer({ min: 1, max: 10 }), bytes: fc.integer({ min: 1, max: 400 }) }),
      from: fc.nat({ max: 70 }),
      limit: fc.option(fc.integer({ min: 1, max: 70 }), { nil: undefined }),
    });
    for (const params of fuzzParams("pg log chunks")) {
      fc.assert(
        fc.property(input, ({ lines, first, limits, from, limit }) => {
          const stored: StoredLine[] = lines.map((l) => {
            const out: StoredLine = l.marker
              ? { line: l.line, stderr: l.stderr, marker: true }
              : { line: l.line, stderr: l.stderr };
            if (l.micros > 0) {
              out.time = l.micros / 1000;
              if (l.serverTime) out.serverTime = true;
            }
            return out;
          });
          const rows = rowsOf(stored, first, limits);
          // Every chunk keeps to its bounds unless one line alone is over them.
          for (const r of rows) {
            const n = r.ends!.length / 4;
            expect(n).toBeLessThanOrEqual(limits.lines);
            if (n > 1) expect(r.bytes.length).toBeLessThanOrEqual(limits.bytes);
          }
          expect(rows.reduce((sum, r) => sum + r.ends!.length / 4, 0)).toBe(stored.length);
          // The store's query: the chunk holding `from` and those after it, starting before from + limit.
          const at = first + from;
          const holding = Math.max(first, ...rows.map((r) => Number(r.first)).filter((f) => f <= at));
          const picked = rows.filter(
            (r) => Number(r.first) >= holding && (limit === undefined || Number(r.first) < at + limit),
          );
          const want = stored
            .slice(from, limit === undefined ? undefined : from + limit)
            .map((l) => ({ ...l, line: Buffer.from(l.line, "utf8").toString("utf8") }));
          expect(decodeRows(picked, at, limit)).toEqual(want);
        }),
        params,
      );
    }
  });

  it("rows written before per-line times (one flag byte a line) read as lines without times", () => {
    const row: ChunkRow = {
      first: "0",
      bytes: Buffer.from("ab"),
      ends: Buffer.from([0, 0, 0, 1, 0, 0, 0, 2]),
      flags: Buffer.from([1, 2]),
    };
    expect(decodeRows([row], 0)).toEqual([
      { line: "a", stderr: true },
      { line: "b", stderr: false, marker: true },
    ]);
  });
});
