/** The conformance suite of the PackageStore port (blobs and records). */
import { randomUUID } from "node:crypto";
import { describe, expect, it } from "vitest";
import { only, skipped, trackAdapters, healAfterEach } from "./register.js";
import { RunnerDepotError } from "../errors.js";
import type { PackageStore } from "../depot/ports.js";
import { brokenBody, chunked, collectAll, collectBytes, patternBytes, sha256Digest } from "./helpers.js";
import type { BackendOutage } from "./queue-suite.js";

/** Options of {@link describePackageStore}. */
export interface PackageStoreSuiteOptions<S extends PackageStore = PackageStore> {
  /** A second store on the same backing (restart, another replica): persistence cases. */
  reopen?: (store: S) => PackageStore | Promise<PackageStore>;
  /** The store implements `signBlobUrl` and its URLs can be fetched from this process. */
  signing?: boolean;
  /** The store implements `openBlob` (reads into the caller's buffers). */
  openBlob?: boolean;
  /** Backend failure cases, when the backend can be broken from the test. */
  outage?: Omit<BackendOutage<S>, "impatient">;
  /** Size of the large-blob case; default 12 MiB (several S3 multipart parts). */
  largeBlobBytes?: number;
  /** Writers in the compare-and-swap races; default 16. */
  racers?: number;
  /** Run only the blob or only the record half (for a BlobStore or RecordStore alone). */
  only?: "blobs" | "records";
}

async function failure(promise: Promise<unknown>): Promise<RunnerDepotError> {
  const error = await promise.then(
    () => null,
    (e: unknown) => e,
  );
  expect(error, "expected a rejection").toBeInstanceOf(RunnerDepotError);
  return error as RunnerDepotError;
}

/**
 * Registers the PackageStore conformance suite (vitest) for an adapter.
 *
 * @example
 * describePackageStore("fs", async () => createFsStore(await mkdtemp(join(tmpdir(), "depot-"))));
 */
export function describePackageStore<S extends PackageStore>(
  name: string,
  factory: () => S | Promise<S>,
  options: PackageStoreSuiteOptions<S> = {},
): void {
  describe(`PackageStore conformance: ${name}`, () => {
    const { fresh, again } = trackAdapters<PackageStore, S>(factory, options.reopen);
    const withReopen = options.reopen ? it : skipped;
    const racers = options.racers ?? 16;

    // `only` leaves the other half unregistered rather than skipped: it does not apply.
    if (options.only !== "records")
      describe("blobs", () => {
        it("putBlob hashes the streamed body; getBlob and statBlob return it", async () => {
          const store = await fresh();
          const bytes = patternBytes(300_001, 7);
          const info = await store.putBlob(chunked(bytes, 7_777));
          expect(info).toEqual({ digest: sha256Digest(bytes), size: bytes.length });
          expect(info.digest).toMatch(/^sha256:[0-9a-f]{64}$/);
          expect(await store.statBlob(info.digest)).toEqual({ size: bytes.length });
          const body = await store.getBlob(info.digest);
          expect(body).not.toBeNull();
          expect((await collectBytes(body!)).equals(bytes)).toBe(true);
        });

        it("an empty blob is a blob", async () => {
          const store = await fresh();
          const info = await store.putBlob(chunked(Buffer.alloc(0)));
          expect(info).toEqual({ digest: sha256Digest(""), size: 0 });
          expect(await store.statBlob(info.digest)).toEqual({ size: 0 });
          expect((await collectBytes((await store.getBlob(info.digest))!)).length).toBe(0);
        });

        it("putBlob is idempotent, also when the same content arrives concurrently", async () => {
          const store = await fresh();
          const bytes = patternBytes(200_000, 11);
          const first = await store.putBlob(chunked(bytes));
          const again = await Promise.all(Array.from({ length: 5 }, () => store.putBlob(chunked(bytes, 4096))));
          for (const info of again) expect(info).toEqual(first);
          expect((await collectBytes((await store.getBlob(first.digest))!)).equals(bytes)).toBe(true);
          const listed = (await collectAll(store.listBlobs())).filter((d) => d === first.digest);
          expect(listed).toHaveLength(1);
        });

        it("a large body streams through (multi-part) and reads back exactly", async () => {
          const store = await fresh();
          const bytes = patternBytes(options.largeBlobBytes ?? 12 * 1024 * 1024 + 13, 3);
          const info = await store.putBlob(chunked(bytes, 256 * 1024));
          expect(info).toEqual({ digest: sha256Digest(bytes), size: bytes.length });
          const back = await collectBytes((await store.getBlob(info.digest))!);
          expect(back.length).toBe(bytes.length);
          expect(sha256Digest(back)).toBe(info.digest);
        });

        it("expectedDigest that matches is accepted", async () => {
          const store = await fresh();
          const bytes = patternBytes(10_000, 5);
          const info = await store.putBlob(chunked(bytes), { expectedDigest: sha256Digest(bytes) });
          expect(info.digest).toBe(sha256Digest(bytes));
          expect(await store.statBlob(info.digest)).toEqual({ size: bytes.length });
        });

        it("a digest mismatch is DIGEST_MISMATCH and keeps nothing, small or multi-part", async () => {
          const store = await fresh();
          const before = new Set(await collectAll(store.listBlobs()));
          for (const size of [1000, options.largeBlobBytes ?? 12 * 1024 * 1024 + 13]) {
            const bytes = patternBytes(size, 21);
            const claimed = sha256Digest(patternBytes(size, 22));
            const error = await failure(store.putBlob(chunked(bytes, 256 * 1024), { expectedDigest: claimed }));
            expect(error.code).toBe("DIGEST_MISMATCH");
            expect(await store.statBlob(claimed)).toBeNull();
            expect(await store.statBlob(sha256Digest(bytes))).toBeNull();
            expect(await store.getBlob(claimed)).toBeNull();
          }
          expect(new Set(await collectAll(store.listBlobs()))).toEqual(before);
        });

        it("a mismatch never damages an already stored blob of the claimed digest", async () => {
          const store = await fresh();
          const good = patternBytes(50_000, 31);
          const info = await store.putBlob(chunked(good));
          const error = await failure(
            store.putBlob(chunked(patternBytes(50_000, 32)), { expectedDigest: info.digest }),
          );
          expect(error.code).toBe("DIGEST_MISMATCH");
          expect((await collectBytes((await store.getBlob(info.digest))!)).equals(good)).toBe(true);
        });

        it("maxBytes: a longer body is TOO_LARGE and keeps nothing; exactly maxBytes is fine", async () => {
          const store = await fresh();
          const before = new Set(await collectAll(store.listBlobs()));
          const bytes = patternBytes(100_001, 41);
          const error = await failure(store.putBlob(chunked(bytes, 10_000), { maxBytes: 100_000 }));
          expect(error.code).toBe("TOO_LARGE");
          expect(await store.statBlob(sha256Digest(bytes))).toBeNull();
          expect(new Set(await collectAll(store.listBlobs()))).toEqual(before);
          const exact = bytes.subarray(0, 100_000);
          expect(await store.putBlob(chunked(exact, 10_000), { maxBytes: 100_000 })).toEqual({
            digest: sha256Digest(exact),
            size: 100_000,
          });
        });

        it("a body that breaks off mid-stream rejects and keeps nothing", async () => {
          const store = await fresh();
          const before = new Set(await collectAll(store.listBlobs()));
          const bytes = patternBytes(400_000, 51);
          await expect(store.putBlob(brokenBody(bytes, 200_000, 50_000))).rejects.toBeInstanceOf(Error);
          expect(await store.statBlob(sha256Digest(bytes))).toBeNull();
          expect(await store.statBlob(sha256Digest(bytes.subarray(0, 200_000)))).toBeNull();
          expect(new Set(await collectAll(store.listBlobs()))).toEqual(before);
        });

        it("ranged reads return start..end inclusive", async () => {
          const store = await fresh();
          const bytes = patternBytes(1_000_003, 61);
          const { digest } = await store.putBlob(chunked(bytes, 65_536));
          for (const [start, end] of [
            [0, 0],
            [1, 3],
            [65_530, 65_545],
            [999_999, 1_000_002],
            [1_000_002, 1_000_002],
            [0, 1_000_002],
          ] as const) {
            const part = await collectBytes((await store.getBlob(digest, { start, end }))!);
            expect(part.equals(bytes.subarray(start, end + 1)), `range ${start}-${end}`).toBe(true);
          }
          expect(await store.getBlob(sha256Digest("absent"), { start: 0, end: 0 })).toBeNull();
        });

        only(options.openBlob)(
          "openBlob reads any position into the caller's buffer, and keeps reading a blob deleted meanwhile",
          async () => {
            const store = await fresh();
            const bytes = patternBytes(300_007, 53);
            const { digest } = await store.putBlob(chunked(bytes, 65_536));
            const reader = await store.openBlob!(digest);
            expect(reader).not.toBeNull();
            try {
              expect(reader!.size).toBe(bytes.length);
              const buffer = Buffer.alloc(70_000, 0xee);
              for (const [position, length] of [
                [0, 1],
                [65_530, 20],
                [1, 69_000],
                [299_990, 17],
              ] as const) {
                let got = 0;
                // A read may return fewer bytes than asked (as pread may); the rest follows.
                while (got < length) got += await reader!.read(buffer, 5 + got, length - got, position + got);
                expect(
                  buffer.subarray(5, 5 + got).equals(bytes.subarray(position, position + got)),
                  `at ${position}`,
                ).toBe(true);
              }
              expect(await reader!.read(buffer, 0, 10, bytes.length)).toBe(0);
              await store.deleteBlob(digest);
              expect(await reader!.read(buffer, 0, 10, 100)).toBe(10);
              expect(buffer.subarray(0, 10).equals(bytes.subarray(100, 110))).toBe(true);
            } finally {
              await reader!.close();
            }
            expect(await store.openBlob!(digest)).toBeNull();
            expect(await store.openBlob!(sha256Digest("absent"))).toBeNull();
          },
        );

        it("absent blobs: getBlob and statBlob are null, deleteBlob is fine", async () => {
          const store = await fresh();
          const absent = sha256Digest(randomUUID());
          expect(await store.getBlob(absent)).toBeNull();
          expect(await store.statBlob(absent)).toBeNull();
          await expect(store.deleteBlob(absent)).resolves.toBeUndefined();
        });

        it("listBlobs lists what is stored; deleteBlob removes one", async () => {
          const store = await fresh();
          const a = await store.putBlob(chunked(Buffer.from(`a ${randomUUID()}`)));
          const b = await store.putBlob(chunked(Buffer.from(`b ${randomUUID()}`)));
          let listed = await collectAll(store.listBlobs());
          expect(listed).toEqual(expect.arrayContaining([a.digest, b.digest]));
          for (const d of listed) expect(d).toMatch(/^sha256:[0-9a-f]{64}$/);
          expect(new Set(listed).size).toBe(listed.length);
          // In byte order (ports.ts): the small-blob tier merges a blob store's listing with its rows on it.
          expect(listed).toEqual([...listed].sort());
          await store.deleteBlob(a.digest);
          expect(await store.statBlob(a.digest)).toBeNull();
          expect(await store.getBlob(a.digest)).toBeNull();
          listed = await collectAll(store.listBlobs());
          expect(listed).not.toContain(a.digest);
          expect(listed).toContain(b.digest);
        });

        only(options.signing)("signBlobUrl gives a URL that serves the blob (and its ranges)", async () => {
          const store = await fresh();
          const bytes = patternBytes(123_457, 71);
          const { digest } = await store.putBlob(chunked(bytes));
          const url = await store.signBlobUrl!(digest, { expiresInSeconds: 120, filename: "pkg-1.0.0.tar" });
          expect(typeof url).toBe("string");
          const whole = await fetch(url!);
          expect(whole.status).toBe(200);
          expect(Buffer.from(await whole.arrayBuffer()).equals(bytes)).toBe(true);
          const part = await fetch(url!, { headers: { range: "bytes=100-199" } });
          expect(part.status).toBe(206);
          expect(Buffer.from(await part.arrayBuffer()).equals(bytes.subarray(100, 200))).toBe(true);
        });

        withReopen("blobs survive a reopen of the backing store", async () => {
          const store = await fresh();
          const bytes = patternBytes(70_000, 81);
          const { digest } = await store.putBlob(chunked(bytes));
          const other = await again(store);
          expect(await other.statBlob(digest)).toEqual({ size: bytes.length });
          expect((await collectBytes((await other.getBlob(digest))!)).equals(bytes)).toBe(true);
        });
      });

    if (options.only !== "blobs")
      describe("records", () => {
        const prefix = () => `suite-${randomUUID()}/`;

        it("getRecord of an absent key is null; create-only writes once", async () => {
          const store = await fresh();
          const key = `${prefix()}pkg/alpha`;
          expect(await store.getRecord(key)).toBeNull();
          const rev = await store.putRecord(key, { v: 1 }, { ifRevision: null });
          expect(typeof rev).toBe("string");
          expect(await store.putRecord(key, { v: 2 }, { ifRevision: null })).toBeNull();
          expect(await store.getRecord(key)).toEqual({ value: { v: 1 }, revision: rev });
        });

        it("deferSync writes answer as any write does; syncRecords, where offered, resolves once they are readable", async () => {
          const store = await fresh();
          const key = `${prefix()}deferred`;
          const r1 = await store.putRecord(key, { n: 1 }, { ifRevision: null, deferSync: true });
          expect(r1).not.toBeNull();
          expect(await store.putRecord(key, { n: 2 }, { ifRevision: null, deferSync: true })).toBeNull();
          const r2 = await store.putRecord(key, { n: 3 }, { ifRevision: r1!, deferSync: true });
          expect(r2).not.toBeNull();
          await store.syncRecords?.();
          expect(await store.getRecord(key)).toEqual({ value: { n: 3 }, revision: r2 });
        });

        it("compare-and-swap: the current revision wins, a stale one loses and writes nothing", async () => {
          const store = await fresh();
          const key = `${prefix()}catalog`;
          const r1 = (await store.putRecord(key, { n: 1 }, { ifRevision: null }))!;
          const r2 = await store.putRecord(key, { n: 2 }, { ifRevision: r1 });
          expect(r2).not.toBeNull();
          expect(r2).not.toBe(r1);
          expect(await store.putRecord(key, { n: 3 }, { ifRevision: r1 })).toBeNull();
          expect(await store.putRecord(key, { n: 3 }, { ifRevision: "no-such-revision" })).toBeNull();
          expect(await store.getRecord(key)).toEqual({ value: { n: 2 }, revision: r2 });
          expect(await store.putRecord(`${key}-absent`, { n: 1 }, { ifRevision: r2! })).toBeNull();
          expect(await store.getRecord(`${key}-absent`)).toBeNull();
        });

        it(`a compare-and-swap race of ${racers} writers has exactly one winner`, async () => {
          const store = await fresh();
          const stores: PackageStore[] = [store];
          if (options.reopen) stores.push(await again(store));
          const key = `${prefix()}pkg/race`;
          const base = (await store.putRecord(key, { writer: -1 }, { ifRevision: null }))!;
          const outs = await Promise.all(
            Array.from({ length: racers }, (_, i) =>
              stores[i % stores.length]!.putRecord(key, { writer: i }, { ifRevision: base }),
            ),
          );
          const winners = outs.map((rev, i) => ({ rev, i })).filter((o) => o.rev !== null);
          expect(winners).toHaveLength(1);
          expect(await store.getRecord(key)).toEqual({ value: { writer: winners[0]!.i }, revision: winners[0]!.rev });
        });

        it(`a create-only race of ${racers} writers has exactly one winner`, async () => {
          const store = await fresh();
          const stores: PackageStore[] = [store];
          if (options.reopen) stores.push(await again(store));
          const key = `${prefix()}version/pkg/1.0.0`;
          const outs = await Promise.all(
            Array.from({ length: racers }, (_, i) =>
              stores[i % stores.length]!.putRecord(key, { writer: i }, { ifRevision: null }),
            ),
          );
          const winners = outs.map((rev, i) => ({ rev, i })).filter((o) => o.rev !== null);
          expect(winners).toHaveLength(1);
          expect((await store.getRecord(key))?.value).toEqual({ writer: winners[0]!.i });
        });

        it("a read-modify-write loop of concurrent incrementers loses no update", async () => {
          const store = await fresh();
          const key = `${prefix()}counter`;
          await store.putRecord(key, { n: 0 }, { ifRevision: null });
          const workers = 8;
          const each = 5;
          await Promise.all(
            Array.from({ length: workers }, async () => {
              for (let done = 0; done < each;) {
                const cur = (await store.getRecord<{ n: number }>(key))!;
                if (await store.putRecord(key, { n: cur.value.n + 1 }, { ifRevision: cur.revision })) done++;
              }
            }),
          );
          expect((await store.getRecord<{ n: number }>(key))?.value.n).toBe(workers * each);
        });

        it("deleteRecord honours the revision; a re-created record never reuses an old revision", async () => {
          const store = await fresh();
          const key = `${prefix()}trans/x`;
          const r1 = (await store.putRecord(key, "one", { ifRevision: null }))!;
          const r2 = (await store.putRecord(key, "two", { ifRevision: r1 }))!;
          expect(await store.deleteRecord(key, { ifRevision: r1 })).toBe(false);
          expect((await store.getRecord(key))?.value).toBe("two");
          expect(await store.deleteRecord(key, { ifRevision: r2 })).toBe(true);
          expect(await store.getRecord(key)).toBeNull();
          expect(await store.deleteRecord(key)).toBe(false);
          const r3 = (await store.putRecord(key, "three", { ifRevision: null }))!;
          expect([r1, r2]).not.toContain(r3);
          expect(await store.putRecord(key, "stale", { ifRevision: r1 })).toBeNull();
          expect(await store.putRecord(key, "stale", { ifRevision: r2 })).toBeNull();
          expect(await store.deleteRecord(key, { ifRevision: null })).toBe(true);
          expect(await store.getRecord(key)).toBeNull();
        });

        it("values round-trip as JSON: objects, arrays, strings, numbers, booleans, null", async () => {
          const store = await fresh();
          const p = prefix();
          const values: unknown[] = [
            { name: "pkg", versions: ["1.0.0", "1.2.0-rc.1"], nested: { deep: [1, { x: null }] }, z: 1, a: 2 },
            ["a", 2, true, null],
            'plain ünïcødé ✓ 🚀 \u0000 "quoted" \\ back',
            1234567.125,
            0,
            false,
            null,
          ];
          for (const [i, v] of values.entries()) {
            const rev = await store.putRecord(`${p}${i}`, v, { ifRevision: null });
            expect(rev).not.toBeNull();
            expect((await store.getRecord(`${p}${i}`))?.value).toEqual(v);
          }
        });

        it("listRecords: prefix match in byte order, paged without loss or repetition", async () => {
          const store = await fresh();
          const p = prefix();
          const inside = ["pkg/a", "pkg/b", "pkg/b/c", "pkg/B", "pkg/é", "pkg/z", "pkg/_x", "pkg/%y", "pkg/0"].map(
            (k) => p + k,
          );
          const outside = [`${p}pk`, `${p}pkgx`, `${p}pkh/a`, `${p}Pkg/a`, `${p.slice(0, -1)}`];
          for (const k of [...outside, ...inside]) await store.putRecord(k, { k }, { ifRevision: null });
          const byteOrder = [...inside].sort((x, y) => Buffer.compare(Buffer.from(x), Buffer.from(y)));
          const all = await store.listRecords(`${p}pkg/`);
          expect(all.keys).toEqual(byteOrder);
          expect(all.cursor).toBeUndefined();
          const paged: string[] = [];
          let cursor: string | undefined;
          let pages = 0;
          do {
            const page = await store.listRecords(`${p}pkg/`, { cursor, limit: 2 });
            expect(page.keys.length).toBeLessThanOrEqual(2);
            paged.push(...page.keys);
            cursor = page.cursor;
            pages++;
          } while (cursor !== undefined && pages < 50);
          expect(paged).toEqual(byteOrder);
          expect((await store.listRecords(`${p}pkg/_`)).keys).toEqual([`${p}pkg/_x`]);
          expect((await store.listRecords(`${p}pkg/%`)).keys).toEqual([`${p}pkg/%y`]);
          expect((await store.listRecords(`${p}nothing/`)).keys).toEqual([]);
          expect((await store.listRecords(p)).keys).toHaveLength(inside.length + outside.length - 1);
        });

        withReopen("records survive a reopen of the backing store", async () => {
          const store = await fresh();
          const key = `${prefix()}pkg/persist`;
          const rev = (await store.putRecord(key, { kept: true }, { ifRevision: null }))!;
          const other = await again(store);
          expect(await other.getRecord(key)).toEqual({ value: { kept: true }, revision: rev });
          expect(await other.putRecord(key, { kept: 2 }, { ifRevision: rev })).not.toBeNull();
        });
      });

    it("close twice is harmless", async () => {
      const store = await fresh();
      await store.close?.();
      await store.close?.();
    });

    const outage = options.outage;
    if (outage)
      describe("backend outage", () => {
        const { broken } = healAfterEach<S>((store) => outage.heal(store));

        it("writes fail while the backend is down and nothing is half-written", async () => {
          const store = await fresh();
          const records = options.only !== "blobs";
          const blobs = options.only !== "records";
          const key = `suite-${randomUUID()}/pkg/down`;
          const rev = records ? (await store.putRecord(key, { v: 1 }, { ifRevision: null }))! : "";
          const bytes = patternBytes(300_000, 91);
          broken(store);
          await outage!.break(store);
          if (records) await expect(store.putRecord(key, { v: 2 }, { ifRevision: rev })).rejects.toBeInstanceOf(Error);
          if (blobs) await expect(store.putBlob(chunked(bytes))).rejects.toBeInstanceOf(Error);
          await outage!.heal(store);
          if (records) {
            expect(await store.getRecord(key)).toEqual({ value: { v: 1 }, revision: rev });
            expect(await store.putRecord(key, { v: 2 }, { ifRevision: rev })).not.toBeNull();
          }
          if (blobs) {
            expect(await store.statBlob(sha256Digest(bytes))).toBeNull();
            expect((await store.putBlob(chunked(bytes))).digest).toBe(sha256Digest(bytes));
          }
        });
      });
  });
}
