/**
 * The fs store's hashing worker (src/adapters/fs/hash-worker.ts): interleaved sessions each
 * get their own digest, buffers move to the worker (or are copied when they share memory),
 * a slow worker holds `update` back, close ends the thread; a session with a file has its
 * bytes written there in order and flushed every 32 MiB, and a failed write fails it.
 */
import { createHash } from "node:crypto";
import { mkdtemp, open, readFile, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { createHashWorker, FLUSH_BYTES, WRITE_BYTES } from "../../../src/adapters/fs/hash-worker.js";
import { patternBytes } from "../../../src/testing/index.js";

const sha = (bytes: Uint8Array) => createHash("sha256").update(bytes).digest("hex");

describe("fs store hashing worker", () => {
  it("hashes interleaved sessions in their own order, taking whole buffers and copying pooled slices", async () => {
    const hashes = createHashWorker();
    try {
      const a = patternBytes(3 * 1024 * 1024 + 17, 1);
      const b = patternBytes(2 * 1024 * 1024 + 5, 2);
      const [sa, sb] = [hashes.start(), hashes.start()];
      for (let at = 0; at < Math.max(a.length, b.length); at += 256 * 1024) {
        if (at < a.length) {
          const chunk = Buffer.from(a.subarray(at, at + 256 * 1024));
          const owned = chunk.byteLength === 256 * 1024; // not from the small-Buffer pool
          await sa.update(chunk);
          if (owned) expect(chunk.byteLength).toBe(0); // moved (detached): the worker has it
        }
        if (at < b.length) await sb.update(Buffer.from(b.subarray(at, at + 256 * 1024)));
      }
      // A small Buffer shares the pool's memory: copied, and left intact here.
      const pooled = Buffer.from("tail");
      await sa.update(pooled);
      expect(pooled.toString()).toBe("tail");
      expect(await sa.digest()).toBe(sha(Buffer.concat([a, Buffer.from("tail")])));
      expect(await sb.digest()).toBe(sha(b));
      expect(await hashes.start().digest()).toBe(sha(Buffer.alloc(0)));
    } finally {
      await hashes.close();
    }
  });

  it("holds an update back while 8 MiB wait to be hashed, and starts a new thread after close", async () => {
    const hashes = createHashWorker();
    const session = hashes.start();
    const bytes = patternBytes(64 * 1024 * 1024, 3);
    const updates: Array<Promise<void>> = [];
    let resolvedAtOnce = 0;
    for (let at = 0; at < bytes.length; at += 1024 * 1024) {
      const update = session.update(Buffer.from(bytes.subarray(at, at + 1024 * 1024)));
      let settled = false;
      void update.then(() => (settled = true));
      await Promise.resolve();
      if (settled) resolvedAtOnce++;
      updates.push(update);
      await update;
    }
    // The first 8 MiB go at once; past that an update waits for the worker to catch up at least once.
    expect(resolvedAtOnce).toBeLessThan(64);
    expect(await session.digest()).toBe(sha(bytes));
    await hashes.close();
    const later = hashes.start();
    await later.update(Buffer.from("again"));
    expect(await later.digest()).toBe(sha(Buffer.from("again")));
    await hashes.close();
  });

  it("fails the sessions of a worker that exits mid-body; the next session gets a new one", async () => {
    const hashes = createHashWorker();
    const cut = hashes.start();
    await cut.update(Buffer.from(patternBytes(1024 * 1024, 4)));
    await hashes.close();
    await expect(cut.digest()).rejects.toThrow(/exited/);
    await expect(cut.update(Buffer.from("more"))).rejects.toThrow(/exited/);
    const next = hashes.start();
    await next.update(Buffer.from("after"));
    expect(await next.digest()).toBe(sha(Buffer.from("after")));
    await hashes.close();
  });

  it("writes a session's buffers to its file in order while hashing them, flushing every 32 MiB", async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), "hash-worker-"));
    const hashes = createHashWorker();
    try {
      const bytes = patternBytes(FLUSH_BYTES + 9 * WRITE_BYTES + 12_345, 5);
      const flushes: number[] = [];
      for (const sync of [true, false]) {
        const handle = await open(path.join(dir, `blob-${sync}`), "wx");
        const session = hashes.start({ fd: handle.fd, sync, onFlush: (written) => flushes.push(written) });
        for (let at = 0; at < bytes.length; at += WRITE_BYTES) {
          // Whole buffers of the pool (moved, then handed back for reuse), and a short last one (copied).
          const end = Math.min(bytes.length, at + WRITE_BYTES);
          const buffer = end - at === WRITE_BYTES ? hashes.buffer() : Buffer.alloc(end - at);
          expect(buffer.byteLength).toBe(end - at);
          bytes.copy(buffer, 0, at, end);
          await session.update(buffer);
        }
        expect(await session.digest()).toBe(sha(bytes));
        await handle.close();
        expect((await readFile(path.join(dir, `blob-${sync}`))).equals(bytes)).toBe(true);
        // Synced: one background fdatasync once 32 MiB were written; unsynced: none.
        expect(flushes).toEqual([FLUSH_BYTES]);
      }
    } finally {
      await hashes.close();
      await rm(dir, { recursive: true, force: true });
    }
  });

  it("fails a session whose write fails and lets go of its file on drop; the next session works", async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), "hash-worker-"));
    const hashes = createHashWorker();
    try {
      const file = path.join(dir, "read-only");
      await (await open(file, "w")).close();
      const handle = await open(file, "r"); // writes to it fail with EBADF
      const session = hashes.start({ fd: handle.fd, sync: true });
      let failure: unknown;
      for (let i = 0; i < 64 && failure === undefined; i++) {
        await session.update(Buffer.from(patternBytes(WRITE_BYTES, i))).catch((error: unknown) => (failure = error));
      }
      failure ??= await session.digest().catch((error: unknown) => error);
      expect(failure).toMatchObject({ code: "EBADF" });
      await expect(session.digest()).rejects.toMatchObject({ code: "EBADF" });
      await session.drop(); // settles: the worker is done with the descriptor
      await handle.close();
      const next = hashes.start();
      await next.update(Buffer.from("after"));
      expect(await next.digest()).toBe(sha(Buffer.from("after")));
    } finally {
      await hashes.close();
      await rm(dir, { recursive: true, force: true });
    }
  });

  it("lends 16 shared slots, then moves fresh buffers; either way the digest is the bytes'", async () => {
    const hashes = createHashWorker();
    try {
      const session = hashes.start();
      const taken = Array.from({ length: 20 }, () => hashes.buffer());
      const shared = taken.filter((b) => b.buffer instanceof SharedArrayBuffer);
      expect(shared.length).toBe(16);
      const bytes = patternBytes(20 * WRITE_BYTES, 6);
      for (const [i, buffer] of taken.entries()) {
        bytes.copy(buffer, 0, i * WRITE_BYTES, (i + 1) * WRITE_BYTES);
        await session.update(buffer); // one at a time, as a session's bytes come
      }
      // Slots stay (named, not moved); the 4 fresh buffers moved to the worker.
      expect(taken.map((b) => b.byteLength)).toEqual([...Array(16).fill(WRITE_BYTES), 0, 0, 0, 0]);
      expect(await session.digest()).toBe(sha(bytes));
      // Every slot is free again once written and hashed.
      expect(
        Array.from({ length: 16 }, () => hashes.buffer()).every((b) => b.buffer instanceof SharedArrayBuffer),
      ).toBe(true);
    } finally {
      await hashes.close();
    }
  });
});
