/**
 * Fuzz target: pageOfCommitted, the streamed pages of a committed transaction's manifest blob, against the obvious
 * oracle (JSON.parse the whole manifest, slice its items). Whatever the manifest's JSON layout (indent, white space
 * between any tokens, `\uXXXX` escapes, key order: licences before or after the items, other keys between them, the
 * items not last), its strings (quotes, backslashes, brackets, commas, control characters, multi-byte text) and the
 * chunks the store answers a range in (token boundaries anywhere):
 * - walking the pages along `next` with one `hints` map (a client on one replica) gives the items, in order, each
 *   page with the manifest's licences, `next` null exactly on the last page, and a hint left for the next page;
 * - every cursor of that walk asked with an empty `hints` map (another replica) gives the same page;
 * - a second walk with another `limit`, and cursors at any offset, on the same hints, give slices too;
 * - a cursor that is not 1 to 9 digits is BAD_REQUEST.
 */
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { createMemoryStore } from "../../src/adapters/memory/store.js";
import type { ManifestItem, ManifestLicense } from "../../src/depot/package/archive.js";
import type { PackageStore } from "../../src/depot/ports.js";
import { pageOfCommitted, type ManifestHint } from "../../src/depot/transactions/summary.js";
import { RunnerDepotError } from "../../src/errors.js";
import { fuzzParams, fuzzTimeout } from "./settings.js";

/** Characters that would end a scan early if strings, escapes or nesting were not followed, and multi-byte ones. */
const tricky = fc.constantFrom(...'"\\[]{},: \n\r\t/\u0000\u001f\u007f\u2028\u2029é€😀u0x');
/** Text of every kind: any code point, grapheme clusters, or the tricky characters. */
const text = (maxLength: number) =>
  fc.oneof(
    fc.string({ unit: "binary", maxLength }),
    fc.string({ unit: "grapheme", maxLength }),
    fc.string({ unit: tricky, maxLength }),
  );
/** A path, sometimes long (a few KiB), so a manifest outgrows the first 16 KiB read and items straddle ranges. */
const path = fc.oneof(
  { weight: 30, arbitrary: text(16) },
  {
    weight: 1,
    arbitrary: fc
      .tuple(text(4), fc.string({ unit: tricky, minLength: 1, maxLength: 3 }), fc.nat({ max: 1200 }))
      .map(([head, unit, n]) => head + unit.repeat(n)),
  },
);
const digestText = fc.oneof(
  fc.string({ unit: fc.constantFrom(..."0123456789abcdef"), minLength: 64, maxLength: 64 }).map((h) => `sha256:${h}`),
  text(8),
);
const item: fc.Arbitrary<ManifestItem> = fc
  .tuple(
    fc.record(
      {
        type: fc.constantFrom("file", "dir", "link"),
        path,
        mode: fc.oneof(fc.integer({ min: 0, max: 0o7777 }), fc.integer()),
        size: fc.oneof(fc.nat({ max: 4096 }), fc.maxSafeNat()),
        digest: digestText,
        target: text(12),
      },
      { requiredKeys: ["type", "path", "mode", "size"] },
    ),
    // Not a field the depot writes: nested arrays and objects inside an item, for the scanner's depth.
    fc.option(fc.jsonValue({ maxDepth: 3, stringUnit: "binary" }), { freq: 4, nil: undefined }),
  )
  .map(([fields, extra]) => (extra === undefined ? fields : { ...fields, extra })) as fc.Arbitrary<ManifestItem>;
const license: fc.Arbitrary<ManifestLicense> = fc.record({
  name: text(8),
  path: text(12),
  size: fc.nat(),
  digest: digestText,
});
/** The manifest's other top-level keys (not `items` nor `licenses`), with any JSON values (scalars too). */
const others = fc.uniqueArray(
  fc.tuple(
    fc.oneof(fc.constantFrom("name", "version", "attributes", "requires", "extra"), text(6)),
    fc.oneof(
      fc.jsonValue({ maxDepth: 3, stringUnit: "binary" }),
      fc.dictionary(text(6), text(12), { maxKeys: 4 }),
      fc.array(fc.record({ name: text(6), range: text(6) }), { maxLength: 3 }),
    ),
  ),
  { maxLength: 4, selector: ([k]) => k },
);

/** How the manifest is written: JSON.stringify with an indent, or with any white space and escapes JSON allows. */
const layout = fc.oneof(
  fc.record({ kind: fc.constant("indent" as const), indent: fc.constantFrom<number | string>(0, 1, 2, "\t") }),
  fc.record({
    kind: fc.constant("spaced" as const),
    spaces: fc.array(fc.constantFrom("", "", " ", "\n", "\t", "\r", "\r\n", " \t\n  "), {
      minLength: 1,
      maxLength: 16,
    }),
    escapes: fc.array(fc.boolean(), { minLength: 1, maxLength: 8 }),
  }),
);
type Layout = typeof layout extends fc.Arbitrary<infer T> ? T : never;

/** A JSON string of `s`, each code point (per `escape`) as itself or as `\uXXXX` escapes; `/` as `\/` then. */
function quote(s: string, escape: () => boolean): string {
  let out = '"';
  for (const ch of s) {
    if (!escape()) out += JSON.stringify(ch).slice(1, -1);
    else if (ch === "/") out += "\\/";
    else
      for (let i = 0; i < ch.length; i++) {
        const hex = ch.charCodeAt(i).toString(16).padStart(4, "0");
        out += `\\u${i % 2 === 0 ? hex : hex.toUpperCase()}`;
      }
  }
  return out + '"';
}

/** `value` as JSON with `space()` around every token and `escape()` choosing each string character's spelling. */
function spaced(value: unknown, space: () => string, escape: () => boolean): string {
  if (typeof value === "string") return quote(value, escape);
  if (value === null || typeof value !== "object") return JSON.stringify(value);
  const members: string[] = Array.isArray(value)
    ? value.map((v) => space() + spaced(v, space, escape) + space())
    : Object.entries(value).map(([k, v]) => entry(k, v, space, escape));
  const [open, close] = Array.isArray(value) ? ["[", "]"] : ["{", "}"];
  return open + (members.length === 0 ? space() : members.join(",")) + close;
}
function entry(key: string, value: unknown, space: () => string, escape: () => boolean): string {
  return space() + quote(key, escape) + space() + ":" + space() + spaced(value, space, escape) + space();
}

/** The manifest's text: its top-level keys in `entries` order (JSON.stringify puts integer-like keys first). */
function write(entries: Array<[string, unknown]>, how: Layout): string {
  if (how.kind === "indent") return JSON.stringify(Object.fromEntries(entries), null, how.indent);
  let s = 0;
  let e = 0;
  const space = () => how.spaces[s++ % how.spaces.length]!;
  const escape = () => how.escapes[e++ % how.escapes.length]!;
  return (
    space() +
    "{" +
    (entries.length === 0 ? space() : entries.map(([k, v]) => entry(k, v, space, escape)).join(",")) +
    "}" +
    space()
  );
}

/**
 * The store with its blob ranges answered in chunks of the given sizes, in turn (a token's bytes split anywhere; 0 an
 * empty chunk), and every range asked checked to lie within the blob.
 */
function chunkedStore(inner: PackageStore, sizes: number[]): PackageStore {
  let turn = 0;
  return {
    ...inner,
    async getBlob(digest, range) {
      const size = (await inner.statBlob(digest))?.size;
      if (range && size !== undefined) {
        expect(range.start).toBeGreaterThanOrEqual(0);
        expect(range.end).toBeGreaterThanOrEqual(range.start);
        expect(range.end).toBeLessThan(size);
      }
      const body = await inner.getBlob(digest, range);
      if (!body) return body;
      return (async function* () {
        const parts: Uint8Array[] = [];
        for await (const c of body) parts.push(c);
        const all = Buffer.concat(parts);
        for (let at = 0; at < all.length;) {
          const n = sizes[turn++ % sizes.length]!;
          yield all.subarray(at, at + n);
          at += n;
        }
      })();
    },
  };
}

// 0: an empty chunk (nothing in the store port rules one out); every list holds a size that moves on.
const chunkSizes = fc
  .array(
    fc.oneof(
      fc.constant(0),
      fc.integer({ min: 1, max: 4 }),
      fc.integer({ min: 1, max: 64 }),
      fc.integer({ min: 1, max: 20_000 }),
    ),
    { minLength: 1, maxLength: 10 },
  )
  .map((sizes) => (sizes.some((n) => n > 0) ? sizes : [...sizes, 1]));
const limit = fc.integer({ min: 1, max: 20 });
/** Cursors pageOfCommitted must refuse: anything but 1 to 9 ASCII digits (a 64-hex cursor of an open one too). */
const badCursor = fc.oneof(
  fc.string({ unit: "binary", maxLength: 12 }).filter((s) => !/^\d{1,9}$/.test(s)),
  fc.string({ unit: fc.constantFrom(..."0123456789"), minLength: 10, maxLength: 14 }),
  fc.string({ unit: fc.constantFrom(..."0123456789abcdef"), minLength: 64, maxLength: 64 }),
  fc.constantFrom("", "-1", "+1", "1.0", "1e3", " 1", "1 ", "1\n", "0x10", "١", "１"),
);

const manifestCase = fc.record({
  // Any length to 60: fast-check's default size would keep to about 10.
  items: fc.oneof(fc.array(item, { maxLength: 60 }), fc.array(item, { maxLength: 60, size: "max" })),
  licenses: fc.array(license, { maxLength: 3 }),
  others,
  /** Where the licences and the items go among the other keys. */
  licensesAt: fc.nat(),
  itemsAt: fc.nat(),
  layout,
  chunks: chunkSizes,
  limit,
  /** A second walk's limit, on the same hints. */
  limit2: limit,
  /** Pages asked at any offset (past the end too), on the same hints. */
  probes: fc.array(fc.tuple(fc.nat({ max: 65 }), limit), { maxLength: 3 }),
  bad: badCursor,
});

type Page = { items: ManifestItem[]; next: string | null; licenses: ManifestLicense[] };

describe("fuzz: summary pages of a committed manifest", () => {
  it(
    "pages along next (one hints map or none) are the parsed manifest's items sliced, with its licences",
    async () => {
      for (const params of fuzzParams("summary pages"))
        await fc.assert(
          fc.asyncProperty(manifestCase, async (c) => {
            const entries: Array<[string, unknown]> = c.others.filter(([k]) => k !== "items" && k !== "licenses");
            entries.splice(c.licensesAt % (entries.length + 1), 0, ["licenses", c.licenses]);
            entries.splice(c.itemsAt % (entries.length + 1), 0, ["items", c.items]);
            const manifest = write(entries, c.layout);
            // The oracle: the whole manifest parsed.
            const parsed = JSON.parse(manifest) as { items: ManifestItem[]; licenses: ManifestLicense[] };
            const all = parsed.items;
            const licenses = parsed.licenses;
            expect(all).toHaveLength(c.items.length);

            const inner = createMemoryStore();
            const { digest } = await inner.putBlob(
              (async function* () {
                yield Buffer.from(manifest);
              })(),
            );
            const store = chunkedStore(inner, c.chunks);
            const expected = (after: string | undefined, limit: number): Page => {
              const start = after === undefined ? 0 : Number(after);
              const next = start + limit < all.length ? String(start + limit) : null;
              return { items: all.slice(start, start + limit), next, licenses };
            };

            // A client's walk on one replica: one hints map.
            const hints = new Map<string, ManifestHint>();
            const walk = async (limit: number) => {
              const cursors: Array<string | undefined> = [];
              const walked: ManifestItem[] = [];
              let after: string | undefined;
              for (let pages = 0; ; pages++) {
                expect(pages).toBeLessThanOrEqual(all.length / limit + 1);
                cursors.push(after);
                const page = await pageOfCommitted(store, digest, { limit, after }, hints);
                expect(page).toEqual(expected(after, limit));
                walked.push(...page!.items);
                if (page!.next === null) break;
                // The next page on this replica starts from where this one stopped.
                expect(hints.has(`${digest}@${page!.next}`)).toBe(true);
                after = page!.next;
              }
              expect(walked).toEqual(all);
              return cursors;
            };
            const cursors = await walk(c.limit);

            // Each of its cursors asked on another replica (no hints).
            for (const after of cursors)
              expect(await pageOfCommitted(store, digest, { limit: c.limit, after }, new Map())).toEqual(
                expected(after, c.limit),
              );

            // Another limit, and any offsets, with the hints the first walk left.
            await walk(c.limit2);
            for (const [at, limit] of c.probes) {
              const after = String(at);
              expect(await pageOfCommitted(store, digest, { limit, after }, hints)).toEqual(expected(after, limit));
            }

            // A malformed cursor.
            const refused = await pageOfCommitted(store, digest, { limit: c.limit, after: c.bad }, hints).then(
              () => null,
              (error: unknown) => error,
            );
            expect(refused).toBeInstanceOf(RunnerDepotError);
            expect((refused as RunnerDepotError).code).toBe("BAD_REQUEST");
          }),
          params,
        );
    },
    // ~10 s alone; CI runs it beside three other files on two cores.
    fuzzTimeout(300_000),
  );
});
