/**
 * Property test of serve's readable log format (src/cli/serve-log.ts): whatever a line
 * holds — a pino record with hostile keys and values, or any string at all — the
 * formatted line is one line (no control character, so nothing can forge a second log
 * line), never throws, and keeps the message and every field's value recoverable.
 */
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { formatLogLine } from "../../src/cli/serve/serve-log.js";
import { fuzzParams } from "./settings.js";

const CONTROL = /[\u0000-\u001f\u007f-\u009f\u2028\u2029]/;

describe("serve log formatter", () => {
  it("any string: one line without control characters", () => {
    for (const params of fuzzParams("serve log formatter (strings)")) {
      fc.assert(
        fc.property(fc.string({ unit: "binary", maxLength: 200 }), (line) => {
          const formatted = formatLogLine(line);
          expect(formatted).not.toMatch(CONTROL);
        }),
        params,
      );
    }
  });

  it("a string value holding DEL, a C1 control or U+2028 is escaped, not passed through JSON.stringify raw", () => {
    // Found by the property below (seed 1965606275): JSON.stringify escapes only U+0000-U+001F.
    for (const raw of ["\u007f", "a\u0085b", "x\u2028y", "\u2029"]) {
      const formatted = formatLogLine(JSON.stringify({ level: 30, time: 0, msg: "m", field: raw }));
      expect(formatted).not.toMatch(CONTROL);
      expect(formatted).toContain(
        `field=${JSON.stringify(raw).replace(/[\u2028\u2029\u007f-\u009f]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`)}`,
      );
    }
  });

  it("a pino record: level, message and each field shown on one line", () => {
    const key = fc
      .string({ unit: "binary", minLength: 1, maxLength: 12 })
      .filter((k) => !["level", "time", "msg", "pid", "hostname", "__proto__"].includes(k));
    const value = fc.oneof(
      fc.string({ unit: "binary", maxLength: 40 }),
      fc.integer(),
      fc.boolean(),
      fc.constant(null),
      fc.array(fc.string({ maxLength: 5 }), { maxLength: 3 }),
    );
    const record = fc.record({
      level: fc.constantFrom(10, 20, 30, 40, 50, 60),
      time: fc.integer({ min: 0, max: 4_102_444_800_000 }),
      msg: fc.string({ unit: "binary", maxLength: 60 }),
      fields: fc.dictionary(key, value, { maxKeys: 5 }),
    });
    for (const params of fuzzParams("serve log formatter (records)")) {
      fc.assert(
        fc.property(record, ({ level, time, msg, fields }) => {
          const formatted = formatLogLine(JSON.stringify({ level, time, pid: 1, msg, ...fields }));
          expect(formatted).not.toMatch(CONTROL);
          expect(formatted.slice(0, 12)).toBe(new Date(time).toISOString().slice(11, 23));
          expect(formatted).toContain(["TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL"][level / 10 - 1]!);
          if (!CONTROL.test(msg)) expect(formatted).toContain(msg);
          for (const [k, v] of Object.entries(fields)) {
            if (CONTROL.test(k)) continue;
            const plain = typeof v === "string" && /^[^\s"=\u0000-\u001f\u007f-\u009f\u2028\u2029]+$/.test(v);
            expect(formatted).toContain(
              `${k}=${plain ? v : JSON.stringify(v).replace(/[\u2028\u2029\u007f-\u009f]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`)}`,
            );
          }
        }),
        params,
      );
    }
  });
});
