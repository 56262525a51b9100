/**
 * Property tests of the archive assembler (src/depot/package/archive.ts, depot/package/tar-header.ts) against
 * tar-stream, the writer every published digest came from: for random manifests (long
 * paths that need the ustar prefix or PAX, Unicode, links with long or Unicode targets,
 * directories, empty files, licences) the assembled bytes equal tar-stream's pack byte
 * for byte, and every Range read equals the same slice of the whole archive.
 */
import { createHash } from "node:crypto";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { createMemoryStore } from "../../src/adapters/memory/index.js";
import {
  archiveLayout,
  commitArchive,
  readArchive,
  type ManifestItem,
  type PackageManifest,
} from "../../src/depot/package/archive.js";
import { encodeTarHeader, type TarHeaderFields } from "../../src/depot/package/tar-header.js";
import { referenceArchive } from "../fixtures/archive-reference.js";
import { fuzzParams } from "./settings.js";

const require = createRequire(import.meta.url);
// tar-stream's own header encoder (not exported; loaded by file path) for fields too large to pack for real.
const tarHeaders = require(join(dirname(require.resolve("tar-stream")), "headers.js")) as {
  encode(h: object): Buffer | null;
  encodePax(h: object): Buffer;
};

const segment = fc.oneof(
  fc.stringMatching(/^[a-z0-9._-]{1,12}$/),
  fc.string({ unit: "grapheme", minLength: 1, maxLength: 6 }).filter((s) => !s.includes("/") && !s.includes("\0")),
  fc.stringMatching(/^[a-z]{60,120}$/),
);
const pathArb = fc.array(segment, { minLength: 1, maxLength: 6 }).map((parts) => parts.join("/"));
const targetArb = fc.oneof(
  pathArb,
  fc.constant("../x"),
  fc.stringMatching(/^[a-z/]{90,130}$/).filter((s) => s.length > 0),
);

interface Draft {
  item: ManifestItem;
  bytes?: Buffer;
}
const itemArb: fc.Arbitrary<Draft> = fc.oneof(
  fc
    .record({ path: pathArb, mode: fc.integer({ min: 1, max: 0o777 }), bytes: fc.uint8Array({ maxLength: 1500 }) })
    .map(({ path, mode, bytes }) => ({
      item: { type: "file" as const, path, mode, size: bytes.length, digest: "" },
      bytes: Buffer.from(bytes),
    })),
  fc
    .record({ path: pathArb, mode: fc.integer({ min: 1, max: 0o777 }) })
    .map(({ path, mode }) => ({ item: { type: "dir" as const, path, mode, size: 0 } })),
  fc
    .record({ path: pathArb, target: targetArb })
    .map(({ path, target }) => ({ item: { type: "link" as const, path, mode: 0o777, size: 0, target } })),
);
const caseArb = fc.record({
  drafts: fc.uniqueArray(itemArb, { maxLength: 8, selector: (d) => d.item.path }),
  licenses: fc.uniqueArray(
    fc.record({ name: fc.stringMatching(/^[A-Za-z0-9.+-]{1,20}$/), text: fc.string({ maxLength: 200 }) }),
    { maxLength: 2, selector: (l) => l.name },
  ),
  mtime: fc.integer({ min: 0, max: 2 ** 34 }),
  attributes: fc.dictionary(fc.stringMatching(/^[a-z]{1,8}$/), fc.string({ maxLength: 40 }), { maxKeys: 3 }),
});

type Case = typeof caseArb extends fc.Arbitrary<infer T> ? T : never;

/** Stores a random case's content in a memory store and returns its manifest. */
async function materialise(input: Case) {
  const store = createMemoryStore({ chunkBytes: 97 });
  const items: ManifestItem[] = [];
  for (const draft of input.drafts) {
    if (draft.bytes) {
      const blob = await store.putBlob([draft.bytes] as unknown as AsyncIterable<Uint8Array>);
      items.push({ ...draft.item, digest: blob.digest });
    } else items.push(draft.item);
  }
  const licenses = [];
  for (const license of input.licenses) {
    const blob = await store.putBlob([Buffer.from(license.text)] as unknown as AsyncIterable<Uint8Array>);
    licenses.push({ name: license.name, path: `.pkg/licenses/${license.name}`, size: blob.size, digest: blob.digest });
  }
  const manifest: PackageManifest = {
    name: "pkg",
    version: "1.0.0",
    publishedAt: new Date(0).toISOString(),
    attributes: input.attributes,
    requires: [],
    licenses,
    items,
  };
  return { store, manifest };
}

async function collect(chunks: AsyncIterable<Uint8Array>): Promise<Buffer> {
  const out: Buffer[] = [];
  for await (const chunk of chunks) out.push(Buffer.from(chunk));
  return Buffer.concat(out);
}

describe("archive assembly (fast-check)", () => {
  it("assembles exactly tar-stream's bytes for random manifests, and commitArchive hashes them", async () => {
    for (const params of fuzzParams("archive assembly vs tar-stream", { numRuns: 0 })) {
      await fc.assert(
        fc.asyncProperty(caseArb, async (input) => {
          const { store, manifest } = await materialise(input);
          const json = Buffer.from(JSON.stringify(manifest));
          const layout = archiveLayout(manifest, json, input.mtime);
          const assembled = await collect(readArchive(store, layout));
          const expected = await referenceArchive(manifest, input.mtime, (digest) => store.getBlob(digest), json);
          expect(assembled.length).toBe(layout.size);
          expect(assembled.equals(expected)).toBe(true);
          const info = await commitArchive(store, manifest, input.mtime);
          expect(info.size).toBe(expected.length);
          expect(info.digest).toBe(`sha256:${createHash("sha256").update(expected).digest("hex")}`);
          // fs and memory stores keep no archive blob.
          expect(await store.statBlob(info.digest)).toBeNull();
        }),
        { ...params, numRuns: Math.max(1, Math.round(params.numRuns! / 4)) },
      );
    }
  });

  it("answers every Range with the same slice of the whole archive", async () => {
    for (const params of fuzzParams("archive ranges")) {
      await fc.assert(
        fc.asyncProperty(
          caseArb,
          fc.array(fc.tuple(fc.nat(), fc.nat()), { minLength: 1, maxLength: 6 }),
          async (input, picks) => {
            const { store, manifest } = await materialise(input);
            const layout = archiveLayout(manifest, Buffer.from(JSON.stringify(manifest)), input.mtime);
            const whole = await collect(readArchive(store, layout));
            // Ranges anchored on part boundaries (tar headers, item bytes, padding, end blocks) and random ones.
            const edges = layout.parts
              .flatMap((p) => [p.offset, p.offset + p.length - 1, p.offset + p.length])
              .filter((o) => o < whole.length);
            for (const [a, b] of picks) {
              const start = a % 2 === 0 ? edges[a % edges.length]! : a % whole.length;
              const end = Math.min(whole.length - 1, b % 3 === 0 ? edges[b % edges.length]! : start + (b % 3000));
              if (end < start) continue;
              const slice = await collect(readArchive(store, layout, { start, end }));
              expect(slice.equals(whole.subarray(start, end + 1))).toBe(true);
            }
          },
        ),
        { ...params, numRuns: Math.max(1, Math.round(params.numRuns! / 4)) },
      );
    }
  });

  it("encodes every header exactly as tar-stream, including sizes past 8 GiB and mtimes past 11 octal digits", () => {
    const fieldsArb: fc.Arbitrary<TarHeaderFields> = fc.record({
      name: pathArb,
      type: fc.constantFrom("file" as const, "directory" as const, "symlink" as const),
      mode: fc.integer({ min: 0, max: 0o7777 }),
      size: fc.oneof(fc.nat(), fc.integer({ min: 0, max: Number.MAX_SAFE_INTEGER })),
      mtime: fc.integer({ min: 0, max: 2 ** 36 }),
      linkname: fc.option(targetArb, { nil: undefined }),
    });
    for (const params of fuzzParams("tar header encoder")) {
      fc.assert(
        fc.property(fieldsArb, (fields) => {
          const linkname = fields.type === "symlink" ? fields.linkname : undefined;
          const ours = encodeTarHeader({ ...fields, linkname });
          const header = {
            name: fields.name,
            type: fields.type,
            mode: fields.mode || (fields.type === "directory" ? 0o755 : 0o644),
            size: fields.type === "symlink" ? 0 : fields.size,
            mtime: new Date(fields.mtime * 1000),
            uid: 0,
            gid: 0,
            linkname,
          };
          const plain = tarHeaders.encode(header);
          if (plain) {
            expect(ours.equals(plain)).toBe(true);
            return;
          }
          // pack.js _encodePax, spelled out.
          const pax = tarHeaders.encodePax({ name: header.name, linkname: header.linkname });
          const paxHeader = { ...header, name: "PaxHeader", linkname: header.linkname && "PaxHeader" };
          const padding = Buffer.alloc((512 - (pax.length % 512)) % 512);
          const expected = Buffer.concat([
            tarHeaders.encode({ ...paxHeader, size: pax.length, type: "pax-header" })!,
            pax,
            padding,
            tarHeaders.encode(paxHeader)!,
          ]);
          expect(ours.equals(expected)).toBe(true);
        }),
        params,
      );
    }
  });
});
