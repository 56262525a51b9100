/**
 * Issue 30 item 1 over real sockets: a delta costs its reader, not the store. HEADs build
 * and store nothing, GETs store nothing (even on a store that signs URLs), and delta builds
 * are bounded: past the build slots and the queue, 503 TOO_MANY_DELTA_BUILDS with Retry-After.
 */
import { randomBytes } from "node:crypto";
import { afterEach, describe, expect, it } from "vitest";
import { createMemoryStore } from "../../../src/adapters/memory/store.js";
import type { PackageStore } from "../../../src/depot/ports.js";
import { publish, startDepot, storeDigest, type LiveDepot } from "../../fixtures/depot.js";

/** The store with `signBlobUrl` (the S3 path) and a count of the blob reads of `watched` digests, gated by `open`. */
function signingStore(base: PackageStore, gate: { watched: Set<string>; open: Promise<void>; hit: () => void }) {
  const reads = { watched: 0 };
  const store: Record<string, unknown> = {};
  for (let o: object | null = base; o !== null && o !== Object.prototype; o = Object.getPrototypeOf(o) as object) {
    for (const name of Object.getOwnPropertyNames(o)) {
      const value = (base as unknown as Record<string, unknown>)[name];
      if (name !== "constructor" && !(name in store) && typeof value === "function") store[name] = value.bind(base);
    }
  }
  store.signBlobUrl = async (digest: string) => `http://signed.invalid/${digest}`;
  store.getBlob = async (digest: string) => {
    if (gate.watched.has(digest)) {
      reads.watched++;
      gate.hit();
      await gate.open;
    }
    return base.getBlob(digest);
  };
  return { store: store as unknown as PackageStore, reads };
}

async function storedBytes(store: PackageStore): Promise<number> {
  let bytes = 0;
  for await (const digest of store.listBlobs()) bytes += (await store.statBlob(digest))?.size ?? 0;
  return bytes;
}

let depot: LiveDepot | undefined;
afterEach(async () => {
  await depot?.close();
  depot = undefined;
});

describe("deltas cost the reader, not the store (issue 30 item 1)", () => {
  it("HEADs and GETs of 12 deltas on a signing store write no record and no blob, and HEADs hash nothing", async () => {
    const bigs = Array.from({ length: 4 }, () => randomBytes(256 * 1024));
    const watched = new Set(bigs.map((b) => storeDigest(b)));
    const { store, reads } = signingStore(createMemoryStore(), {
      watched,
      open: Promise.resolve(),
      hit: () => undefined,
    });
    depot = await startDepot(store);
    for (let i = 0; i < 4; i++) {
      const response = await publish(depot.url, `big@${i + 1}.0.0`, [
        { type: "file", path: "big.bin", body: bigs[i]! },
      ]);
      expect(response.status).toBe(201);
    }
    const bytesBefore = await storedBytes(store);
    const readsBefore = reads.watched;
    const pairs: Array<[number, number]> = [];
    for (let a = 1; a <= 4; a++) for (let b = 1; b <= 4; b++) if (a !== b) pairs.push([a, b]);
    const heads: Response[] = [];
    for (const [a, b] of pairs)
      heads.push(await fetch(`${depot.url}/data/big/${a}.0.0/${b}.0.0`, { method: "HEAD", redirect: "manual" }));
    // Not one byte of item content was read for 12 HEADs: nothing was hashed.
    expect(heads.map((h) => h.status)).toEqual(pairs.map(() => 200));
    for (const head of heads) expect(Number(head.headers.get("content-length"))).toBeGreaterThan(256 * 1024);
    expect(reads.watched - readsBefore).toBe(0);
    expect((await store.listRecords("delta/")).keys).toEqual([]);
    for (const [a, b] of pairs) {
      const get = await fetch(`${depot.url}/data/big/${a}.0.0/${b}.0.0`, { redirect: "manual" });
      // Streamed by the depot, not redirected to a stored copy.
      expect(get.status).toBe(200);
      const bytes = new Uint8Array(await get.arrayBuffer());
      expect(get.headers.get("etag")).toBe(`"${storeDigest(bytes).slice(7)}"`);
      // A HEAD after the GET has the digest, from memory.
      const head = await fetch(`${depot.url}/data/big/${a}.0.0/${b}.0.0`, { method: "HEAD", redirect: "manual" });
      expect(head.headers.get("etag")).toBe(get.headers.get("etag"));
    }
    expect((await store.listRecords("delta/")).keys).toEqual([]);
    expect(await storedBytes(store)).toBe(bytesBefore);
  });

  it("with 1 build slot and a queue of 1, a third concurrent new delta is refused 503 at once; the others are served whole", async () => {
    let release!: () => void;
    const open = new Promise<void>((resolve) => (release = resolve));
    let hit!: () => void;
    const firstHit = new Promise<void>((resolve) => (hit = resolve));
    const bigs = Array.from({ length: 4 }, () => randomBytes(64 * 1024));
    const watched = new Set<string>();
    const { store } = signingStore(createMemoryStore(), { watched, open, hit });
    depot = await startDepot(store, { deltaBuilds: 1, deltaQueue: 1 });
    for (let i = 0; i < 4; i++) {
      const response = await publish(depot.url, `q@${i + 1}.0.0`, [{ type: "file", path: "big.bin", body: bigs[i]! }]);
      expect(response.status).toBe(201);
    }
    // From now on every read of item content waits for `release`.
    for (const big of bigs) watched.add(storeDigest(big));
    const url = (to: number) => `${depot!.url}/data/q/1.0.0/${to}.0.0`;
    const first = fetch(url(2));
    await firstHit;
    const second = fetch(url(3));
    const third = fetch(url(4));
    const refused = await Promise.race([
      second,
      third,
      new Promise<null>((resolve) => setTimeout(() => resolve(null), 5000)),
    ]);
    expect(refused, "no delta request was refused while the build slot and the queue were full").not.toBeNull();
    expect(refused!.status).toBe(503);
    expect(refused!.headers.get("retry-after")).toBe("1");
    expect(((await refused!.json()) as { code: string }).code).toBe("TOO_MANY_DELTA_BUILDS");
    release();
    const served = await Promise.all([first, second, third]);
    const ok = served.filter((r) => r.status === 200);
    expect(ok).toHaveLength(2);
    for (const r of ok) {
      const bytes = new Uint8Array(await r.arrayBuffer());
      expect(r.headers.get("etag")).toBe(`"${storeDigest(bytes).slice(7)}"`);
    }
  });

  it("garbage collection removes an older depot's delta record and the delta blob it kept", async () => {
    const { store } = signingStore(createMemoryStore(), {
      watched: new Set(),
      open: Promise.resolve(),
      hit: () => undefined,
    });
    depot = await startDepot(store, { gcGraceMs: 0 });
    for (const v of ["1.0.0", "2.0.0"])
      expect((await publish(depot.url, `old@${v}`, [{ type: "file", path: "f", body: v }])).status).toBe(201);
    // As a depot before issue 30 left it: the delta materialised as a blob, named by a record.
    const kept = await store.putBlob(
      (async function* () {
        yield new TextEncoder().encode("a delta archive an older depot stored");
      })(),
    );
    await store.putRecord(
      "delta/old/1.0.0/2.0.0",
      { digest: kept.digest, size: kept.size, builtAt: "2026-01-01T00:00:00Z" },
      { ifRevision: null },
    );
    await depot.router.collectGarbage();
    await depot.router.collectGarbage();
    expect((await store.listRecords("delta/")).keys).toEqual([]);
    expect(await store.statBlob(kept.digest)).toBeNull();
    expect((await fetch(`${depot.url}/data/old/1.0.0/2.0.0`)).status).toBe(200);
  });
});
