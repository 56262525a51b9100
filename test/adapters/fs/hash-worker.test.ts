/**
 * The fs store's hashing worker (src/adapters/fs/hash-worker.ts): interleaved sessions each
 * get their own digest, buffers move to the worker (or are copied when they share memory),
 * a slow worker holds `update` back, and close ends the thread.
 */
import { createHash } from "node:crypto";
import { describe, expect, it } from "vitest";
import { createHashWorker } from "../../../src/adapters/fs/hash-worker.js";
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
});
