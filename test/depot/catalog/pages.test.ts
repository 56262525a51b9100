/**
 * Catalog pages served from page records (depot/catalog/pages.ts) at more than one shard of the
 * change sequence, over real HTTP on the fs store: every package once, in creation order,
 * with the versions committed after its page was built; a lost page is rebuilt on read.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createFsStore } from "../../../src/adapters/fs/store.js";
import { pageKey } from "../../../src/depot/catalog/pages.js";
import { packKey } from "../../../src/depot/catalog/changes.js";
import type { PackageStore } from "../../../src/depot/ports.js";
import { keys, type VersionRecord } from "../../../src/depot/store/records.js";
import { walkChanges } from "../../fixtures/catalog-feed.js";
import { publish, startDepot, tempDir, type LiveDepot } from "../../fixtures/depot.js";
import { seedPackages } from "../../fixtures/depot-seed.js";

const TOTAL = 2300;
const name = (i: number) => `pkg-${String(i).padStart(6, "0")}`;

interface Page {
  packages: Record<string, { latest: string; versions: string[] }>;
  count: number;
  position: number;
}

/** Every page of the catalog, `limit` a page, following `Link: rel="next"`. */
async function walk(
  url: string,
  limit: number,
): Promise<{ names: string[]; packages: Page["packages"]; pages: number }> {
  const names: string[] = [];
  const packages: Page["packages"] = {};
  let next: string | null = `${url}/catalog?limit=${limit}`;
  let pages = 0;
  while (next) {
    const response: Response = await fetch(next);
    expect(response.status).toBe(200);
    const page = (await response.json()) as Page;
    expect(page.count).toBe(Object.keys(page.packages).length);
    names.push(...Object.keys(page.packages));
    Object.assign(packages, page.packages);
    const link = /<([^>]*)>;\s*rel="next"/.exec(response.headers.get("link") ?? "");
    next = link ? new URL(link[1]!, next).href : null;
    pages++;
  }
  return { names, packages, pages };
}

/** Package names in the order of their first entry in the change feed. */
async function creationOrder(url: string): Promise<string[]> {
  const { changes } = await walkChanges(url, 0, 5000);
  return [...new Set(changes.map((c) => c.name))];
}

describe("catalog page records (fs store, 2,300 packages: two full shards and one filling)", () => {
  let dir: string;
  let store: PackageStore;
  let depot: LiveDepot;
  const cleanups: Array<() => Promise<unknown>> = [];
  afterAll(async () => {
    for (const c of cleanups.reverse()) await c();
  });

  /** A router on a second store object over the same folder: nothing held in memory. */
  async function freshReader(): Promise<LiveDepot> {
    const other = createFsStore(dir, { unsafeNoSync: true });
    const reader = await startDepot(other);
    cleanups.push(async () => {
      await reader.close();
      await other.close?.();
    });
    return reader;
  }

  beforeAll(async () => {
    const tmp = await tempDir("depot-pages-");
    dir = tmp.dir;
    cleanups.push(tmp.cleanup);
    store = createFsStore(dir, { unsafeNoSync: true });
    depot = await startDepot(store);
    cleanups.push(async () => {
      await depot.close();
      await store.close?.();
    });
    const first = await publish(depot.url, `${name(0)}@1.0.0`, [{ type: "file", path: "hello", body: "hello\n" }]);
    expect(first.status).toBe(201);
    const template = (await store.getRecord<VersionRecord>(keys.version(name(0), "1.0.0")))!.value;
    await seedPackages(
      store,
      template,
      Array.from({ length: TOTAL - 1 }, (_, i) => name(i + 1)),
    );
  }, 300_000);

  it("packs and pages each full shard when it fills, and not the one filling", async () => {
    for (const shard of [0, 1]) {
      expect(await store.getRecord(packKey(shard))).not.toBeNull();
      expect(await store.getRecord(pageKey(shard))).not.toBeNull();
    }
    expect(await store.getRecord(packKey(2))).toBeNull();
    expect(await store.getRecord(pageKey(2))).toBeNull();
  });

  it("a walk from another process's view lists every package once, in creation order, with versions committed after its page was built", async () => {
    // A new version of a package in shard 0 and a package created in the filling shard.
    expect((await publish(depot.url, `${name(5)}@2.0.0`, [{ type: "file", path: "v2", body: "two\n" }])).status).toBe(
      201,
    );
    expect((await publish(depot.url, `late@1.0.0`, [{ type: "file", path: "l", body: "late\n" }])).status).toBe(201);
    const reader = await freshReader();
    const { names, packages, pages } = await walk(reader.url, 700);
    // Creation order: the first appearance of each name in the change feed.
    expect(names).toEqual(await creationOrder(reader.url));
    expect(new Set(names)).toEqual(new Set([...Array.from({ length: TOTAL }, (_, i) => name(i)), "late"]));
    expect(pages).toBe(Math.ceil((TOTAL + 1) / 700));
    expect(packages[name(5)]).toMatchObject({ latest: "2.0.0", versions: ["1.0.0", "2.0.0"] });
    expect(packages[name(6)]).toMatchObject({ latest: "1.0.0", versions: ["1.0.0"] });
    // The same through the router that wrote them (pages held in memory, brought forward).
    const again = await walk(depot.url, 1000);
    expect(again.names).toEqual(names);
    expect(again.packages[name(5)]!.latest).toBe("2.0.0");
    // since: only the two changes, with their packages' current state.
    const head = TOTAL;
    const since = (await (await fetch(`${reader.url}/catalog?since=${head}`)).json()) as Page & {
      changes: Array<{ name: string; version: string }>;
    };
    expect(since.changes.map((c) => `${c.name}@${c.version}`)).toEqual([`${name(5)}@2.0.0`, "late@1.0.0"]);
    expect(since.packages[name(5)]!.versions).toEqual(["1.0.0", "2.0.0"]);
  });

  it("a lost page record is rebuilt by the first reader that needs it", async () => {
    expect(await store.deleteRecord(pageKey(1))).toBe(true);
    const reader = await freshReader();
    const response = await fetch(`${reader.url}/catalog?limit=1000&after=c${(999).toString(36)}`);
    const page = (await response.json()) as Page;
    // Positions 1,000 to 1,999: every package there was created by its only version.
    expect(Object.keys(page.packages)).toEqual((await creationOrder(reader.url)).slice(999, 1999));
    expect(await store.getRecord(pageKey(1))).not.toBeNull();
  });
});
