/**
 * The memory and fs PackageStores: blobs (hashing, digest check, size limit, ranges),
 * records (compare-and-swap, byte-ordered paged listing, awkward keys, and a property
 * test of the order), concurrency in one process and, for fs, across processes (a write
 * lock held too long, group commit, kill -9 mid-write).
 */
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import diagnostics_channel from "node:diagnostics_channel";
import { mkdir, readdir, readFile, stat, writeFile } from "node:fs/promises";
import fc from "fast-check";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import { loadSqlite } from "../../src/adapters/fs/sqlite.js";
import { createFsStore } from "../../src/adapters/fs/store.js";
import { createMemoryStore } from "../../src/adapters/memory/store.js";
import type { PackageStore } from "../../src/depot/ports.js";
import { isRunnerDepotError } from "../../src/errors.js";
import { storeDigest, tempDir } from "../fixtures/depot.js";

const worker = fileURLToPath(new URL("../fixtures/depot-store-worker.ts", import.meta.url));
const cleanups: Array<() => Promise<void>> = [];
afterAll(async () => {
  for (const c of cleanups) await c();
});

async function* chunks(...parts: string[]): AsyncIterable<Uint8Array> {
  for (const p of parts) yield new TextEncoder().encode(p);
}

async function text(body: AsyncIterable<Uint8Array> | null): Promise<string | null> {
  if (!body) return null;
  const out: Buffer[] = [];
  for await (const c of body) out.push(Buffer.from(c));
  return Buffer.concat(out).toString();
}

async function increment(store: PackageStore, key: string): Promise<void> {
  for (;;) {
    const current = await store.getRecord<{ n: number }>(key);
    if (
      (await store.putRecord(key, { n: (current?.value.n ?? 0) + 1 }, { ifRevision: current?.revision ?? null })) !==
      null
    )
      return;
  }
}

/** True for a string without lone surrogates (UTF-8 cannot hold them, so no store keeps them). */
const wellFormed = (k: string) => Buffer.from(k).toString() === k;

const factories: Record<string, () => Promise<PackageStore>> = {
  memory: async () => createMemoryStore({ chunkBytes: 4 }),
  fs: async () => {
    const tmp = await tempDir("depot-store-");
    cleanups.push(tmp.cleanup);
    return createFsStore(tmp.dir);
  },
};

for (const [kind, make] of Object.entries(factories)) {
  describe(`${kind} store`, () => {
    it("stores blobs by sha-256, idempotently, with ranges", async () => {
      const store = await make();
      const info = await store.putBlob(chunks("hello ", "world"));
      expect(info).toEqual({ digest: storeDigest("hello world"), size: 11 });
      expect(await store.putBlob(chunks("hello world"))).toEqual(info);
      expect(await text(await store.getBlob(info.digest))).toBe("hello world");
      expect(await text(await store.getBlob(info.digest, { start: 6, end: 10 }))).toBe("world");
      expect(await text(await store.getBlob(info.digest, { start: 0, end: 0 }))).toBe("h");
      expect(await store.statBlob(info.digest)).toEqual({ size: 11 });
      expect(await store.getBlob(storeDigest("absent"))).toBeNull();
      expect(await store.getBlob("sha256:../../etc/passwd")).toBeNull();
      const empty = await store.putBlob(chunks());
      expect(empty.size).toBe(0);
      const listed: string[] = [];
      for await (const d of store.listBlobs()) listed.push(d);
      expect(listed.sort()).toEqual([info.digest, empty.digest].sort());
      await store.deleteBlob(info.digest);
      await store.deleteBlob(info.digest);
      expect(await store.statBlob(info.digest)).toBeNull();
    });

    it("refuses a digest mismatch or an oversized body and keeps nothing", async () => {
      const store = await make();
      const mismatch = await store
        .putBlob(chunks("abc"), { expectedDigest: storeDigest("xyz") })
        .catch((e: unknown) => e);
      expect(isRunnerDepotError(mismatch, "DIGEST_MISMATCH")).toBe(true);
      const tooLarge = await store.putBlob(chunks("12345", "67890"), { maxBytes: 8 }).catch((e: unknown) => e);
      expect(isRunnerDepotError(tooLarge, "TOO_LARGE")).toBe(true);
      expect(await store.statBlob(storeDigest("abc"))).toBeNull();
      expect(await store.statBlob(storeDigest("1234567890"))).toBeNull();
      const listed: string[] = [];
      for await (const d of store.listBlobs()) listed.push(d);
      expect(listed).toEqual([]);
      expect(
        (await store.putBlob(chunks("12345678"), { maxBytes: 8, expectedDigest: storeDigest("12345678") })).size,
      ).toBe(8);
    });

    it("compare-and-swap: create-only, revision match, conditional delete", async () => {
      const store = await make();
      const r1 = await store.putRecord("k", { v: 1 }, { ifRevision: null });
      expect(r1).not.toBeNull();
      expect(await store.putRecord("k", { v: 2 }, { ifRevision: null })).toBeNull();
      expect(await store.putRecord("k", { v: 2 }, { ifRevision: "stale" })).toBeNull();
      const r2 = await store.putRecord("k", { v: 2 }, { ifRevision: r1 });
      expect(r2).not.toBeNull();
      expect(r2).not.toBe(r1);
      expect(await store.getRecord("k")).toEqual({ value: { v: 2 }, revision: r2 });
      expect(await store.deleteRecord("k", { ifRevision: r1! })).toBe(false);
      expect(await store.deleteRecord("k", { ifRevision: r2! })).toBe(true);
      expect(await store.getRecord("k")).toBeNull();
      expect(await store.deleteRecord("k")).toBe(false);
      expect(await store.putRecord("k", null, { ifRevision: null })).not.toBeNull();
      expect((await store.getRecord("k"))!.value).toBeNull();
    });

    it("lists keys by prefix in byte order, paged, with awkward keys", async () => {
      const store = await make();
      const keys = [
        "a",
        "a/b",
        "a/b/c",
        "a-c",
        "a.d",
        "a/é",
        "a/%41",
        "a/~x",
        "a/.hidden",
        "a/..",
        "b/x",
        "a/ünï/cödé",
        "a/" + "z".repeat(60),
      ];
      for (const k of keys) expect(await store.putRecord(k, { k }, { ifRevision: null })).not.toBeNull();
      for (const k of keys) expect((await store.getRecord<{ k: string }>(k))!.value.k).toBe(k);
      const bytes = (s: string) => Buffer.from(s);
      const expected = keys.filter((k) => k.startsWith("a/")).sort((x, y) => Buffer.compare(bytes(x), bytes(y)));
      const seen: string[] = [];
      let cursor: string | undefined;
      do {
        const page = await store.listRecords("a/", { cursor, limit: 3 });
        expect(page.keys.length).toBeLessThanOrEqual(3);
        seen.push(...page.keys);
        cursor = page.cursor;
      } while (cursor !== undefined);
      expect(seen).toEqual(expected);
      expect((await store.listRecords("a/b")).keys).toEqual(["a/b", "a/b/c"]);
      expect((await store.listRecords("zzz/")).keys).toEqual([]);
    });

    it("lists any keys in UTF-8 byte order under any prefix, whatever the page size (property)", async () => {
      const store = await make();
      let round = 0;
      // Keys from the whole of Unicode (astral planes, NUL, and the code points whose UTF-16
      // order differs from their UTF-8 order), under a prefix of their own per run.
      const key = fc.string({ unit: "binary", maxLength: 12 }).filter(wellFormed);
      await fc.assert(
        fc.asyncProperty(
          fc.uniqueArray(key, { maxLength: 25 }),
          fc.string({ unit: "binary", maxLength: 2 }).filter(wellFormed),
          fc.integer({ min: 1, max: 7 }),
          async (suffixes, sub, limit) => {
            const base = `prop${round++}/`;
            for (const suffix of suffixes)
              expect(await store.putRecord(base + suffix, 1, { ifRevision: null, lazy: true })).not.toBeNull();
            const prefix = base + sub;
            const expected = suffixes
              .map((k) => base + k)
              .filter((k) => k.startsWith(prefix))
              .sort((x, y) => Buffer.compare(Buffer.from(x), Buffer.from(y)));
            const seen: string[] = [];
            let cursor: string | undefined;
            do {
              const page = await store.listRecords(prefix, { cursor, limit });
              expect(page.keys.length).toBeLessThanOrEqual(limit);
              seen.push(...page.keys);
              cursor = page.cursor;
            } while (cursor !== undefined);
            expect(seen).toEqual(expected);
          },
        ),
        { numRuns: 60 },
      );
    });

    it("loses no update under 40 concurrent compare-and-swap increments", async () => {
      const store = await make();
      await Promise.all(Array.from({ length: 40 }, () => increment(store, "counter")));
      expect((await store.getRecord<{ n: number }>("counter"))!.value.n).toBe(40);
    });
  });
}

function run(args: string[]): Promise<{ code: number | null; out: string }> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, ["--import", "tsx", worker, ...args], {
      stdio: ["ignore", "pipe", "inherit"],
    });
    let out = "";
    child.stdout.on("data", (c: Buffer) => (out += c.toString()));
    child.on("exit", (code) => resolve({ code, out }));
  });
}

describe("fs store re-uploads", () => {
  it("keeps a stored blob in place when its bytes arrive again, and leaves no temp file", async () => {
    const tmp = await tempDir("depot-store-again-");
    cleanups.push(tmp.cleanup);
    const store = createFsStore(tmp.dir);
    // Larger than a small blob (those are rows of records.db): a file.
    const half = "same bytes ".repeat(1000);
    const info = await store.putBlob(chunks(half, half));
    const hex = info.digest.slice(7);
    const file = join(tmp.dir, "blobs", "sha256", hex.slice(0, 2), hex);
    const before = await stat(file);
    expect(await store.putBlob(chunks(half + half))).toEqual(info);
    // The same inode: the second copy was dropped, not renamed over the first.
    expect((await stat(file)).ino).toBe(before.ino);
    expect(await readFile(file, "utf8")).toBe(half + half);
    expect(await readdir(join(tmp.dir, "tmp"))).toEqual([]);
    // A file of the wrong length under the digest's name (not one this store wrote) is replaced.
    await writeFile(file, "same");
    expect(await store.putBlob(chunks(half + half))).toEqual(info);
    expect(await readFile(file, "utf8")).toBe(half + half);
    await store.close?.();
  });

  it("keeps small bodies as rows, large ones as files, and finds blobs stored as files at any size", async () => {
    const tmp = await tempDir("depot-store-small-");
    cleanups.push(tmp.cleanup);
    const store = createFsStore(tmp.dir);
    const small = await store.putBlob(chunks("x".repeat(16 * 1024)));
    const large = await store.putBlob(chunks("y".repeat(16 * 1024 + 1)));
    const fileOf = (digest: string) => join(tmp.dir, "blobs", "sha256", digest.slice(7, 9), digest.slice(7));
    await expect(stat(fileOf(small.digest))).rejects.toMatchObject({ code: "ENOENT" });
    expect((await stat(fileOf(large.digest))).size).toBe(16 * 1024 + 1);
    // A small blob an older store wrote as a file: read, stated, listed, re-stored in place, deleted.
    const older = "older small blob";
    const olderDigest = storeDigest(older);
    await mkdir(dirname(fileOf(olderDigest)), { recursive: true });
    await writeFile(fileOf(olderDigest), older);
    expect(await text(await store.getBlob(olderDigest, { start: 6, end: 10 }))).toBe("small");
    expect(await store.statBlob(olderDigest)).toEqual({ size: older.length });
    expect(await store.putBlob(chunks(older))).toEqual({ digest: olderDigest, size: older.length });
    const listed: string[] = [];
    for await (const d of store.listBlobs()) listed.push(d);
    expect(listed).toEqual([small.digest, large.digest, olderDigest].sort());
    for (const digest of listed) await store.deleteBlob(digest);
    for (const digest of listed) expect(await store.statBlob(digest)).toBeNull();
    await store.close?.();
  });
});

describe("fs store across processes", () => {
  it("loses no update when three processes compare-and-swap one key", async () => {
    const tmp = await tempDir("depot-store-mp-");
    cleanups.push(tmp.cleanup);
    const store = createFsStore(tmp.dir);
    const results = await Promise.all([
      run([tmp.dir, "cas", "shared/counter", "40"]),
      run([tmp.dir, "cas", "shared/counter", "40"]),
      Promise.all(Array.from({ length: 40 }, () => increment(store, "shared/counter"))),
    ]);
    expect(results[0].code).toBe(0);
    expect(results[1].code).toBe(0);
    expect((await store.getRecord<{ n: number }>("shared/counter"))!.value.n).toBe(120);
  });

  it("waits for another process's write lock, then answers UNAVAILABLE past lockTimeoutMs; reads go on meanwhile", async () => {
    const tmp = await tempDir("depot-store-lock-");
    cleanups.push(tmp.cleanup);
    const store = createFsStore(tmp.dir, { lockTimeoutMs: 300 });
    const revision = await store.putRecord("locked/key", { v: 1 }, { ifRevision: null });
    // Another process's transaction holding the write lock (a connection of its own).
    const { DatabaseSync } = loadSqlite();
    const other = new DatabaseSync(join(tmp.dir, "records.db"));
    other.exec("BEGIN IMMEDIATE");
    try {
      const waited = await store.putRecord("locked/key", { v: 2 }, { ifRevision: revision }).catch((e: unknown) => e);
      expect(isRunnerDepotError(waited, "UNAVAILABLE")).toBe(true);
      expect(await store.getRecord("locked/key")).toEqual({ value: { v: 1 }, revision });
      expect((await store.listRecords("locked/")).keys).toEqual(["locked/key"]);
      // A write waiting for the lock goes through once it is released.
      const later = store.putRecord("locked/key", { v: 3 }, { ifRevision: revision });
      await new Promise((resolve) => setTimeout(resolve, 50));
      other.exec("ROLLBACK");
      expect(await later).not.toBeNull();
    } finally {
      other.close();
    }
    expect((await store.getRecord<{ v: number }>("locked/key"))!.value.v).toBe(3);
    await store.close?.();
  });

  it("a durable write resolves after a flush of the WAL; a lazy one, and any write under unsafeNoSync, without one", async () => {
    const tmp = await tempDir("depot-store-flush-");
    cleanups.push(tmp.cleanup);
    const flushed: string[] = [];
    const listener = (message: unknown) => flushed.push((message as { wal: string }).wal);
    diagnostics_channel.subscribe("runner-depot:fs-wal-flush", listener);
    try {
      const store = createFsStore(join(tmp.dir, "synced"));
      await store.getRecord("open"); // the store's open (its import writes, flushed)
      flushed.length = 0;
      const order: string[] = [];
      const listenerOrder = () => order.push("flush");
      diagnostics_channel.subscribe("runner-depot:fs-wal-flush", listenerOrder);
      await store.putRecord("k", 1, { ifRevision: null }).then(() => order.push("durable"));
      diagnostics_channel.unsubscribe("runner-depot:fs-wal-flush", listenerOrder);
      expect(order).toEqual(["flush", "durable"]);
      expect(flushed).toEqual([join(tmp.dir, "synced", "records.db-wal")]);
      // Writes in one turn share a flush.
      flushed.length = 0;
      await Promise.all(Array.from({ length: 8 }, (_, i) => store.putRecord(`k${i}`, i, { ifRevision: null })));
      expect(flushed.length).toBe(1);
      flushed.length = 0;
      await store.putRecord("lazy", 1, { ifRevision: null, lazy: true });
      await store.deleteRecord("lazy", { ifRevision: null, lazy: true });
      expect(flushed).toEqual([]);
      await store.close?.();
      const unsynced = createFsStore(join(tmp.dir, "unsynced"), { unsafeNoSync: true });
      await unsynced.putRecord("k", 1, { ifRevision: null });
      await unsynced.putBlob(chunks("small blob"));
      expect(flushed).toEqual([]);
      await unsynced.close?.();
    } finally {
      diagnostics_channel.unsubscribe("runner-depot:fs-wal-flush", listener);
    }
  });

  /** An opened fs store in a fresh directory, and the WAL flushes logged as "flush" in `order` until `stopLog()`. */
  async function storeWithFlushLog(prefix: string) {
    const tmp = await tempDir(prefix);
    cleanups.push(tmp.cleanup);
    const store = createFsStore(tmp.dir);
    await store.getRecord("open");
    const order: string[] = [];
    const listener = () => order.push("flush");
    diagnostics_channel.subscribe("runner-depot:fs-wal-flush", listener);
    return { store, order, stopLog: () => diagnostics_channel.unsubscribe("runner-depot:fs-wal-flush", listener) };
  }

  it("tells a write's outcome at its commit (onVisible), before the WAL flush its promise waits for", async () => {
    const { store, order, stopLog } = await storeWithFlushLog("depot-store-visible-");
    try {
      const [first, second] = await Promise.all([
        store
          .putRecord("vis/k", 1, { ifRevision: null, onVisible: (applied) => order.push(`visible ${applied}`) })
          .then((r) => (order.push("resolved"), r)),
        store.putRecord("vis/k", 2, { ifRevision: null, onVisible: (applied) => order.push(`visible ${applied}`) }),
      ]);
      expect(first).not.toBeNull();
      expect(second).toBeNull();
      expect(order.slice(0, 3)).toEqual(["visible true", "visible false", "flush"]);
      expect(order).toContain("resolved");
      expect(order.indexOf("resolved")).toBeGreaterThan(order.indexOf("flush"));
    } finally {
      stopLog();
    }
    await store.close?.();
  });

  it("resolves deferSync writes and small blobs at their commit, without a flush; syncRecords flushes them (and only then)", async () => {
    const { store, order, stopLog } = await storeWithFlushLog("depot-store-defer-");
    try {
      const revision = await store.putRecord("defer/k", 1, { ifRevision: null, deferSync: true });
      order.push("record");
      expect(await store.putRecord("defer/k", 2, { ifRevision: null, deferSync: true })).toBeNull();
      expect(await store.putRecord("defer/k", 3, { ifRevision: revision!, deferSync: true })).not.toBeNull();
      const blob = await store.putBlob(
        (async function* () {
          yield Buffer.from("small deferred blob");
        })(),
        { deferSync: true },
      );
      order.push("blob");
      expect(await store.statBlob(blob.digest)).toEqual({ size: 19 });
      expect((await store.getRecord("defer/k"))?.value).toBe(3);
      await store.syncRecords!();
      order.push("synced");
      expect(order).toEqual(["record", "blob", "flush", "synced"]);
    } finally {
      stopLog();
    }
    await store.close?.();
  });

  it("checkpoints the WAL on its worker while the store stays open, and writes the WAL from its start again", async () => {
    const tmp = await tempDir("depot-store-checkpoint-");
    cleanups.push(tmp.cleanup);
    const checkpoints: Array<{ copied: number; restarted: boolean }> = [];
    const listener = (message: unknown) => checkpoints.push(message as { copied: number; restarted: boolean });
    diagnostics_channel.subscribe("runner-depot:fs-checkpoint", listener);
    cleanups.push(async () => {
      diagnostics_channel.unsubscribe("runner-depot:fs-checkpoint", listener);
    });
    const store = createFsStore(tmp.dir);
    const value = "x".repeat(4000);
    // About 6 MiB of WAL (each record a leaf cell and an overflow page): past 1,000 frames,
    // below the store's own backstop, so only the worker can have copied it.
    const writeMany = async (tag: string) => {
      for (let round = 0; round < 30; round++) {
        await Promise.all(
          Array.from({ length: 25 }, (_, i) =>
            store.putRecord(`ckpt/${tag}/${round}/${i}`, value, { ifRevision: null }),
          ),
        );
      }
    };
    await writeMany("a");
    const dbPath = join(tmp.dir, "records.db");
    const deadline = Date.now() + 20_000;
    const restarted = () => checkpoints.some((c) => c.copied > 1000 && c.restarted);
    // A RESTART that found the write lock taken is tried again at a later commit.
    for (let i = 0; !restarted() && Date.now() < deadline; i++) {
      await new Promise((resolve) => setTimeout(resolve, 100));
      await store.putRecord(`ckpt/poke/${i}`, 1, { ifRevision: null });
    }
    expect((await stat(dbPath)).size).toBeGreaterThan(2_000_000);
    // The worker's checkpoints did it (the store's own connection waits for 16,000 pages).
    expect(restarted()).toBe(true);
    const walAfterFirst = (await stat(`${dbPath}-wal`)).size;
    // The checkpoint copied the whole WAL (RESTART): the next writes start at its beginning
    // instead of appending (which would double the file).
    await writeMany("b");
    expect((await stat(`${dbPath}-wal`)).size).toBeLessThan(walAfterFirst * 1.5);
    expect((await store.getRecord<string>("ckpt/a/0/0"))!.value).toBe(value);
    await store.close?.();
  });

  it("writes issued in one turn share a commit, each with its own compare-and-swap outcome", async () => {
    const tmp = await tempDir("depot-store-batch-");
    cleanups.push(tmp.cleanup);
    const store = createFsStore(tmp.dir);
    const first = await store.putRecord("batch/k", { v: 0 }, { ifRevision: null });
    // Ten swaps from one revision, lazy and durable mixed, and ten creates of one key: one of each wins.
    const swaps = await Promise.all(
      Array.from({ length: 10 }, (_, i) =>
        store.putRecord("batch/k", { v: i + 1 }, { ifRevision: first, lazy: i % 2 === 0 }),
      ),
    );
    const creates = await Promise.all(
      Array.from({ length: 10 }, (_, i) =>
        store.putRecord("batch/new", { v: i }, { ifRevision: null, lazy: i % 3 === 0 }),
      ),
    );
    expect(swaps.filter((r) => r !== null)).toHaveLength(1);
    expect(swaps[0]).not.toBeNull(); // in call order: the first swap saw `first`
    expect(creates.filter((r) => r !== null)).toHaveLength(1);
    expect(await store.getRecord("batch/k")).toEqual({ value: { v: 1 }, revision: swaps[0] });
    expect(await store.getRecord("batch/new")).toEqual({ value: { v: 0 }, revision: creates[0] });
    // A delete and a create of one key in one turn: applied in order.
    const [deleted, recreated] = await Promise.all([
      store.deleteRecord("batch/new", { ifRevision: creates[0]! }),
      store.putRecord("batch/new", { v: "again" }, { ifRevision: null }),
    ]);
    expect(deleted).toBe(true);
    expect(recreated).not.toBeNull();
    expect((await store.getRecord<{ v: string }>("batch/new"))!.value.v).toBe("again");
    await store.close?.();
  });

  it("opens, upgrades and serves one directory from several processes at once", async () => {
    const tmp = await tempDir("depot-store-open-mp-");
    cleanups.push(tmp.cleanup);
    const results = await Promise.all([1, 2, 3].map((n) => run([tmp.dir, "cas", `open/${n}`, "5"])));
    for (const result of results) expect(result.code).toBe(0);
    const store = createFsStore(tmp.dir);
    for (const n of [1, 2, 3]) expect((await store.getRecord<{ n: number }>(`open/${n}`))!.value.n).toBe(5);
    await store.close?.();
  });

  it("kill -9 in the middle of compare-and-swaps loses no acknowledged write", async () => {
    const tmp = await tempDir("depot-store-kill-cas-");
    cleanups.push(tmp.cleanup);
    let acknowledged = 0;
    for (let round = 0; round < 3; round++) {
      const child = spawn(
        process.execPath,
        ["--import", "tsx", worker, tmp.dir, "cas", "kill/counter", "100000", "acks"],
        { stdio: ["ignore", "pipe", "inherit"] },
      );
      let out = "";
      await new Promise<void>((resolve) =>
        child.stdout.on("data", (c: Buffer) => {
          out += c.toString();
          if (out.includes("\n")) resolve();
        }),
      );
      await new Promise((resolve) => setTimeout(resolve, 100 + Math.random() * 200));
      child.kill("SIGKILL");
      await new Promise((resolve) => child.once("exit", resolve));
      // Each line is printed after its write's promise resolved.
      const lines = out.split("\n").filter((l) => /^\d+$/.test(l));
      acknowledged = Math.max(acknowledged, Number(lines.at(-1)));
      const store = createFsStore(tmp.dir);
      expect((await store.getRecord<{ n: number }>("kill/counter"))!.value.n).toBeGreaterThanOrEqual(acknowledged);
      await store.close?.();
    }
    expect(acknowledged).toBeGreaterThan(0);
  });

  it("kill -9 while writing leaves only whole blobs and records", async () => {
    const tmp = await tempDir("depot-store-kill-");
    cleanups.push(tmp.cleanup);
    for (let round = 0; round < 3; round++) {
      const child = spawn(process.execPath, ["--import", "tsx", worker, tmp.dir, "blobs"], {
        stdio: ["ignore", "pipe", "inherit"],
      });
      // Killed after its first blob is whole (so there is one to check, however slow the disk), mid-write of a later one.
      await new Promise<void>((resolve) => child.stdout.once("data", () => resolve()));
      await new Promise((resolve) => setTimeout(resolve, Math.random() * 200));
      child.kill("SIGKILL");
      await new Promise((resolve) => child.once("exit", resolve));
    }
    const store = createFsStore(tmp.dir);
    let blobs = 0;
    for await (const digest of store.listBlobs()) {
      // Rows and files alike hash to their digest.
      const raw: Buffer[] = [];
      for await (const c of (await store.getBlob(digest))!) raw.push(Buffer.from(c));
      expect(`sha256:${createHash("sha256").update(Buffer.concat(raw)).digest("hex")}`).toBe(digest);
      blobs++;
    }
    expect(blobs).toBeGreaterThan(0);
    const { keys } = await store.listRecords("rec/");
    for (const key of keys)
      expect((await store.getRecord<{ filler: string }>(key))!.value.filler.length).toBeGreaterThanOrEqual(0);
    // A write lock dies with its process: the next writer is not blocked.
    for (const key of keys)
      expect(
        await store.putRecord(key, { after: true }, { ifRevision: (await store.getRecord(key))!.revision }),
      ).not.toBeNull();
  });
});
