/**
 * Small blobs on PostgreSQL beside the records (composeStore over S3 blobs and PostgreSQL records): through a real
 * depot server on real PostgreSQL and a real S3 server, a blob of up to 16 KiB never reaches S3 (the bucket's
 * objects are counted) and a larger one does; blobs an older store wrote to S3 still read; garbage collection and
 * retention remove small blobs from their table.
 */
import { randomUUID } from "node:crypto";
import { ListObjectsV2Command } from "@aws-sdk/client-s3";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createPostgresRecords } from "../../src/adapters/postgres/index.js";
import { createS3BlobStore } from "../../src/adapters/s3/index.js";
import { composeStore } from "../../src/depot/store/compose.js";
import { tierSmallBlobs } from "../../src/depot/store/small-blob-tier.js";
import { runRetention } from "../../src/depot/store/retention.js";
import type { PackageStore, SmallBlobStore } from "../../src/depot/ports.js";
import { chunked, collectAll, collectBytes, patternBytes } from "../../src/testing/index.js";
import { createTestSchema, needs, startS3 } from "../fixtures/backends.js";
import type { S3Fixture } from "../fixtures/backends.js";
import { add, openTransaction, parseTar, publish, startDepot, storeDigest } from "../fixtures/depot.js";

let s3: S3Fixture;
let db: Awaited<ReturnType<typeof createTestSchema>>;
const haveDatabase = needs("postgres");
const stores: PackageStore[] = [];

beforeAll(async () => {
  if (!haveDatabase) return;
  s3 = await startS3();
  db = await createTestSchema();
});
afterAll(async () => {
  for (const store of stores) await store.close?.();
  await db?.drop();
  await s3?.close();
});

/** S3 blobs under `prefix` (their own), records and small blobs on the test schema. */
function s3Blobs(prefix: string) {
  return createS3BlobStore({ bucket: s3.bucket, prefix, clientConfig: s3.clientConfig });
}
function composed(prefix: string): PackageStore {
  const store = composeStore({
    blobs: s3Blobs(prefix),
    records: createPostgresRecords({ pool: db.pool, schema: db.schema }),
  });
  stores.push(store);
  return store;
}

/** The blob objects S3 holds under `prefix`. */
async function s3Digests(prefix: string): Promise<string[]> {
  const out = await s3.client.send(new ListObjectsV2Command({ Bucket: s3.bucket, Prefix: `${prefix}sha256/` }));
  return (out.Contents ?? []).map((o) => `sha256:${o.Key!.slice(prefix.length + 7)}`);
}

/** Whether the small-blob table holds `digest`. */
async function inTable(digest: string): Promise<boolean> {
  const rows = await db.pool.query(`SELECT 1 FROM "${db.schema}".small_blobs WHERE digest = $1`, [digest.slice(7)]);
  return rows.rowCount === 1;
}

describe("small blobs in PostgreSQL, large ones in S3", () => {
  it("a one-file publish of small content makes no S3 object; a large file does, the small one beside it not", async () => {
    const prefix = `small-${randomUUID()}/`;
    const store = composed(prefix);
    const depot = await startDepot(store);
    try {
      expect((await publish(depot.url, "tiny@1.0.0", [{ type: "file", path: "a", body: "tiny bytes\n" }])).status).toBe(
        201,
      );
      // The archive is served by the depot itself (no redirect: a row has no S3 URL), whole and by range.
      const data = await fetch(`${depot.url}/data/tiny@1.0.0`, { redirect: "manual" });
      expect(data.status).toBe(200);
      const archive = new Uint8Array(await data.arrayBuffer());
      expect((await parseTar(archive)).map((e) => [e.name, e.body.toString()])).toContainEqual(["a", "tiny bytes\n"]);
      const part = await fetch(`${depot.url}/data/tiny@1.0.0`, { headers: { Range: "bytes=10-19" } });
      expect(part.status).toBe(206);
      expect(Buffer.from(await part.arrayBuffer()).equals(Buffer.from(archive.subarray(10, 20)))).toBe(true);
      // No copy of a small archive is made (a row is never redirected to), and no object.
      expect(storeDigest(new Uint8Array(await (await fetch(`${depot.url}/data/tiny@1.0.0`)).arrayBuffer()))).toBe(
        storeDigest(archive),
      );
      expect(await inTable(storeDigest("tiny bytes\n"))).toBe(true);
      expect(await inTable(storeDigest(archive))).toBe(false);
      expect(await s3Digests(prefix)).toEqual([]);

      const big = patternBytes(16 * 1024 + 1, 3);
      const small = patternBytes(16 * 1024, 5);
      const commit = await publish(depot.url, "mixed@1.0.0", [
        { type: "file", path: "big", body: big },
        { type: "file", path: "small", body: small },
      ]);
      expect(commit.status).toBe(201);
      const inS3 = await s3Digests(prefix);
      expect(inS3).toContain(storeDigest(big));
      expect(inS3).not.toContain(storeDigest(small));
      expect(await inTable(storeDigest(small))).toBe(true);
      expect(await inTable(storeDigest(big))).toBe(false);
      const entries = await parseTar(
        new Uint8Array(await (await fetch(`${depot.url}/data/mixed@1.0.0`)).arrayBuffer()),
      );
      expect(entries.find((e) => e.name === "big")!.body.equals(big)).toBe(true);
      expect(entries.find((e) => e.name === "small")!.body.equals(small)).toBe(true);
    } finally {
      await depot.close();
    }
  });

  it("blobs an older store put in S3 still read, list, sign and delete", async () => {
    const prefix = `old-${randomUUID()}/`;
    const old = s3Blobs(prefix);
    const bytes = patternBytes(1000, 9);
    const { digest } = await old.putBlob(chunked(bytes));
    await old.close?.();
    const store = composed(prefix);
    expect(await store.statBlob(digest)).toEqual({ size: 1000 });
    expect((await collectBytes((await store.getBlob(digest))!)).equals(bytes)).toBe(true);
    expect(await collectAll(store.listBlobs())).toContain(digest);
    const url = await store.signBlobUrl!(digest);
    expect(Buffer.from(await (await fetch(url!)).arrayBuffer()).equals(bytes)).toBe(true);
    // Put again through the new store: a row too; listed once, and a delete removes both.
    await store.putBlob(chunked(bytes));
    expect(await inTable(digest)).toBe(true);
    expect((await collectAll(store.listBlobs())).filter((d) => d === digest)).toHaveLength(1);
    expect(await store.signBlobUrl!(digest)).toBeNull();
    await store.deleteBlob(digest);
    expect(await store.statBlob(digest)).toBeNull();
    expect(await s3Digests(prefix)).toEqual([]);
  });

  it("garbage collection and retention remove small blobs from the table", async () => {
    let clock = Date.parse("2030-01-01T00:00:00Z");
    const prefix = `gc-${randomUUID()}/`;
    const store = composed(prefix);
    const depot = await startDepot(store, { now: () => new Date(clock), gcGraceMs: 60_000 });
    try {
      const body = (v: string) => `kept ${v} ${randomUUID()}`;
      const bodies = ["1.0.0", "2.0.0"].map(body);
      for (const [i, v] of ["1.0.0", "2.0.0"].entries())
        expect((await publish(depot.url, `kept@${v}`, [{ type: "file", path: "f", body: bodies[i]! }])).status).toBe(
          201,
        );
      const abandoned = await openTransaction(depot.url, "kept@3.0.0");
      const dropped = `abandoned ${randomUUID()}`;
      expect((await add(depot.url, abandoned, { type: "file", path: "f", body: dropped })).status).toBe(201);
      await fetch(`${depot.url}/trans/${abandoned}`, { method: "DELETE" });
      expect(await inTable(storeDigest(dropped))).toBe(true);

      await depot.router.collectGarbage();
      clock += 120_000;
      const second = await depot.router.collectGarbage();
      expect(second.deletedBlobs).toBeGreaterThanOrEqual(1);
      expect(await inTable(storeDigest(dropped))).toBe(false);
      expect(await store.statBlob(storeDigest(dropped))).toBeNull();
      expect(await inTable(storeDigest(bodies[0]!))).toBe(true);

      const retained = await runRetention(store, { keepLast: 1 }, { now: new Date(clock) });
      expect(retained.removed.map((r) => r.version)).toEqual(["1.0.0"]);
      await depot.router.collectGarbage();
      clock += 120_000;
      await depot.router.collectGarbage();
      expect(await inTable(storeDigest(bodies[0]!))).toBe(false);
      expect(await inTable(storeDigest(bodies[1]!))).toBe(true);
      const entries = await parseTar(new Uint8Array(await (await fetch(`${depot.url}/data/kept`)).arrayBuffer()));
      expect(entries.find((e) => e.name === "f")!.body.toString()).toBe(bodies[1]);
      expect(await s3Digests(prefix)).toEqual([]);
    } finally {
      await depot.close();
    }
  });
});

describe("the recent small blobs in memory (review)", () => {
  /** Two replicas' blob halves over one schema and one bucket prefix, on a clock the test moves. */
  function replicas(prefix: string, clock: { ms: number }, gateA?: (small: SmallBlobStore) => SmallBlobStore) {
    const smallOf = () => createPostgresRecords({ pool: db.pool, schema: db.schema }).smallBlobs!;
    const now = () => clock.ms;
    const a = tierSmallBlobs(gateA ? gateA(smallOf()) : smallOf(), s3Blobs(prefix), { now });
    const b = tierSmallBlobs(smallOf(), s3Blobs(prefix), { now });
    return { a, b };
  }

  it("two replicas put one small blob at once: one row; one deletes it: the other reads it absent once its copy is old", async () => {
    const clock = { ms: 1_000_000 };
    const { a, b } = replicas(`recent-${randomUUID()}/`, clock);
    const bytes = patternBytes(16 * 1024, 11);
    const [pa, pb] = await Promise.all([a.putBlob(chunked(bytes, 1000)), b.putBlob(chunked(bytes, 4096))]);
    expect(pa).toEqual(pb);
    expect(await inTable(pa.digest)).toBe(true);
    expect((await collectBytes((await a.getBlob(pa.digest))!)).equals(bytes)).toBe(true);

    await b.deleteBlob(pa.digest);
    expect(await inTable(pa.digest)).toBe(false);
    expect(await a.statBlob(pa.digest)).toBeNull();
    clock.ms += 60_000;
    // Before the review, a's copy answered for ever: deleted bytes served, and a commit hashing them would not fail.
    expect(await a.getBlob(pa.digest)).toBeNull();
  });

  it("a read that saw the row before this process deleted it does not bring the bytes back into memory", async () => {
    const clock = { ms: 1_000_000 };
    let hold: Promise<void> | null = null;
    let reached: () => void = () => {};
    const atGate = new Promise<void>((resolve) => (reached = resolve));
    // The read's answer waits (after PostgreSQL answered it) while the test deletes the blob.
    const gated = (small: SmallBlobStore): SmallBlobStore => ({
      ...small,
      putSmallBlob: small.putSmallBlob.bind(small),
      statSmallBlob: small.statSmallBlob.bind(small),
      deleteSmallBlob: small.deleteSmallBlob.bind(small),
      listSmallBlobs: small.listSmallBlobs.bind(small),
      maxBytes: small.maxBytes,
      async getSmallBlob(digest) {
        const data = await small.getSmallBlob(digest);
        if (hold) {
          reached();
          await hold;
        }
        return data;
      },
    });
    const { a, b } = replicas(`race-${randomUUID()}/`, clock, gated);
    const bytes = patternBytes(3000, 13);
    const { digest } = await b.putBlob(chunked(bytes));
    let release: () => void = () => {};
    hold = new Promise<void>((resolve) => (release = resolve));
    const racing = a.getBlob(digest);
    await atGate;
    hold = null;
    await a.deleteBlob(digest);
    release();
    // The racing read may answer the bytes (it began before the delete), but nothing after it may.
    await racing;
    expect(await inTable(digest)).toBe(false);
    expect(await a.getBlob(digest)).toBeNull();
  });
});
