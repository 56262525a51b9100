/**
 * The job-log cap's counting rule (runner/service/log-cap.ts) against what each store writes:
 * for any line, its cost is at least the fs store's record (JSON-escaped) and the memory and
 * PostgreSQL stores' bytes + 13, and a line counts the same given as bytes or as text.
 */
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { encodeRecords } from "../../../src/adapters/fs/log-records.js";
import { LINE_RECORD_OVERHEAD, lineCapCost, textCapCost } from "../../../src/runner/service/log-cap.js";
import { ReceivedLine } from "../../../src/runner/protocol/received-line.js";

/** Any text, with control characters, quotes and backslashes far likelier than at random. */
const text = fc.oneof(
  fc.string({ unit: "binary", maxLength: 64 }),
  fc.string({
    unit: fc.constantFrom("\u0000", "\u0001", "\n", "\t", '"', "\\", "a", "é", "😀", "\u001f"),
    maxLength: 64,
  }),
);

describe("log-cap: what a line counts toward the job's cap", () => {
  it("is never below any store's record of the line, and bytes and text agree", () => {
    fc.assert(
      // Any time up to the cap line-time.ts puts on one (2^52 µs), counted from a base of 0.
      fc.property(text, fc.boolean(), fc.integer({ min: 0, max: Math.floor(2 ** 52 / 1000) }), (line, stderr, time) => {
        const buf = Buffer.from(line, "utf8");
        // As the fast path hands it over: the UTF-8 bytes (a lone surrogate already U+FFFD).
        const received = new ReceivedLine("id", buf, 0, buf.length, stderr);
        received.time = time;
        const fromBytes = lineCapCost(buf, 0, buf.length);
        expect(fromBytes).toBe(textCapCost(received.line));
        // The fs store's record, both ways it writes one.
        expect(encodeRecords([received], 0).sizes[0]!).toBeLessThanOrEqual(fromBytes);
        expect(encodeRecords([{ line, stderr, time }], 0).sizes[0]!).toBeLessThanOrEqual(textCapCost(line));
        // Memory and PostgreSQL: the UTF-8 bytes, a 4-byte end, a flag byte and an 8-byte time.
        expect(buf.length + 13).toBeLessThanOrEqual(fromBytes);
        expect(textCapCost(line)).toBeGreaterThanOrEqual(LINE_RECORD_OVERHEAD + Buffer.byteLength(line));
      }),
      { numRuns: 2000 },
    );
  });

  it("counts an empty line its overhead, a plain line its bytes + the overhead, a control character 6", () => {
    expect(lineCapCost(Buffer.alloc(0), 0, 0)).toBe(LINE_RECORD_OVERHEAD);
    expect(textCapCost("")).toBe(LINE_RECORD_OVERHEAD);
    expect(textCapCost("héllo")).toBe(LINE_RECORD_OVERHEAD + 6);
    expect(textCapCost("\u0001")).toBe(LINE_RECORD_OVERHEAD + 6);
    expect(textCapCost("\n\t")).toBe(LINE_RECORD_OVERHEAD + 4);
    expect(textCapCost("\ud800")).toBe(LINE_RECORD_OVERHEAD + 6);
  });
});
