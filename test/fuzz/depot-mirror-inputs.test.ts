/**
 * Property tests of what yank and the mirror parse from others: a yank reason (Pkg-Reason, decoded),
 * an upstream's feed page (publish, yank, attestation and removal entries), a batch of blobs cut into pieces, and the size field of the manifest's tar header. Each either returns a value
 * meeting its documented rule or throws a RunnerDepotError with its documented code — nothing else.
 */
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { parseYankReason, YANK_REASON_MAX } from "../../src/depot/catalog/yank.js";
import { headerSize } from "../../src/depot/mirror/upstream-manifest.js";
import { parseFeedPage, Pieces } from "../../src/depot/mirror/upstream.js";
import { RunnerDepotError } from "../../src/errors.js";
import { fuzzParams } from "./settings.js";

function outcome<T>(fn: () => T): { ok: true; value: T } | { ok: false; code: string } {
  try {
    return { ok: true, value: fn() };
  } catch (error) {
    if (!(error instanceof RunnerDepotError)) throw error;
    return { ok: false, code: error.code };
  }
}

const change = fc.record(
  {
    position: fc.oneof(fc.integer({ min: -2, max: 40 }), fc.double(), fc.constant("3")),
    name: fc.oneof(fc.constantFrom("lib", "app"), fc.string({ maxLength: 8 }), fc.integer()),
    version: fc.oneof(fc.constantFrom("1.0.0", "2.0.0-rc.1"), fc.string({ maxLength: 8 })),
    yanked: fc.oneof(fc.string({ maxLength: 10 }), fc.constant(null), fc.integer()),
    attested: fc.oneof(
      fc.constant(`sha256:${"ab".repeat(32)}`),
      fc.stringMatching(/^sha256:[0-9a-f]{60,66}$/),
      fc.string({ maxLength: 12 }),
      fc.constant(null),
    ),
    removed: fc.oneof(fc.constant(true), fc.constant(false), fc.string({ maxLength: 4 })),
    extra: fc.anything(),
  },
  { requiredKeys: [] },
);

describe("yank and mirror inputs", () => {
  it("a yank reason is 1 to 1,024 characters without control characters, or BAD_REQUEST", () => {
    const text = fc.oneof(
      fc.string({ maxLength: 40 }),
      fc.string({ unit: "binary", maxLength: 40 }),
      fc.string({ minLength: 1000, maxLength: 1100 }),
      fc.constantFrom("", "   ", "ok", " padded ", "tab\there", "line\nbreak", "\u0085nel", "x".repeat(1024)),
    );
    for (const params of fuzzParams<[string]>("yank reason"))
      fc.assert(
        fc.property(text, (raw) => {
          const got = outcome(() => parseYankReason(raw));
          if (!got.ok) {
            expect(got.code).toBe("BAD_REQUEST");
            return;
          }
          expect(got.value).toBe(raw.trim());
          expect(got.value.length).toBeGreaterThan(0);
          expect(got.value.length).toBeLessThanOrEqual(YANK_REASON_MAX);
          expect(/\p{Cc}/u.test(got.value)).toBe(false);
        }),
        params,
      );
  });

  it("a feed page is trusted only whole: positions in (since, position], ascending, typed members", () => {
    const page = fc.record(
      {
        position: fc.oneof(fc.integer({ min: -1, max: 40 }), fc.constant(null), fc.constant(1e20)),
        changes: fc.oneof(fc.array(change, { maxLength: 6 }), fc.constant(null), fc.string()),
      },
      { requiredKeys: [] },
    );
    const body = fc.oneof(page, fc.anything());
    for (const params of fuzzParams<[unknown, number]>("feed page"))
      fc.assert(
        fc.property(body, fc.integer({ min: 0, max: 20 }), (raw, since) => {
          const got = outcome(() => parseFeedPage(raw, since, 5));
          if (!got.ok) {
            expect(got.code).toBe("UNAVAILABLE");
            return;
          }
          const { position, changes, more } = got.value;
          expect(position).toBeGreaterThanOrEqual(since);
          expect(changes.length).toBeLessThanOrEqual(5);
          expect(more).toBe(changes.length === 5);
          let last = since;
          for (const c of changes) {
            expect(c.position).toBeGreaterThan(last);
            expect(c.position).toBeLessThanOrEqual(position);
            expect(typeof c.name).toBe("string");
            expect(typeof c.version).toBe("string");
            const members = ["position", "name", "version", "yanked", "attested", "removed"];
            expect(Object.keys(c).every((k) => members.includes(k))).toBe(true);
            if ("yanked" in c) expect(c.yanked === null || typeof c.yanked === "string").toBe(true);
            // A yank entry is never also an attestation entry; an attestation names a bundle digest.
            if ("attested" in c) {
              expect("yanked" in c).toBe(false);
              expect(c.attested).toMatch(/^sha256:[0-9a-f]{64}$/);
            }
            // A removal entry is only that, and says `true`.
            if ("removed" in c) {
              expect(c.removed).toBe(true);
              expect("yanked" in c || "attested" in c).toBe(false);
            }
            last = c.position;
          }
        }),
        params,
      );
  });

  it("a batch of blobs is cut into exactly the pieces asked, whatever the chunking, or UNAVAILABLE when short", async () => {
    const blobs = fc.array(fc.uint8Array({ maxLength: 40 }), { maxLength: 6 });
    for (const params of fuzzParams<[Uint8Array[], number[], number]>("blob pieces"))
      await fc.assert(
        fc.asyncProperty(
          blobs,
          fc.array(fc.integer({ min: 1, max: 17 }), { maxLength: 30 }),
          fc.nat(5),
          async (parts, cuts, short) => {
            const whole = Buffer.concat(parts);
            const sent = whole.subarray(0, Math.max(0, whole.length - short));
            async function* chunks() {
              let at = 0;
              for (const cut of cuts) {
                if (at >= sent.length) break;
                yield sent.subarray(at, at + cut);
                at += cut;
              }
              if (at < sent.length) yield sent.subarray(at);
            }
            const pieces = new Pieces(chunks(), "http://upstream");
            const got: Buffer[] = [];
            try {
              for (const part of parts) {
                const bytes: Uint8Array[] = [];
                for await (const chunk of pieces.take(part.length)) bytes.push(chunk);
                got.push(Buffer.concat(bytes));
              }
            } catch (error) {
              expect(error instanceof RunnerDepotError && error.code).toBe("UNAVAILABLE");
              expect(sent.length).toBeLessThan(whole.length);
              return;
            }
            expect(sent.length).toBe(whole.length);
            got.forEach((bytes, i) => expect(bytes.equals(Buffer.from(parts[i]!))).toBe(true));
          },
        ),
        params,
      );
  });

  it("the manifest header's size is the octal field or NaN, never a partial parse", () => {
    const field = fc.oneof(
      fc.stringMatching(/^[0-7]{1,11}[\0 ]{0,1}$/),
      fc.string({ unit: "binary-ascii", maxLength: 12 }),
    );
    for (const params of fuzzParams<[string]>("tar size field"))
      fc.assert(
        fc.property(field, (text) => {
          const header = Buffer.alloc(512);
          header.write(text.slice(0, 12), 124, "latin1");
          const size = headerSize(header);
          const trimmed = text.slice(0, 12).replace(/[\0 ]+$/, "");
          if (/^[0-7]{1,11}$/.test(trimmed)) expect(size).toBe(Number.parseInt(trimmed, 8));
          else expect(Number.isNaN(size)).toBe(true);
        }),
        params,
      );
  });
});
