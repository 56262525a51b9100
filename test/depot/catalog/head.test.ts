/**
 * The catalog head held in memory (src/depot/catalog/head.ts): two routers on one store, a
 * commit through one, and when the other's ETag moves. A 304 from the held head reads no
 * record. On the fs store the bound is HEAD_STALE_MS of the router's clock (a frozen clock
 * here, moved by hand); on PostgreSQL the other router hears the commit through
 * LISTEN/NOTIFY (records `watchRecords`); on the memory store at once.
 */
import { afterAll, describe, expect, it } from "vitest";
import { createFsStore } from "../../../src/adapters/fs/store.js";
import { createMemoryStore } from "../../../src/adapters/memory/store.js";
import { createPostgresRecords } from "../../../src/adapters/postgres/index.js";
import { HEAD_STALE_MS } from "../../../src/depot/catalog/head.js";
import { composeStore } from "../../../src/depot/store/compose.js";
import type { PackageStore } from "../../../src/depot/ports.js";
import { createTestSchema, needs } from "../../fixtures/backends.js";
import { publish, startDepot, tempDir, type LiveDepot } from "../../fixtures/depot.js";

const cleanups: Array<() => Promise<unknown>> = [];
afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
});

/** The store with its record reads counted. */
function countingReads(inner: PackageStore): { store: PackageStore; reads: () => number } {
  let reads = 0;
  const store = Object.create(inner) as PackageStore;
  store.getRecord = (key) => {
    reads++;
    return inner.getRecord(key);
  };
  store.listRecords = (prefix, page) => {
    reads++;
    return inner.listRecords(prefix, page);
  };
  return { store, reads: () => reads };
}

async function live(store: PackageStore, options: Parameters<typeof startDepot>[1] = {}): Promise<LiveDepot> {
  const depot = await startDepot(store, options);
  cleanups.push(() => depot.close());
  return depot;
}

async function published(url: string, spec: string): Promise<void> {
  const response = await publish(url, spec, [{ type: "file", path: "f", body: `${spec}\n` }]);
  expect(response.status).toBe(201);
}

async function catalog(
  url: string,
  query = "",
  etag?: string,
): Promise<{ status: number; etag: string; body: { position?: number; packages?: Record<string, unknown> } }> {
  const response = await fetch(`${url}/catalog${query}`, { headers: etag ? { "if-none-match": etag } : {} });
  const text = await response.text();
  return {
    status: response.status,
    etag: response.headers.get("etag")!,
    body: text ? (JSON.parse(text) as { position?: number }) : {},
  };
}

describe("catalog head held in memory", () => {
  it("memory store: another router's commit moves the ETag at once, and a 304 reads no record", async () => {
    const shared = createMemoryStore();
    const a = await live(shared);
    const { store, reads } = countingReads(shared);
    const b = await live(store);
    await published(a.url, "mem-one@1.0.0");
    const first = await catalog(b.url);
    expect(first.body.position).toBe(1);
    await published(a.url, "mem-two@1.0.0");
    const before = reads();
    const moved = await catalog(b.url, "", first.etag);
    expect(moved.status).toBe(200);
    expect(moved.etag).not.toBe(first.etag);
    const again = reads();
    expect((await catalog(b.url, "", moved.etag)).status).toBe(304);
    expect(reads()).toBe(again);
    expect(again - before).toBeGreaterThan(0); // the 200 read the packages it lists
  });

  it(`fs store (two store instances, as two processes): the other router's ETag moves once its head is ${HEAD_STALE_MS} ms old; a client that saw a newer head makes it look at once`, async () => {
    const tmp = await tempDir("depot-head-");
    cleanups.push(tmp.cleanup);
    const a = await live(createFsStore(tmp.dir));
    const { store, reads } = countingReads(createFsStore(tmp.dir));
    let clock = Date.parse("2026-01-01T00:00:00Z");
    const b = await live(store, { now: () => new Date(clock) });
    await published(a.url, "fs-one@1.0.0");
    const first = await catalog(b.url);
    expect(first.body.position).toBe(1);

    await published(a.url, "fs-two@1.0.0");
    // Within the bound B answers from the head it holds: a 304 that reads nothing.
    const before = reads();
    expect((await catalog(b.url, "", first.etag)).status).toBe(304);
    expect(reads()).toBe(before);
    // Past the bound it looks again.
    clock += HEAD_STALE_MS;
    const moved = await catalog(b.url, "", first.etag);
    expect(moved.status).toBe(200);
    expect(moved.body.position).toBe(2);

    // A's newer tag (or a since past B's head) makes B look at once: a client never sees it go back.
    await published(a.url, "fs-three@1.0.0");
    const fromA = await catalog(a.url);
    expect(fromA.body.position).toBe(3);
    expect((await catalog(b.url, "", fromA.etag)).status).toBe(304);
    const since = await catalog(b.url, "?since=2");
    expect(Object.keys(since.body.packages!)).toEqual(["fs-three"]);
  });

  it.runIf(needs("postgres"))(
    "PostgreSQL records: the other router hears the commit through LISTEN/NOTIFY, without its clock moving, and its 304s read nothing",
    async () => {
      const db = await createTestSchema();
      cleanups.push(() => db.drop());
      const blobs = createMemoryStore();
      const open = () => {
        const records = createPostgresRecords({ pool: db.pool, schema: db.schema });
        cleanups.push(() => records.close?.() ?? Promise.resolve());
        return composeStore({ blobs, records });
      };
      const a = await live(open());
      const { store, reads } = countingReads(open());
      // Wait until the store's LISTEN connection is up (a watcher's second "look again"): its
      // coming up tells B's head to look again, and under load that could land inside the
      // quiet check below (a CI run saw one read there). Once it listens, B subscribing gets
      // only the immediate "look again", which B's first probe answers.
      await new Promise<void>((resolve) => {
        let nulls = 0;
        store.watchRecords!((key) => {
          if (key === null && ++nulls === 2) resolve();
        });
      });
      const frozen = new Date("2026-01-01T00:00:00Z");
      const b = await live(store, { now: () => frozen });
      await published(a.url, "pg-one@1.0.0");
      let seen = await catalog(b.url);
      expect(seen.body.position).toBe(1);
      // Once B's listening connection is up (and B probed once after it), 304s read nothing.
      for (let i = 0, quietInARow = 0; i < 200 && quietInARow < 3; i++) {
        const before = reads();
        expect((await catalog(b.url, "", seen.etag)).status).toBe(304);
        quietInARow = reads() === before ? quietInARow + 1 : 0;
        await new Promise((resolve) => setTimeout(resolve, 25));
      }
      const quiet = reads();
      expect((await catalog(b.url, "", seen.etag)).status).toBe(304);
      expect(reads()).toBe(quiet);

      await published(a.url, "pg-two@1.0.0");
      // Until B heard the NOTIFY (up to 30 s: 400 tries of 10 ms was thin on a loaded machine).
      for (const until = Date.now() + 30_000; Date.now() < until && seen.body.position === 1;) {
        const next = await catalog(b.url, "", seen.etag);
        if (next.status === 200) seen = next;
        else await new Promise((resolve) => setTimeout(resolve, 10));
      }
      expect(seen.body.position).toBe(2);
      expect(Object.keys(seen.body.packages!)).toEqual(["pg-one", "pg-two"]);
    },
  );

  it.runIf(needs("postgres"))(
    "PostgreSQL records: watchRecords reports announced writes of another store instance after a null, and no other write",
    async () => {
      const db = await createTestSchema();
      cleanups.push(() => db.drop());
      const writer = createPostgresRecords({ pool: db.pool, schema: db.schema });
      const watcher = createPostgresRecords({ pool: db.pool, schema: db.schema });
      cleanups.push(
        () => writer.close!(),
        () => watcher.close!(),
      );
      const heard: Array<string | null> = [];
      let listening!: () => void;
      const up = new Promise<void>((resolve) => (listening = resolve));
      const stop = watcher.watchRecords!((key) => {
        heard.push(key);
        if (key === null && heard.length >= 2) listening(); // the first null is at once, the second once it listens
      });
      await up;
      expect(await writer.putRecord("quiet/1", { n: 1 }, { ifRevision: null })).not.toBeNull();
      expect(await writer.putRecord("loud/1", { n: 1 }, { ifRevision: null, announce: true })).not.toBeNull();
      // A lost create-only race writes nothing and announces nothing.
      expect(await writer.putRecord("loud/1", { n: 2 }, { ifRevision: null, announce: true })).toBeNull();
      const revision = await writer.putRecord("loud/2", { n: 1 }, { ifRevision: null });
      expect(await writer.putRecord("loud/2", { n: 2 }, { ifRevision: revision, announce: true })).not.toBeNull();
      for (const until = Date.now() + 30_000; Date.now() < until && heard.filter((k) => k !== null).length < 2;)
        await new Promise((resolve) => setTimeout(resolve, 10));
      expect(heard).toEqual([null, null, "loud/1", "loud/2"]);
      stop();
    },
  );
});
