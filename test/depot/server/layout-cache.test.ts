/**
 * The archive layout cache (depot/server/archive-source.ts), which an attack round found bounded by parts only: one
 * HEAD a version of manifests with 1,000 attributes of 4 KiB, or items with 4 KiB paths, kept ~7.9 MiB a version
 * (315 MiB for 40) while 160 of its 1,000,000 parts were used, and concurrent cold reads of one version each read and
 * parsed its whole manifest. The cache is now bounded by the bytes its layouts hold, and a cold version's manifest is
 * read once however many requests ask for it at once (real HTTP, a listening fs-store depot).
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createFsStore } from "../../../src/adapters/fs/index.js";
import { archiveLayout, type ArchiveLayout, type PackageManifest } from "../../../src/depot/package/archive.js";
import type { PackageStore } from "../../../src/depot/ports.js";
import { LayoutCache, layoutBytes } from "../../../src/depot/server/archive-source.js";
import { publish, startDepot, tempDir } from "../../fixtures/depot.js";

describe("a cold version read by many requests at once (fs store, real HTTP)", () => {
  let dir: string;
  let cleanup: () => Promise<void>;
  const reads = new Map<string, number>();
  let store: PackageStore;

  beforeAll(async () => {
    ({ dir, cleanup } = await tempDir("depot-layout-cache-"));
    const fsStore = createFsStore(dir, { unsafeNoSync: true });
    store = {
      ...fsStore,
      getBlob: (digest) => (reads.set(digest, (reads.get(digest) ?? 0) + 1), fsStore.getBlob(digest)),
    };
    const publisher = await startDepot(store);
    const items = Array.from({ length: 200 }, (_, i) => ({ type: "dir" as const, path: `d${i}/${"p".repeat(200)}` }));
    expect((await publish(publisher.url, "wide@1.0.0", items)).status).toBe(201);
    await publisher.close();
  });
  afterAll(async () => {
    await cleanup();
  });

  it("reads its manifest once for 16 concurrent HEADs, and every answer has the archive's length", async () => {
    const depot = await startDepot(store);
    try {
      reads.clear();
      const answers = await Promise.all(
        Array.from({ length: 16 }, () => fetch(`${depot.url}/data/wide@1.0.0`, { method: "HEAD" })),
      );
      expect(answers.map((a) => a.status)).toEqual(Array(16).fill(200));
      expect(new Set(answers.map((a) => a.headers.get("content-length"))).size).toBe(1);
      const manifestReads = [...reads.values()];
      expect(manifestReads).toEqual([1]);
    } finally {
      await depot.close();
    }
  });
});

/** A version's layout with `items` directories whose paths are `pathChars` long, and a manifest of `jsonBytes`. */
function layoutOf(items: number, pathChars: number, jsonBytes: number): ArchiveLayout {
  const manifest = {
    name: "p",
    version: "1.0.0",
    licenses: [],
    items: Array.from({ length: items }, (_, i) => ({
      type: "dir",
      path: `${i}`.padEnd(pathChars, "x"),
      mode: "0755",
    })),
  } as unknown as PackageManifest;
  return archiveLayout(manifest, Buffer.alloc(jsonBytes), 0);
}

describe("the layout cache's bound", () => {
  it("counts what a layout holds: the manifest's bytes and each path, not only its parts", () => {
    const paths = layoutBytes(layoutOf(100, 4000, 10));
    expect(paths).toBeGreaterThan(100 * 2 * 4000);
    const json = layoutBytes(layoutOf(0, 1, 4 * 1024 * 1024));
    expect(json).toBeGreaterThan(4 * 1024 * 1024);
    expect(json).toBeLessThan(4 * 1024 * 1024 + 4096);
  });

  it("drops the least recently used past its bytes, and keeps no layout larger than the bound", () => {
    const cache = new LayoutCache(1024 * 1024);
    const a = layoutOf(0, 1, 400_000);
    const b = layoutOf(0, 1, 400_000);
    const c = layoutOf(0, 1, 400_000);
    cache.put("a", a);
    cache.put("b", b);
    expect(cache.get("a")).toBe(a); // now a is the most recently used
    cache.put("c", c);
    expect(cache.get("b")).toBeUndefined();
    expect(cache.get("a")).toBe(a);
    expect(cache.get("c")).toBe(c);
    expect(cache.heldBytes).toBeLessThanOrEqual(1024 * 1024);
    const huge = layoutOf(0, 1, 2 * 1024 * 1024);
    expect(cache.put("huge", huge)).toBe(huge);
    expect(cache.get("huge")).toBeUndefined();
    expect(cache.heldBytes).toBe(layoutBytes(a) + layoutBytes(c));
  });
});

describe("a layout build that fails", () => {
  it("fails every request that waited for it, keeps nothing, and the next request builds anew", async () => {
    const { dir, cleanup } = await tempDir("depot-layout-fail-");
    try {
      const fsStore = createFsStore(dir, { unsafeNoSync: true });
      const publisher = await startDepot(fsStore);
      expect((await publish(publisher.url, "flaky@1.0.0", [{ type: "dir", path: "d" }])).status).toBe(201);
      await publisher.close();
      let failing = true;
      const store: PackageStore = {
        ...fsStore,
        getBlob: (digest) => (failing ? Promise.reject(new Error("store down")) : fsStore.getBlob(digest)),
      };
      const depot = await startDepot(store);
      try {
        const heads = () => fetch(`${depot.url}/data/flaky@1.0.0`, { method: "HEAD" });
        const failed = await Promise.all(Array.from({ length: 8 }, heads));
        expect(failed.map((a) => a.status)).toEqual(Array(8).fill(500));
        failing = false;
        expect((await heads()).status).toBe(200);
      } finally {
        await depot.close();
      }
    } finally {
      await cleanup();
    }
  });
});
