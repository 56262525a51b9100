/**
 * The memory and fs PackageStores: blobs (hashing, digest check, size limit, ranges),
 * records (compare-and-swap, byte-ordered paged listing, awkward keys), concurrency in one
 * process and, for fs, across processes, stale-lock recovery and kill -9 mid-write.
 */
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { readdir, readFile, stat, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import { createFsStore } from "../src/adapters/fs/store.js";
import { createMemoryStore } from "../src/adapters/memory/store.js";
import type { PackageStore } from "../src/depot/ports.js";
import { isRunnerDepotError } from "../src/errors.js";
import { storeDigest, tempDir } from "./fixtures/depot-helpers.js";

const worker = fileURLToPath(new URL("./fixtures/depot-store-worker.ts", import.meta.url));
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
    if ((await store.putRecord(key, { n: (current?.value.n ?? 0) + 1 }, { ifRevision: current?.revision ?? null })) !== null) return;
  }
}

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
      const mismatch = await store.putBlob(chunks("abc"), { expectedDigest: storeDigest("xyz") }).catch((e: unknown) => e);
      expect(isRunnerDepotError(mismatch, "DIGEST_MISMATCH")).toBe(true);
      const tooLarge = await store.putBlob(chunks("12345", "67890"), { maxBytes: 8 }).catch((e: unknown) => e);
      expect(isRunnerDepotError(tooLarge, "TOO_LARGE")).toBe(true);
      expect(await store.statBlob(storeDigest("abc"))).toBeNull();
      expect(await store.statBlob(storeDigest("1234567890"))).toBeNull();
      const listed: string[] = [];
      for await (const d of store.listBlobs()) listed.push(d);
      expect(listed).toEqual([]);
      expect((await store.putBlob(chunks("12345678"), { maxBytes: 8, expectedDigest: storeDigest("12345678") })).size).toBe(8);
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
      const keys = ["a", "a/b", "a/b/c", "a-c", "a.d", "a/é", "a/%41", "a/~x", "a/.hidden", "a/..", "b/x", "a/ünï/cödé", "a/" + "z".repeat(60)];
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

    it("loses no update under 40 concurrent compare-and-swap increments", async () => {
      const store = await make();
      await Promise.all(Array.from({ length: 40 }, () => increment(store, "counter")));
      expect((await store.getRecord<{ n: number }>("counter"))!.value.n).toBe(40);
    });
  });
}

function run(args: string[]): Promise<{ code: number | null; out: string }> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, ["--import", "tsx", worker, ...args], { stdio: ["ignore", "pipe", "inherit"] });
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
    const info = await store.putBlob(chunks("same ", "bytes"));
    const hex = info.digest.slice(7);
    const file = join(tmp.dir, "blobs", "sha256", hex.slice(0, 2), hex);
    const before = await stat(file);
    expect(await store.putBlob(chunks("same bytes"))).toEqual(info);
    // The same inode: the second copy was dropped, not renamed over the first.
    expect((await stat(file)).ino).toBe(before.ino);
    expect(await readFile(file, "utf8")).toBe("same bytes");
    expect((await readdir(join(tmp.dir, "tmp"))).filter((name) => !name.startsWith("owner-"))).toEqual([]);
    // A file of the wrong length under the digest's name (not one this store wrote) is replaced.
    await writeFile(file, "same");
    expect(await store.putBlob(chunks("same bytes"))).toEqual(info);
    expect(await readFile(file, "utf8")).toBe("same bytes");
    await store.close?.();
  });
});

describe("fs store across processes", () => {
  it("loses no update when three processes compare-and-swap one key", async () => {
    const tmp = await tempDir("depot-store-mp-");
    cleanups.push(tmp.cleanup);
    const store = createFsStore(tmp.dir);
    const results = await Promise.all([run([tmp.dir, "cas", "shared/counter", "40"]), run([tmp.dir, "cas", "shared/counter", "40"]), Promise.all(Array.from({ length: 40 }, () => increment(store, "shared/counter")))]);
    expect(results[0].code).toBe(0);
    expect(results[1].code).toBe(0);
    expect((await store.getRecord<{ n: number }>("shared/counter"))!.value.n).toBe(120);
  });

  it("breaks locks left by a dead process, by a past incarnation, or too old; waits for a live one", async () => {
    const tmp = await tempDir("depot-store-lock-");
    cleanups.push(tmp.cleanup);
    // The stale age far above the lock wait: a wait stretched by load must give up on the
    // live holder's fresh lock, not find it old enough to break.
    const store = createFsStore(tmp.dir, { staleLockMs: 10_000, lockTimeoutMs: 500 });
    expect(await store.putRecord("locked/key", { v: 1 }, { ifRevision: null })).not.toBeNull();
    const file = join(tmp.dir, "records", "locked", "key~");
    const { hostname } = await import("node:os");
    const dead = await new Promise<number>((resolve) => {
      const child = spawn(process.execPath, ["-e", ""]);
      child.on("exit", () => resolve(child.pid!));
    });
    await writeFile(`${file}.lock`, JSON.stringify({ pid: dead, host: hostname(), incarnation: "x" }));
    const current = await store.getRecord("locked/key");
    expect(await store.putRecord("locked/key", { v: 2 }, { ifRevision: current!.revision })).not.toBeNull();
    // Our own pid but another incarnation: a previous life of this process (pid reuse).
    await writeFile(`${file}.lock`, JSON.stringify({ pid: process.pid, host: hostname(), incarnation: "previous" }));
    expect(await store.putRecord("locked/key", { v: 3 }, { ifRevision: (await store.getRecord("locked/key"))!.revision })).not.toBeNull();
    // A live holder (this test runner's parent) is waited for, then the call gives up UNAVAILABLE.
    await writeFile(`${file}.lock`, JSON.stringify({ pid: process.ppid, host: hostname(), incarnation: "live" }));
    const waited = await store.putRecord("locked/key", { v: 4 }, { ifRevision: (await store.getRecord("locked/key"))!.revision }).catch((e: unknown) => e);
    expect(isRunnerDepotError(waited, "UNAVAILABLE")).toBe(true);
    expect(((await store.getRecord<{ v: number }>("locked/key"))!.value).v).toBe(3);
    // A torn (empty) lock file past the stale age is broken too.
    await writeFile(`${file}.lock`, "");
    const { utimes } = await import("node:fs/promises");
    const past = new Date(Date.now() - 60_000);
    await utimes(`${file}.lock`, past, past);
    expect(await store.putRecord("locked/key", { v: 5 }, { ifRevision: (await store.getRecord("locked/key"))!.revision })).not.toBeNull();
  });

  it("breaks a dead process's lock on a key whose file name is at the length limit (the old aside name overflowed and spun)", async () => {
    const tmp = await tempDir("depot-store-longlock-");
    cleanups.push(tmp.cleanup);
    const store = createFsStore(tmp.dir, { staleLockMs: 60_000, lockTimeoutMs: 5_000 });
    const segment = "k".repeat(240);
    const key = `long/${segment}`;
    expect(await store.putRecord(key, { v: 1 }, { ifRevision: null })).not.toBeNull();
    const { hostname } = await import("node:os");
    const dead = await new Promise<number>((resolve) => {
      const child = spawn(process.execPath, ["-e", ""]);
      child.on("exit", () => resolve(child.pid!));
    });
    await writeFile(join(tmp.dir, "records", "long", `${segment}~.lock`), JSON.stringify({ pid: dead, host: hostname(), incarnation: "x" }));
    const current = await store.getRecord(key);
    expect(await store.putRecord(key, { v: 2 }, { ifRevision: current!.revision })).not.toBeNull();
    expect((await store.getRecord<{ v: number }>(key))!.value.v).toBe(2);
  });

  it("a lazy create a machine crash tore reads as absent: a create replaces it, a swap or delete finds nothing", async () => {
    const tmp = await tempDir("depot-store-torn-");
    cleanups.push(tmp.cleanup);
    const store = createFsStore(tmp.dir);
    // What a power loss can leave of a lazy create (never flushed): the name, with an empty
    // body or a cut-short one. Written here as the store would have named them.
    const whole = await store.putRecord("torn/whole", { v: 1 }, { ifRevision: null, lazy: true });
    expect(whole).not.toBeNull();
    const file = (key: string) => join(tmp.dir, "records", "torn", `${key}~`);
    const wholeText = await readFile(file("whole"), "utf8");
    await writeFile(file("empty"), "");
    await writeFile(file("cut"), wholeText.slice(0, wholeText.length - 3));
    await writeFile(file("zeros"), Buffer.alloc(wholeText.length));
    // A lazy create is marked (its text starts with a space), so its cut-short text is torn.
    expect(wholeText.startsWith(" ")).toBe(true);
    for (const key of ["torn/empty", "torn/cut", "torn/zeros"]) {
      expect(await store.getRecord(key), key).toBeNull();
      expect(await store.putRecord(key, { v: 2 }, { ifRevision: "any" }), key).toBeNull();
      expect(await store.deleteRecord(key), key).toBe(false);
      // A create (lazy or not) takes the name, once.
      const created = await store.putRecord(key, { v: 3 }, { ifRevision: null, lazy: key === "torn/cut" });
      expect(created, key).not.toBeNull();
      expect(await store.putRecord(key, { v: 4 }, { ifRevision: null }), key).toBeNull();
      expect(await store.getRecord(key), key).toEqual({ value: { v: 3 }, revision: created });
    }
    // The whole one is untouched, and still listed with the others.
    expect(await store.getRecord("torn/whole")).toEqual({ value: { v: 1 }, revision: whole });
    expect((await store.listRecords("torn/")).keys).toEqual(["torn/cut", "torn/empty", "torn/whole", "torn/zeros"]);
  });

  it("a damaged durable record is an error, never absent: a create cannot replace it", async () => {
    const tmp = await tempDir("depot-store-damaged-");
    cleanups.push(tmp.cleanup);
    const store = createFsStore(tmp.dir);
    const revision = await store.putRecord("damaged/version", { v: 1 }, { ifRevision: null });
    expect(revision).not.toBeNull();
    const file = join(tmp.dir, "records", "damaged", "version~");
    const text = await readFile(file, "utf8");
    expect(text.startsWith("{")).toBe(true);
    // What a disk fault or a hand edit could leave: the record cut short, unmarked.
    await writeFile(file, text.slice(0, text.length - 3));
    await expect(store.getRecord("damaged/version")).rejects.toMatchObject({ code: "INTERNAL" });
    await expect(store.putRecord("damaged/version", { v: 2 }, { ifRevision: null })).rejects.toMatchObject({ code: "INTERNAL" });
    expect(await readFile(file, "utf8")).toBe(text.slice(0, text.length - 3));
  });

  it("a losable swap is written unflushed and marked: torn, the record reads as absent; a lazy swap without it stays unmarked (torn: INTERNAL)", async () => {
    const tmp = await tempDir("depot-store-losable-");
    cleanups.push(tmp.cleanup);
    const store = createFsStore(tmp.dir);
    const file = (key: string) => join(tmp.dir, "records", "swap", `${key}~`);
    for (const key of ["losable", "lazy"]) {
      const created = await store.putRecord(`swap/${key}`, { v: 1 }, { ifRevision: null });
      const swapped = await store.putRecord(`swap/${key}`, { v: 2, pad: "x".repeat(64) }, { ifRevision: created, lazy: true, losable: key === "losable" });
      expect(swapped, key).not.toBeNull();
      expect(await store.getRecord(`swap/${key}`), key).toEqual({ value: { v: 2, pad: "x".repeat(64) }, revision: swapped });
    }
    // What a power loss can leave of a write renamed over the record unflushed: the name, cut short.
    const losableText = await readFile(file("losable"), "utf8");
    const lazyText = await readFile(file("lazy"), "utf8");
    expect(losableText.startsWith(" ")).toBe(true);
    expect(lazyText.startsWith("{")).toBe(true);
    await writeFile(file("losable"), losableText.slice(0, 20));
    await writeFile(file("lazy"), lazyText.slice(0, 20));
    // The losable record is gone whole (what its write allowed); the flushed one is damage.
    expect(await store.getRecord("swap/losable")).toBeNull();
    await expect(store.getRecord("swap/lazy")).rejects.toMatchObject({ code: "INTERNAL" });
    // Losable only with lazy: a durable swap ignores it and stays unmarked.
    const durable = await store.putRecord("swap/durable", { v: 1 }, { ifRevision: null });
    await store.putRecord("swap/durable", { v: 2 }, { ifRevision: durable, losable: true });
    expect((await readFile(file("durable"), "utf8")).startsWith("{")).toBe(true);
  });

  it("a create-only write on a whole record answers null without its key's lock (a held lock is not waited for)", async () => {
    const tmp = await tempDir("depot-store-create-held-");
    cleanups.push(tmp.cleanup);
    // lockTimeoutMs is the bound a wait for the lock would hit; staleLockMs keeps the live
    // holder's lock from being broken, however long a loaded machine stretches the call.
    const store = createFsStore(tmp.dir, { staleLockMs: 600_000, lockTimeoutMs: 500 });
    expect(await store.putRecord("held/key", { v: 1 }, { ifRevision: null, lazy: true })).not.toBeNull();
    const { hostname } = await import("node:os");
    // A live holder on this host (the test runner's parent), as a swap in another process holds it.
    await writeFile(join(tmp.dir, "records", "held", "key~.lock"), JSON.stringify({ pid: process.ppid, host: hostname(), incarnation: "live" }));
    // Only a torn file (a lazy create cut by a machine crash) needs the lock to be replaced;
    // a whole one is judged from the name alone, as a create-only write always was.
    const lost = await store.putRecord("held/key", { v: 2 }, { ifRevision: null }).catch((e: unknown) => e);
    expect(lost).toBeNull();
    expect((await store.getRecord<{ v: number }>("held/key"))!.value.v).toBe(1);
  });

  it("kill -9 while writing leaves only whole blobs and records", async () => {
    const tmp = await tempDir("depot-store-kill-");
    cleanups.push(tmp.cleanup);
    for (let round = 0; round < 3; round++) {
      const child = spawn(process.execPath, ["--import", "tsx", worker, tmp.dir, "blobs"], { stdio: ["ignore", "pipe", "inherit"] });
      await new Promise<void>((resolve) => child.stdout.once("data", () => resolve()));
      await new Promise((resolve) => setTimeout(resolve, 150 + Math.random() * 200));
      child.kill("SIGKILL");
      await new Promise((resolve) => child.once("exit", resolve));
    }
    const store = createFsStore(tmp.dir, { staleLockMs: 60_000 });
    let blobs = 0;
    for await (const digest of store.listBlobs()) {
      const hex = digest.slice(7);
      const bytes = await readFile(join(tmp.dir, "blobs", "sha256", hex.slice(0, 2), hex));
      expect(createHash("sha256").update(bytes).digest("hex")).toBe(hex);
      blobs++;
    }
    expect(blobs).toBeGreaterThan(0);
    const { keys } = await store.listRecords("rec/");
    for (const key of keys) expect(((await store.getRecord<{ filler: string }>(key))!.value.filler).length).toBeGreaterThanOrEqual(0);
    // A lock left by the killed writer does not block the next one (its pid is dead).
    for (const key of keys) expect(await store.putRecord(key, { after: true }, { ifRevision: (await store.getRecord(key))!.revision })).not.toBeNull();
  });
});
