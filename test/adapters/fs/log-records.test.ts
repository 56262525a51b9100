/**
 * The fs log store's records (src/adapters/fs/log-records.ts): every line, time and flag
 * round-trips through encodeRecords and decodeRecord, received lines (bytes) and plain ones
 * alike, and records written before per-line times (o/e/O/E) still read.
 */
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { decodeRecord, encodeRecords, timeBase } from "../../../src/adapters/fs/log-records.js";
import { ReceivedLine } from "../../../src/runner/protocol/received-line.js";
import { fromMicros, MAX_MICROS } from "../../../src/runner/protocol/line-time.js";
import type { StoredLine } from "../../../src/runner/ports.js";
import { fuzzParams } from "../../fuzz/settings.js";

const BASE = timeBase("2026-11-29T08:00:00.123Z");

const stored: fc.Arbitrary<StoredLine> = fc
  .record({
    line: fc.oneof(fc.string({ unit: "binary", maxLength: 30 }), fc.string({ unit: "grapheme-ascii", maxLength: 30 })),
    stderr: fc.boolean(),
    marker: fc.boolean(),
    // No time, or µs around the base: before it (an agent's clock behind), within a day, or far off.
    us: fc.oneof(
      fc.constant(0),
      fc.integer({ min: BASE - 10_000_000, max: BASE + 86_400_000_000 }),
      fc.integer({ min: 1, max: 2 ** 42 * 1000 - 1 }), // kept to the µs until 2109 (line-time.ts)
      fc.constantFrom(1, MAX_MICROS), // the extremes a hostile agent can send
    ),
    serverTime: fc.boolean(),
    received: fc.boolean(),
  })
  .map(({ line, stderr, marker, us, serverTime, received }) => {
    const out: StoredLine =
      received && !marker
        ? new ReceivedLine(
            "id",
            Buffer.concat([Buffer.from("xx"), Buffer.from(line, "utf8")]),
            2,
            2 + Buffer.byteLength(line),
            stderr,
            fromMicros(us),
          )
        : { line, stderr, ...(marker ? { marker: true } : {}), ...(us > 0 ? { time: fromMicros(us) } : {}) };
    if (us > 0 && serverTime) out.serverTime = true;
    return out;
  });

/** What a store reads back for `line`: the port's plain shape. */
function plain(line: StoredLine): StoredLine {
  const text = line.line;
  const out: StoredLine = { line: text, stderr: line.stderr };
  if (line.marker) out.marker = true;
  if (line.time !== undefined && line.time > 0) {
    out.time = line.time;
    if (line.serverTime) out.serverTime = true;
  }
  return out;
}

describe("fs log records", () => {
  it("every line, flag and time round-trips (text as UTF-8 decodes it)", () => {
    for (const params of fuzzParams<[StoredLine[]]>("fs log records"))
      fc.assert(
        fc.property(fc.array(stored, { maxLength: 8 }), (lines) => {
          const { bytes, sizes } = encodeRecords(lines, BASE);
          expect(sizes.reduce((a, b) => a + b, 0)).toBe(bytes.length);
          const records = bytes.toString("utf8").split("\n").slice(0, -1);
          expect(records).toHaveLength(lines.length);
          const back = records.map((r) => decodeRecord(r, BASE));
          // A lone surrogate becomes U+FFFD in a received line's bytes, and is kept by JSON in a plain one.
          expect(back).toEqual(
            lines.map((l) => plain(l instanceof ReceivedLine ? Object.assign(plain(l), { line: l.line }) : l)),
          );
        }),
        params,
      );
  });

  it("reads records written before per-line times, and writes at most 8 bytes more a line within a day of the start", () => {
    expect(decodeRecord('o"old"', BASE)).toEqual({ line: "old", stderr: false });
    expect(decodeRecord('E"marker"', BASE)).toEqual({ line: "marker", stderr: true, marker: true });
    const untimed = encodeRecords([{ line: "x".repeat(100), stderr: false }], BASE).bytes.length;
    const timed = encodeRecords(
      [{ line: "x".repeat(100), stderr: false, time: fromMicros(BASE + 86_000_000_000) }],
      BASE,
    ).bytes.length;
    expect(timed - untimed).toBeLessThanOrEqual(8);
  });

  it("refuses a record whose flag or time is not one it writes", () => {
    for (const bad of ['x"a"', 'p"a"', "p12", 'z1"a"']) expect(() => decodeRecord(bad, BASE)).toThrow(/corrupt/);
  });
});
