/** Fuzz targets of the console: the ANSI line renderer (any job output) and the catalog cursor (any URL). */
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { RunnerDepotError } from "../../src/errors.js";
import { parseAnsiLine } from "../../src/console/client/ansi.js";
import { decodeCursor, encodeCursor } from "../../src/console/packages.js";
import { fuzzParams } from "./settings.js";

// Job output skewed toward what terminals see: escapes, CR, BS, tabs, digits, semicolons.
const piece = fc.oneof(
  fc.constantFrom(
    "\u001b[",
    "\u001b]",
    "\u001b\\",
    "\u0007",
    "\r",
    "\b",
    "\t",
    ";",
    "m",
    "K",
    "G",
    "38;5;",
    "48;2;",
    "0",
    "1",
    "31",
    "255",
    "999999",
  ),
  fc.string({ maxLength: 8 }),
  fc.string({ unit: "binary", maxLength: 4 }),
);
const line = fc.array(piece, { maxLength: 60 }).map((parts) => parts.join(""));

describe("fuzz: console", () => {
  it("the ANSI renderer never throws, never shows an escape or control character, and stays within the line's size", () => {
    for (const params of fuzzParams("console ansi")) {
      fc.assert(
        fc.property(line, (input) => {
          const runs = parseAnsiLine(input);
          const shown = runs.map((r) => r.text).join("");
          expect(shown).not.toMatch(/[\u0000-\u0008\u000a-\u001f\u007f]/);
          // Tabs become spaces (at most 8 per tab); column moves fill with spaces up to 4096.
          expect(shown.length).toBeLessThanOrEqual(input.length * 8 + 4096);
          for (const run of runs) {
            expect(run.text.length).toBeGreaterThan(0);
            expect(run.cls).toMatch(/^(a-[bdiusfg]\d*( |$))*$/);
            for (const color of [run.fg, run.bg])
              if (color !== undefined) expect(color).toMatch(/^rgb\(\d{1,3},\d{1,3},\d{1,3}\)$/);
          }
        }),
        params,
      );
    }
  });

  it("plain printable text comes back unchanged", () => {
    const printable = fc.string({ maxLength: 200 }).map((s) => s.replace(/[\u0000-\u001f\u007f]/g, ""));
    for (const params of fuzzParams("console ansi plain")) {
      fc.assert(
        fc.property(printable, (input) => {
          // Lone surrogates take a cell each: the text is the same code units.
          expect(
            parseAnsiLine(input)
              .map((r) => r.text)
              .join(""),
          ).toBe(input);
        }),
        params,
      );
    }
  });

  it("the catalog cursor decodes any input to a state or INVALID_ARGUMENT, and round-trips", () => {
    for (const params of fuzzParams("console catalog cursor")) {
      fc.assert(
        fc.property(
          fc.oneof(
            fc.string({ maxLength: 1200 }),
            fc.base64String({ maxLength: 200 }).map((s) => s.replace(/[+/=]/g, "_")),
          ),
          (input) => {
            try {
              const state = decodeCursor(input);
              expect(state.d === null || typeof state.d === "string").toBe(true);
              expect(typeof state.n).toBe("string");
            } catch (error) {
              expect(error).toBeInstanceOf(RunnerDepotError);
              expect((error as RunnerDepotError).code).toBe("INVALID_ARGUMENT");
            }
          },
        ),
        params,
      );
      fc.assert(
        fc.property(fc.option(fc.string({ maxLength: 100 })), fc.string({ maxLength: 64 }), (d, n) => {
          expect(decodeCursor(encodeCursor({ d, n }))).toEqual({ d, n });
        }),
        params,
      );
    }
  });
});
