/**
 * The fs log store's directory fsyncs as a runner sees them, over a real HTTP/2 server and
 * gRPC client (session 9 review): a filesystem that cannot fsync a directory (EINVAL) still
 * takes lines; a disk that fails the fsync (EIO) fails the call, which acknowledges nothing.
 */
import { createHash, randomUUID } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { createFsLogArchive, createFsLogStore } from "../../../src/adapters/fs/index.js";
import { createFsStore } from "../../../src/adapters/fs/store.js";
import { logEntry } from "../../../src/testing/helpers.js";
import { errno, failDirSync, replaceDirSync } from "../../fixtures/dir-sync.js";
import { line, send, startHarness, storedTexts } from "../../fixtures/runner-service.js";

const root = mkdtempSync(join(tmpdir(), "runner-depot-dir-sync-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

async function* body(bytes: Uint8Array): AsyncGenerator<Uint8Array> {
  yield bytes;
}

describe("fs log store directory fsyncs over the wire (session 9 review)", () => {
  it("EIO: the call fails and its committed count stays; once the disk works the lines are taken", async () => {
    const harness = await startHarness({ logs: createFsLogStore(join(root, "eio")) });
    const id = randomUUID();
    let failing = false;
    const undo = await failDirSync("EIO", () => failing);
    try {
      expect(await send(harness.client, [line(id, "a"), line(id, "b")])).toMatchObject({ ok: true, committed: "2" });
      failing = true;
      const failed = await send(harness.client, [line(id, "c")], { offset: 2 });
      // INTERNAL, with the count the server holds durably: the two lines before.
      expect(failed).toMatchObject({ ok: null, code: "Internal", committed: "2" });
      expect((await harness.logs.get(id))?.committed).toBe(2);
      failing = false;
      expect(await send(harness.client, [line(id, "c")], { offset: 2 })).toMatchObject({ ok: true, committed: "3" });
      expect(await storedTexts(harness.logs, id)).toEqual(["a", "b", "c"]);
    } finally {
      undo();
      await harness.close();
    }
  });

  it("EINVAL (a filesystem that cannot fsync a directory): calls succeed and every line is stored", async () => {
    const dir = join(root, "einval");
    const harness = await startHarness({ logs: createFsLogStore(dir) });
    const id = randomUUID();
    const undo = await failDirSync("EINVAL", () => true);
    try {
      expect(await send(harness.client, [line(id, "a"), line(id, "b")])).toMatchObject({ ok: true, committed: "2" });
      expect(await send(harness.client, [line(id, "c")], { offset: 2 })).toMatchObject({ ok: true, committed: "3" });
      expect(await storedTexts(harness.logs, id)).toEqual(["a", "b", "c"]);
    } finally {
      undo();
      await harness.close();
    }
  });
});

describe("fs log archive: its directory's fsyncs (session 9 review)", () => {
  it("the first put fsyncs the parents of the directories it made, then the archive directory after its rename", async () => {
    const parent = join(root, "archive-parent");
    const dir = join(parent, "archive");
    const synced: string[] = [];
    const undo = await replaceDirSync((original, path) => (synced.push(path), original()));
    try {
      const archive = createFsLogArchive(dir);
      await archive.put("job-1", body(Buffer.from("lines")));
      expect(synced).toEqual([parent, root, dir]);
      synced.length = 0;
      await archive.put("job-2", body(Buffer.from("more")));
      expect(synced).toEqual([dir]);
    } finally {
      undo();
    }
  });

  it("EIO on the directory's fsync fails the put (the log store then keeps the job's lines); EINVAL does not", async () => {
    const dir = join(root, "archive-eio");
    const archive = createFsLogArchive(dir);
    await archive.put("first", body(Buffer.from("x")));
    let undo = await replaceDirSync(() => Promise.reject(errno("EIO")));
    try {
      await expect(archive.put("job", body(Buffer.from("lines")))).rejects.toThrow(/EIO/);
    } finally {
      undo();
    }
    undo = await replaceDirSync(() => Promise.reject(errno("EINVAL")));
    try {
      await archive.put("job", body(Buffer.from("lines")));
    } finally {
      undo();
    }
    expect(Buffer.from((await archive.read("job", 0, 5))!).toString()).toBe("lines");
  });
});

describe("fs package store: the same rule for its blob directories (session 9 review)", () => {
  // Above the small-blob size (small-blobs.ts), so the blob is a file renamed into its shard.
  const big = (fill: number) => Buffer.alloc(64 * 1024, fill);

  it("a blob's shard, and the directories above it the store made, have their entries fsynced before the put answers", async () => {
    const dir = join(root, "packages-fresh");
    const blobs = join(dir, "blobs");
    const synced: string[] = [];
    const undo = await replaceDirSync((original, path) => (synced.push(path), original()));
    const store = createFsStore(dir);
    try {
      const { digest } = await store.putBlob(body(big(3)));
      const shard = join(blobs, "sha256", digest.slice("sha256:".length, "sha256:".length + 2));
      expect(synced).toEqual([blobs, dir, root, join(blobs, "sha256"), shard]);
      synced.length = 0;
      // Another blob into the same shard: its rename only.
      const sameShard = big(4);
      for (let i = 0; !createHash("sha256").update(sameShard).digest("hex").startsWith(digest.slice(7, 9)); i++)
        sameShard.writeUInt32BE(i, 0);
      await store.putBlob(body(sameShard));
      expect(synced).toEqual([shard]);
    } finally {
      undo();
      await store.close?.();
    }
  });

  it("a second blob into a shard being made waits for the shard's entry fsync (held here) too", async () => {
    const dir = join(root, "packages-race");
    const store = createFsStore(dir);
    await store.putBlob(body(Buffer.from("opens the store")));
    const a = big(5);
    const prefix = createHash("sha256").update(a).digest("hex").slice(0, 2);
    const b = big(6);
    for (let i = 0; !createHash("sha256").update(b).digest("hex").startsWith(prefix); i++) b.writeUInt32BE(i, 0);
    const sha256 = join(dir, "blobs", "sha256");
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    let held = 0;
    const undo = await replaceDirSync(async (original, path) => {
      if (path === sha256) {
        held++;
        await gate;
      }
      return original();
    });
    try {
      let answered = 0;
      const puts = [a, b].map((blob) => store.putBlob(body(blob)).then(() => answered++));
      for (let i = 0; i < 400 && held === 0; i++) await new Promise((resolve) => setTimeout(resolve, 5));
      expect(held).toBe(1);
      await new Promise((resolve) => setTimeout(resolve, 50));
      expect(answered).toBe(0);
      release();
      await Promise.all(puts);
      expect(held).toBe(1);
    } finally {
      undo();
      release();
      await store.close?.();
    }
  });

  it("EIO on a shard directory's fsync fails the put; EINVAL (cannot fsync a directory) lets it succeed", async () => {
    const store = createFsStore(join(root, "packages"));
    try {
      let undo = await replaceDirSync(() => Promise.reject(errno("EIO")));
      try {
        await expect(store.putBlob(body(big(1)))).rejects.toThrow(/EIO/);
      } finally {
        undo();
      }
      undo = await replaceDirSync(() => Promise.reject(errno("EINVAL")));
      try {
        const info = await store.putBlob(body(big(2)));
        expect(info.size).toBe(64 * 1024);
      } finally {
        undo();
      }
    } finally {
      await store.close?.();
    }
  });
});

describe("fs log store: what a store trusts when it opens a directory (review 2)", () => {
  it("a state renamed by a process that died before its directory fsync is fsynced before a call is acknowledged from it", async () => {
    // The dead process: its state and log are in jobs/, its rename's directory fsync never ran.
    const dir = join(root, "reopened");
    const seed = createFsLogStore(dir, { fsync: false });
    const id = randomUUID();
    await seed.append(id, 0, [logEntry("a"), logEntry("b")]);
    await seed.close?.();
    const synced: string[] = [];
    const undo = await replaceDirSync((original, path) => (synced.push(path), original()));
    const harness = await startHarness({ logs: createFsLogStore(dir) });
    try {
      // The agent replays what it had not seen acknowledged: nothing new to write, so nothing of this call syncs.
      expect(await send(harness.client, [line(id, "a"), line(id, "b")])).toMatchObject({ ok: true, committed: "2" });
      // A machine crash now must not take back the "2" just acknowledged: the jobs directory holding the rename was fsynced.
      expect(synced).toContain(join(dir, "jobs"));
    } finally {
      undo();
      await harness.close();
    }
  });
});

describe("fs package store: a blob already in its shard when a store opens (review 2)", () => {
  it("a re-upload of a blob a dead process renamed into a shard fsyncs the shard's entry before the put answers", async () => {
    const dir = join(root, "packages-survivor");
    const blob = Buffer.alloc(64 * 1024, 7);
    // The dead process: the blob is in its shard (synced, renamed); whether the shard's entry reached the disk is unknown.
    const before = createFsStore(dir);
    const { digest } = await before.putBlob(body(blob));
    await before.close?.();
    const sha256 = join(dir, "blobs", "sha256");
    const shard = join(sha256, digest.slice("sha256:".length, "sha256:".length + 2));
    const synced: string[] = [];
    const undo = await replaceDirSync((original, path) => (synced.push(path), original()));
    const store = createFsStore(dir);
    try {
      // The client retries the upload the dead process never answered: the bytes are there, so nothing is renamed.
      expect(await store.putBlob(body(blob))).toMatchObject({ digest, size: blob.length });
      // sha256 holds the shard's entry; the shard holds the blob's.
      expect(synced).toContain(sha256);
      expect(synced).toContain(shard);
    } finally {
      undo();
      await store.close?.();
    }
  });
});

describe("fs package store: a shard whose entry fsync failed (review 2)", () => {
  it("is not taken as synced: both writers into it fail, and the next put into it fsyncs its entry again", async () => {
    const dir = join(root, "packages-shard-eio");
    const store = createFsStore(dir);
    // Opened first, so the failure below is the shard's, not the store's setup.
    await store.putBlob(body(Buffer.from("opens the store")));
    const a = Buffer.alloc(64 * 1024, 8);
    const prefix = createHash("sha256").update(a).digest("hex").slice(0, 2);
    const b = Buffer.alloc(64 * 1024, 9);
    for (let i = 0; !createHash("sha256").update(b).digest("hex").startsWith(prefix); i++) b.writeUInt32BE(i, 0);
    const sha256 = join(dir, "blobs", "sha256");
    const synced: string[] = [];
    let failing = true;
    const undo = await replaceDirSync((original, path) => {
      // This store's directories only: an earlier test's store may still fsync its own.
      if (path.startsWith(dir)) synced.push(path);
      return failing && path === sha256 ? Promise.reject(errno("EIO")) : original();
    });
    try {
      const outcomes = await Promise.allSettled([a, b].map((blob) => store.putBlob(body(blob))));
      expect(outcomes.map((o) => o.status)).toEqual(["rejected", "rejected"]);
      // Only fsyncs of the shard's entry: one shared by both, or a second when the other
      // writer came after the first had failed (timing); neither blob renamed into the shard.
      expect(new Set(synced), JSON.stringify(synced)).toEqual(new Set([sha256]));
      failing = false;
      synced.length = 0;
      const { digest } = await store.putBlob(body(b));
      expect(synced).toEqual([sha256, join(sha256, prefix)]);
      expect((await store.statBlob(digest))?.size).toBe(b.length);
    } finally {
      undo();
      await store.close?.();
    }
  });
});
