/** Fuzz target: the job-list cursor decoder (any string from a URL) and its round trip. */
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { RunnerDepotError } from "../../src/errors.js";
import { decodeJobCursor, encodeJobCursor } from "../../src/runner/service/job-list.js";
import { fuzzParams } from "./settings.js";

describe("fuzz: job cursor", () => {
  it("any input decodes to a valid key or throws INVALID_ARGUMENT, nothing else", () => {
    const input = fc.oneof(
      fc.string({ maxLength: 300 }),
      fc.base64String({ maxLength: 120 }).map((s) => s.replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "")),
    );
    for (const params of fuzzParams("job cursor decode")) {
      fc.assert(
        fc.property(input, (text) => {
          try {
            const key = decodeJobCursor(text);
            expect(Date.parse(key.createdAt)).not.toBeNaN();
            expect(key.requestId).toMatch(/^[0-9a-f-]{36}$/);
          } catch (error) {
            expect(error).toBeInstanceOf(RunnerDepotError);
            expect((error as RunnerDepotError).code).toBe("INVALID_ARGUMENT");
          }
        }),
        params,
      );
    }
  });

  it("every key round-trips", () => {
    const key = fc.record({
      createdAt: fc
        .date({ min: new Date(0), max: new Date("9999-12-31T23:59:59.999Z"), noInvalidDate: true })
        .map((d) => d.toISOString()),
      requestId: fc.uuid().map((u) => u.toLowerCase()),
    });
    for (const params of fuzzParams("job cursor round trip")) {
      fc.assert(
        fc.property(key, (k) => {
          expect(decodeJobCursor(encodeJobCursor(k))).toEqual(k);
        }),
        params,
      );
    }
  });
});
