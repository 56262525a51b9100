/**
 * `staleLockMs`, an fs-store option from the per-file lock layout (before records.db), is
 * deprecated and ignored: SQLite's write lock dies with its process, so there is no stale
 * lock left to break. A host that still passes it must see no error and no change: the
 * same answers over a real server, and a live lock held by another connection for far
 * longer than `staleLockMs` is waited for (then 503), never broken.
 */
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { loadSqlite } from "../../../src/adapters/fs/sqlite.js";
import { createFsStore, type FsStoreOptions } from "../../../src/adapters/fs/store.js";
import { publish, openTransaction, startDepot, tempDir } from "../../fixtures/depot.js";

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  while (cleanups.length > 0) await cleanups.pop()!().catch(() => undefined);
});

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** What a host sees of a store made with `options`: publish, a write behind another connection's lock, after it. */
async function observe(options: FsStoreOptions): Promise<unknown[]> {
  const tmp = await tempDir("depot-fs-options-");
  cleanups.push(tmp.cleanup);
  const store = createFsStore(tmp.dir, options);
  const depot = await startDepot(store);
  cleanups.push(async () => {
    await depot.close();
    await store.close?.();
  });
  const seen: unknown[] = [];
  seen.push((await publish(depot.url, "kept@1.0.0", [{ type: "file", path: "a.txt", body: "a\n" }])).status);
  // Another connection (another process, as far as SQLite knows) holds the write lock,
  // far longer than staleLockMs: 1 ms.
  const { DatabaseSync } = loadSqlite();
  const other = new DatabaseSync(join(tmp.dir, "records.db"));
  other.exec("BEGIN IMMEDIATE");
  try {
    await sleep(100);
    const blocked = await fetch(`${depot.url}/trans/blocked@1.0.0`, { method: "POST" });
    seen.push(blocked.status, ((await blocked.json()) as { code: string }).code);
    // The lock was never broken: the holder still commits its own write.
    other.exec(`INSERT INTO meta (name, value) VALUES ('lock-holder', 'committed')`);
    other.exec("COMMIT");
  } finally {
    other.close();
  }
  seen.push(typeof (await openTransaction(depot.url, "after@1.0.0")));
  const catalog = await fetch(`${depot.url}/catalog`);
  seen.push(catalog.status, Object.keys(((await catalog.json()) as { packages: Record<string, unknown> }).packages));
  return seen;
}

describe("fs store: the deprecated staleLockMs option", () => {
  it("is accepted, is no error, and changes nothing: a live lock held past it is waited for, never broken", async () => {
    const without = await observe({ lockTimeoutMs: 300, unsafeNoSync: true });
    const withStale = await observe({ lockTimeoutMs: 300, unsafeNoSync: true, staleLockMs: 1 });
    expect(without).toEqual([201, 503, "STORE_UNAVAILABLE", "string", 200, ["kept"]]);
    expect(withStale).toEqual(without);
  }, 30_000);
});
