/** Fuzz target: the W3C `traceparent` parser (any header text) and its round trip. */
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { parseTraceparent } from "../../src/traceparent.js";
import { fuzzParams } from "./settings.js";

const hex = (n: number) => fc.stringMatching(new RegExp(`^[0-9a-f]{${n}}$`));

describe("fuzz: traceparent", () => {
  it("any input parses to a valid span context or null, nothing else", () => {
    const input = fc.oneof(
      fc.string({ maxLength: 600 }),
      fc
        .tuple(hex(2), hex(32), hex(16), hex(2), fc.string({ maxLength: 20 }))
        .map(([v, t, s, f, rest]) => `${v}-${t}-${s}-${f}${rest}`),
    );
    for (const params of fuzzParams("traceparent parse")) {
      fc.assert(
        fc.property(input, (text) => {
          const ctx = parseTraceparent(text);
          if (ctx === null) return;
          expect(ctx.traceId).toMatch(/^[0-9a-f]{32}$/);
          expect(ctx.traceId).not.toMatch(/^0+$/);
          expect(ctx.spanId).toMatch(/^[0-9a-f]{16}$/);
          expect(ctx.spanId).not.toMatch(/^0+$/);
          expect([0, 1]).toContain(ctx.traceFlags);
          expect(ctx.isRemote).toBe(true);
          expect(text.trim().startsWith("ff-")).toBe(false);
        }),
        params,
      );
    }
  });

  it("every valid version-00 value round-trips", () => {
    const valid = fc.tuple(hex(32), hex(16), hex(2)).filter(([t, s]) => !/^0+$/.test(t) && !/^0+$/.test(s));
    for (const params of fuzzParams("traceparent round trip")) {
      fc.assert(
        fc.property(valid, ([traceId, spanId, flags]) => {
          const ctx = parseTraceparent(`00-${traceId}-${spanId}-${flags}`);
          expect(ctx).toMatchObject({ traceId, spanId, traceFlags: Number.parseInt(flags, 16) & 1 });
        }),
        params,
      );
    }
  });

  it("refuses what the spec refuses", () => {
    const t = "4bf92f3577b34da6a3ce929d0e0e4736";
    const s = "00f067aa0ba902b7";
    expect(parseTraceparent(`00-${t}-${s}-01`)).toMatchObject({ traceId: t, spanId: s, traceFlags: 1 });
    expect(parseTraceparent(`00-${t}-${s}-01-extra`)).toBeNull(); // version 00 has exactly four fields
    expect(parseTraceparent(`01-${t}-${s}-01-extra`)).toMatchObject({ traceId: t }); // later versions may add fields
    expect(parseTraceparent(`ff-${t}-${s}-01`)).toBeNull();
    expect(parseTraceparent(`00-${"0".repeat(32)}-${s}-01`)).toBeNull();
    expect(parseTraceparent(`00-${t}-${"0".repeat(16)}-01`)).toBeNull();
    expect(parseTraceparent(`00-${t.toUpperCase()}-${s}-01`)).toBeNull();
    expect(parseTraceparent(`00-${t}-${s}-01`.padEnd(600, " "))).toBeNull();
    expect(parseTraceparent(null)).toBeNull();
    expect(parseTraceparent(`00-${t}-${s}-01`, "vendor=value")?.traceState?.get("vendor")).toBe("value");
  });
});
