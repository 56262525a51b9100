/**
 * Fuzz target: the count of commas outside strings (json-values.ts) that bounds a JSON LogItem before connect parses
 * it. For any JSON value, as JSON.stringify writes it (strings with every escape, nested arrays and objects), the
 * count is exactly one fewer than the elements of each array and object, summed, up to the bound; for any bytes it
 * never throws and never counts more commas than the bytes hold. Seeds: test/fuzz/settings.ts.
 */
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { MAX_JSON_COMMAS, countJsonCommas, jsonCountRefusal } from "../../src/runner/protocol/json-values.js";
import { fuzzParams, fuzzTimeout } from "./settings.js";

/** The commas JSON.stringify writes between the elements of `value`'s arrays and objects. */
function structuralCommas(value: unknown): number {
  if (Array.isArray(value)) return Math.max(0, value.length - 1) + value.reduce((n, v) => n + structuralCommas(v), 0);
  if (value !== null && typeof value === "object") {
    const values = Object.values(value);
    return Math.max(0, values.length - 1) + values.reduce((n: number, v) => n + structuralCommas(v), 0);
  }
  return 0;
}

/** Strings full of what a string scan must step over: quotes, backslashes, commas, escapes, non-ASCII. */
const tricky = fc.string({ unit: fc.constantFrom('"', "\\", ",", "\\,", '\\"', "a", "é", "\n", "\u0001", "😀") });

describe("countJsonCommas", () => {
  it(
    "counts exactly the commas between values, whatever the strings hold",
    () => {
      const value = fc.letrec((tie) => ({
        node: fc.oneof(
          { depthSize: "small" },
          tricky,
          fc.jsonValue({ maxDepth: 2 }),
          fc.array(tie("node"), { maxLength: 8 }),
          fc.dictionary(tricky, tie("node"), { maxKeys: 6 }),
        ),
      })).node;
      for (const params of fuzzParams("json commas")) {
        fc.assert(
          fc.property(value, fc.integer({ min: 0, max: 8 }), (v, pad) => {
            const bytes = Buffer.from(" ".repeat(pad) + JSON.stringify(v) + " ".repeat(pad));
            const want = structuralCommas(v);
            const got = countJsonCommas(bytes, 0, bytes.length);
            expect(got).toBe(Math.min(want, MAX_JSON_COMMAS + 1));
            expect(jsonCountRefusal(got) !== null).toBe(want > MAX_JSON_COMMAS);
          }),
          params,
        );
      }
    },
    fuzzTimeout(20_000),
  );

  it(
    "takes any bytes, within any range, without throwing or counting a comma that is not there",
    () => {
      for (const params of fuzzParams("json commas bytes")) {
        fc.assert(
          fc.property(fc.uint8Array({ maxLength: 300 }), fc.nat(), fc.nat(), (bytes, a, b) => {
            const start = bytes.length === 0 ? 0 : a % (bytes.length + 1);
            const end = start + (b % (bytes.length - start + 1));
            const got = countJsonCommas(bytes, start, end);
            const commas = bytes.subarray(start, end).filter((x) => x === 0x2c).length;
            expect(got).toBeGreaterThanOrEqual(0);
            expect(got).toBeLessThanOrEqual(commas);
          }),
          params,
        );
      }
    },
    fuzzTimeout(20_000),
  );

  it("refuses one value past the bound and takes the bound", () => {
    const run = (lines: number) =>
      Buffer.from(JSON.stringify({ requestId: "r", run: { lines: Array(lines).fill("x") } }));
    const at = (lines: number) => countJsonCommas(run(lines), 0, run(lines).length);
    // requestId,run and the lines' commas: a run of MAX_JSON_COMMAS lines is within, past it is not.
    expect(at(MAX_JSON_COMMAS - 1)).toBe(MAX_JSON_COMMAS - 1);
    expect(at(MAX_JSON_COMMAS)).toBe(MAX_JSON_COMMAS);
    expect(jsonCountRefusal(at(MAX_JSON_COMMAS))).toBeNull();
    expect(jsonCountRefusal(at(MAX_JSON_COMMAS + 1))).toContain("split it");
  });
});
