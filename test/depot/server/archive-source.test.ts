/**
 * Archives assembled from stored items (issue 8 item 3), through the HTTP contract on a
 * listening fs-store depot: one copy of each item's bytes on disk however many versions
 * share it, Range reads equal to the same slice of the whole archive wherever they fall
 * (tar headers, item bytes, padding, end blocks), and garbage collection that follows
 * manifests (items of published versions stay; unreferenced blobs, including archive
 * blobs an older depot stored, go, while every digest still verifies).
 */
import { randomBytes } from "node:crypto";
import http from "node:http";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createFsStore } from "../../../src/adapters/fs/index.js";
import type { PackageManifest } from "../../../src/depot/package/archive.js";
import type { PackageStore } from "../../../src/depot/ports.js";
import { referenceArchive } from "../../fixtures/archive-reference.js";
import {
  add,
  openTransaction,
  parseTar,
  publish,
  startDepot,
  storeDigest,
  tempDir,
  type LiveDepot,
} from "../../fixtures/depot.js";

/** The bytes of every stored blob (files and the fs store's small-blob rows alike). */
async function blobBytes(store: PackageStore): Promise<number> {
  let total = 0;
  for await (const digest of store.listBlobs()) total += (await store.statBlob(digest))!.size;
  return total;
}

async function download(
  url: string,
  headers: Record<string, string> = {},
): Promise<{ status: number; bytes: Buffer; headers: Headers }> {
  const response = await fetch(url, { headers });
  return { status: response.status, bytes: Buffer.from(await response.arrayBuffer()), headers: response.headers };
}

describe("archives assembled from stored items (fs store, real HTTP)", () => {
  let depot: LiveDepot;
  let store: PackageStore;
  let dir: string;
  let cleanup: () => Promise<void>;
  let clock = Date.parse("2031-01-01T00:00:00Z");
  let blobOpens = 0;
  const shared = randomBytes(1024 * 1024 + 3); // not a multiple of 512: padding follows it

  beforeAll(async () => {
    ({ dir, cleanup } = await tempDir());
    const fsStore = createFsStore(dir, { unsafeNoSync: true });
    // The fs store itself, its blob opens counted: downloads on the Node handler must use them.
    store = { ...fsStore, openBlob: (digest) => ((blobOpens += 1), fsStore.openBlob!(digest)) };
    depot = await startDepot(store, { now: () => new Date(clock), gcGraceMs: 0 });
  });
  afterAll(async () => {
    await depot.close();
    await cleanup();
  });

  it("keeps one copy of a file shared by 3 versions of 3 packages (≤ 1.05× the unique bytes) and serves each archive with its digest", async () => {
    let unique = shared.length;
    for (const name of ["alpha", "beta", "gamma"]) {
      for (const version of ["1.0.0", "1.1.0", "2.0.0"]) {
        const own = `${name}@${version}\n`;
        unique += Buffer.byteLength(own);
        const committed = await publish(depot.url, `${name}@${version}`, [
          { type: "file", path: "data/big.bin", body: shared },
          { type: "file", path: "VERSION", body: own },
          { type: "dir", path: "empty", mode: "0750" },
        ]);
        expect(committed.status).toBe(201);
        const { digest } = (await committed.json()) as { digest: string };
        const got = await download(`${depot.url}/data/${name}@${version}`);
        expect(got.status).toBe(200);
        expect(storeDigest(got.bytes)).toBe(digest);
        expect(Number(got.headers.get("content-length"))).toBe(got.bytes.length);
        const entries = await parseTar(got.bytes);
        expect(entries.find((e) => e.name === "data/big.bin")!.body.equals(shared)).toBe(true);
      }
    }
    const onDisk = await blobBytes(store);
    // Manifests are the only other blobs (a few hundred bytes each).
    expect(onDisk).toBeGreaterThanOrEqual(unique);
    expect(onDisk).toBeLessThanOrEqual(1.05 * unique);
  });

  it("serves whole bytes to slow, fast, ranged and cut-off downloads at once (the Node handler reuses its read buffers)", async () => {
    // Bigger than loopback socket buffers absorb, so writes to a paused client queue up
    // while the server reads on: a reused buffer refilled too early would show in the bytes.
    const big = randomBytes(12 * 1024 * 1024 + 5);
    expect((await publish(depot.url, "large@1.0.0", [{ type: "file", path: "large.bin", body: big }])).status).toBe(
      201,
    );
    const url = `${depot.url}/data/large@1.0.0`;
    const full = await download(url);
    const digest = storeDigest(full.bytes);
    expect(full.bytes.indexOf(big)).toBeGreaterThan(0);
    const slow = () =>
      new Promise<Buffer>((resolve, reject) => {
        http.get(url, (response) => {
          const chunks: Buffer[] = [];
          response.pause();
          setTimeout(() => response.on("data", (chunk: Buffer) => chunks.push(chunk)).resume(), 300);
          response.on("end", () => resolve(Buffer.concat(chunks))).on("error", reject);
        });
      });
    const cut = async () => {
      const controller = new AbortController();
      const response = await fetch(url, { signal: controller.signal });
      const reader = response.body!.getReader();
      await reader.read();
      controller.abort();
      await reader.closed.catch(() => undefined);
    };
    const start = 3_000_001;
    const opensBefore = blobOpens;
    const [slowBodies, fast, , ranged] = await Promise.all([
      Promise.all(Array.from({ length: 3 }, slow)),
      Promise.all(Array.from({ length: 3 }, () => download(url))),
      Promise.all(Array.from({ length: 3 }, cut)),
      download(url, { Range: `bytes=${start}-` }),
    ]);
    for (const bytes of slowBodies) expect(storeDigest(bytes)).toBe(digest);
    for (const got of fast) expect(storeDigest(got.bytes)).toBe(digest);
    expect(ranged.status).toBe(206);
    expect(ranged.bytes.equals(full.bytes.subarray(start))).toBe(true);
    // Every transfer (3 slow, 3 fast, 3 cut, 1 ranged) read its item through openBlob's reused buffers.
    expect(blobOpens - opensBefore).toBeGreaterThanOrEqual(10);
  });

  it("answers Range reads across tar headers, item bytes, padding and end blocks with the same slice of the full archive", async () => {
    const full = await download(`${depot.url}/data/alpha@1.0.0`);
    const size = full.bytes.length;
    // Fixed edges: the first header, the manifest's end, the big file's first and last byte and its padding, the end blocks.
    const bigAt = full.bytes.indexOf(shared.subarray(0, 64));
    const fixed: Array<[number, number]> = [
      [0, 511],
      [500, 530],
      [bigAt - 10, bigAt + 10],
      [bigAt + shared.length - 5, bigAt + shared.length + 600],
      [size - 1100, size - 1],
    ];
    const check = async (start: number, end: number) => {
      const got = await download(`${depot.url}/data/alpha@1.0.0`, { Range: `bytes=${start}-${end}` });
      expect(got.status).toBe(206);
      expect(got.headers.get("content-range")).toBe(`bytes ${start}-${Math.min(end, size - 1)}/${size}`);
      expect(got.bytes.equals(full.bytes.subarray(start, end + 1))).toBe(true);
    };
    for (const [start, end] of fixed) await check(start, end);
    await fc.assert(
      fc.asyncProperty(fc.nat({ max: size - 1 }), fc.nat({ max: 70_000 }), async (start, length) =>
        check(start, Math.min(size - 1, start + length)),
      ),
      { numRuns: 40, seed: 8 },
    );
    const suffix = await download(`${depot.url}/data/alpha@1.0.0`, { Range: "bytes=-700" });
    expect(suffix.bytes.equals(full.bytes.subarray(size - 700))).toBe(true);
    const past = await fetch(`${depot.url}/data/alpha@1.0.0`, { headers: { Range: `bytes=${size}-` } });
    expect(past.status).toBe(416);
    expect(past.headers.get("content-range")).toBe(`bytes */${size}`);
    await past.body?.cancel();
  });

  it("serves deltas assembled the same way, equal to tar-stream's archive of the delta manifest", async () => {
    const got = await download(`${depot.url}/data/beta/1.0.0/2.0.0`);
    expect(got.status).toBe(200);
    const entries = await parseTar(got.bytes);
    const manifest = JSON.parse(entries[0]!.body.toString()) as PackageManifest;
    expect(manifest.from).toBe("1.0.0");
    expect(manifest.items.map((i) => i.path)).toEqual(["VERSION"]); // big.bin and the dir are unchanged
    const expected = await referenceArchive(
      manifest,
      Math.floor(entries[0]!.mtime),
      (digest) => store.getBlob(digest),
      entries[0]!.body,
    );
    expect(got.bytes.equals(expected)).toBe(true);
    expect(got.headers.get("repr-digest")).toBe(
      `sha-256=:${Buffer.from(storeDigest(expected).slice(7), "hex").toString("base64")}:`,
    );
    const again = await download(`${depot.url}/data/beta/1.0.0/2.0.0`, { Range: "bytes=1000-1600" });
    expect(again.bytes.equals(got.bytes.subarray(1000, 1601))).toBe(true);
  });

  it("collects blobs nothing references and keeps the items of published versions", async () => {
    const before = await download(`${depot.url}/data/gamma@2.0.0`);
    // An archive blob as an older depot stored it, and the bytes of an abandoned upload.
    const legacy = await store.putBlob(
      (async function* () {
        yield before.bytes;
      })(),
    );
    const orphan = randomBytes(4096);
    const id = await openTransaction(depot.url, "delta-orphan@1.0.0");
    expect((await add(depot.url, id, { type: "file", path: "x", body: orphan })).status).toBe(201);
    expect((await fetch(`${depot.url}/trans/${id}`, { method: "DELETE" })).status).toBe(204);
    clock += 1000;
    const report = await depot.router.collectGarbage();
    expect(report.deletedBlobs).toBe(2);
    expect(await store.statBlob(legacy.digest)).toBeNull();
    expect(await store.statBlob(storeDigest(orphan))).toBeNull();
    expect(await store.statBlob(storeDigest(shared))).toEqual({ size: shared.length });
    // Every published archive is still whole, with the digest it was published with.
    for (const name of ["alpha", "beta", "gamma"]) {
      for (const version of ["1.0.0", "1.1.0", "2.0.0"]) {
        const got = await download(`${depot.url}/data/${name}@${version}`);
        const info = (await (await fetch(`${depot.url}/version/${name}@${version}`)).json()) as {
          versions: Array<{ digest: string }>;
        };
        expect(storeDigest(got.bytes)).toBe(info.versions[0]!.digest);
      }
    }
    expect((await depot.router.collectGarbage()).deletedBlobs).toBe(0);
  });
});
