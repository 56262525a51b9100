/**
 * The one record a client could grow without bound: a package's (`pkg/<name>`, one entry
 * per published version, rewritten by every commit of the package) and the catalog page
 * holding it (up to 1,000 packages' version lists). `limits.versions` bounds both
 * (docs/depot-api.md §11; docs/decisions/depot-server.md, "Session 9"). Over a real
 * server and real fetch, on the fs store.
 */
import { afterEach, describe, expect, it } from "vitest";
import { constants } from "node:buffer";
import { createFsStore } from "../../../src/adapters/fs/store.js";
import { pageKey } from "../../../src/depot/catalog/pages.js";
import { packageKey, type PackageRecord } from "../../../src/depot/catalog/packages.js";
import { DEFAULT_LIMITS } from "../../../src/depot/transactions/lifecycle.js";
import type { PackageStore } from "../../../src/depot/ports.js";
import { add, openTransaction, publish, startDepot, tempDir, type LiveDepot } from "../../fixtures/depot.js";

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  while (cleanups.length > 0) await cleanups.pop()!().catch(() => undefined);
});

async function depotWithVersionLimit(versions: number): Promise<{ depot: LiveDepot; store: PackageStore }> {
  const tmp = await tempDir("depot-record-bounds-");
  cleanups.push(tmp.cleanup);
  const store = createFsStore(tmp.dir, { unsafeNoSync: true });
  const depot = await startDepot(store, { limits: { versions } });
  cleanups.push(async () => {
    await depot.close();
    await depot.router.idle?.();
    await store.close?.();
  });
  return { depot, store };
}

const file = { type: "file", path: "a.txt", body: "a\n" } as const;

async function problem(response: Response): Promise<[number, string]> {
  return [response.status, ((await response.json()) as { code: string }).code];
}

describe("versions per package (limits.versions)", () => {
  it("a package holding its most versions takes no new one: 413 TOO_MANY_VERSIONS when a transaction opens; an existing version is still 409 VERSION_EXISTS", async () => {
    const { depot, store } = await depotWithVersionLimit(3);
    // Versions of the longest kind (128 characters): the record grows by each.
    const long = (n: number) => `${n}.0.0-${"x".repeat(128 - 6)}`;
    for (const n of [1, 2, 3]) expect((await publish(depot.url, `full@${long(n)}`, [file])).status).toBe(201);
    const refused = await fetch(`${depot.url}/trans/full@4.0.0`, { method: "POST" });
    expect(await problem(refused)).toEqual([413, "TOO_MANY_VERSIONS"]);
    expect(await problem(await fetch(`${depot.url}/trans/full@${long(2)}`, { method: "POST" }))).toEqual([
      409,
      "VERSION_EXISTS",
    ]);
    // Another package is not concerned.
    expect((await publish(depot.url, "other@1.0.0", [file])).status).toBe(201);
    // The package record is O(limit × version length): 3 × (128 + 3) bytes of versions plus a fixed part.
    const record = await store.getRecord<PackageRecord>(packageKey("full"));
    expect(record!.value.versions).toHaveLength(3);
    expect(JSON.stringify(record!.value).length).toBeLessThan(3 * 131 + 400);
  }, 30_000);

  it("a package that filled up after a transaction opened: its commit answers 413 TOO_MANY_VERSIONS, writes nothing, and the transaction is open again", async () => {
    const { depot } = await depotWithVersionLimit(2);
    expect((await publish(depot.url, "late@1.0.0", [file])).status).toBe(201);
    const second = await openTransaction(depot.url, "late@2.0.0");
    const third = await openTransaction(depot.url, "late@3.0.0");
    for (const id of [second, third]) expect((await add(depot.url, id, file)).status).toBe(201);
    expect((await fetch(`${depot.url}/commit/${second}`, { method: "POST" })).status).toBe(201);
    const refused = await fetch(`${depot.url}/commit/${third}`, { method: "POST" });
    expect(await problem(refused)).toEqual([413, "TOO_MANY_VERSIONS"]);
    expect((await fetch(`${depot.url}/version/late@3.0.0`)).status).toBe(404);
    const summary = (await (await fetch(`${depot.url}/summary/${third}`)).json()) as { state: string };
    expect(summary.state).toBe("open");
    expect((await fetch(`${depot.url}/trans/${third}`, { method: "DELETE" })).status).toBe(204);
    const feed = (await (await fetch(`${depot.url}/catalog?since=0`)).json()) as {
      changes: Array<{ name: string; version: string }>;
    };
    expect(feed.changes.filter((c) => c.name === "late").map((c) => c.version)).toEqual(["1.0.0", "2.0.0"]);
  }, 30_000);
});

describe("the catalog page limits.versions bounds (Session 9 review)", () => {
  // Every record passes through one JavaScript string as JSON (the fs store's
  // JSON.stringify/JSON.parse, node-postgres's json column alike), and V8 holds at most
  // 2^29 - 24 characters in one: a page past that cannot be stored or read, whatever the
  // 1 GB SQLite and PostgreSQL allow. At the default limit, a page of 1,000 packages of the
  // longest names, each holding the most versions of the longest kind, must fit.
  // Before: 5,000 versions made a 655 M-character page, and putRecord threw
  // "RangeError: Invalid string length".
  it("the worst-case catalog page at the default limits is stored and read back by the fs store", async () => {
    const tmp = await tempDir("depot-record-bounds-page-");
    cleanups.push(tmp.cleanup);
    const store = createFsStore(tmp.dir, { unsafeNoSync: true });
    cleanups.push(async () => store.close?.());
    const count = DEFAULT_LIMITS.versions;
    // 128 characters each (the version grammar's most), distinct.
    const versions = Array.from({ length: count }, (_, i) => `${i}.0.0-`.padEnd(128, "x"));
    const packages = Array.from({ length: 1_000 }, (_, p) => ({
      position: 999_999_000_000 + p,
      name: `p${String(p).padStart(63, "0")}`, // 64 characters, the name grammar's most
      pkg: { latest: versions.at(-1)!, versions, updatedAt: new Date(0).toISOString() },
    }));
    const page = { shard: 999_999_000, builtAt: 999_999_000_999, packages };
    await store.putRecord(pageKey(999_999_000), page, { ifRevision: null, lazy: true });
    const back = await store.getRecord<typeof page>(pageKey(999_999_000));
    expect(back!.value.packages).toHaveLength(1_000);
    expect(back!.value.packages[999]!.pkg.versions).toHaveLength(count);
    expect(back!.value.packages[999]!.pkg.versions.at(-1)).toBe(versions.at(-1));
    // And with room for a field or two more per package before the string limit.
    expect(1_000 * (count * 131 + 400)).toBeLessThan(constants.MAX_STRING_LENGTH);
  }, 180_000);
});
