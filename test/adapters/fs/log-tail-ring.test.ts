/**
 * The fs store's tail ring (src/adapters/fs/log-tail-file.ts) against the memory store, over random appends: lines
 * of every size (one larger than the whole tail), appends within a segment and across many, so that writes wrap at
 * the ring's end and the ring is copied into larger generations. Every read, between appends and from a store
 * opened afresh, gives what the memory store gives; the jobs directory holds one ring file for the job.
 */
import { randomUUID } from "node:crypto";
import { mkdtemp, readdir, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import fc from "fast-check";
import { expect, it } from "vitest";
import { createFsLogStore } from "../../../src/adapters/fs/log-store.js";
import { createMemoryLogStore } from "../../../src/adapters/memory/log-store.js";
import type { LogEntry } from "../../../src/runner/ports.js";

const item = (i: number, size: number): LogEntry => {
  const line = `${i}:`.padEnd(size, String.fromCharCode(97 + (i % 26)));
  return { stored: [{ line, stderr: i % 3 === 0, time: 1_764_400_000_000 + i }], stderr: i % 3 === 0, bytes: size };
};

it("reads of a cut log on the fs store equal the memory store's, whatever the appends (wraps, larger rings)", async () => {
  await fc.assert(
    fc.asyncProperty(
      fc.integer({ min: 20, max: 400 }),
      fc.array(fc.array(fc.integer({ min: 1, max: 120 }), { minLength: 1, maxLength: 40 }), {
        minLength: 1,
        maxLength: 25,
      }),
      fc.integer({ min: 0, max: 1_000 }),
      async (tailBytes, appends, readSeed) => {
        const dir = await mkdtemp(path.join(os.tmpdir(), "rd-tail-ring-"));
        const fs = createFsLogStore(dir, { fsync: false });
        const memory = createMemoryLogStore();
        const id = randomUUID();
        try {
          let at = 0;
          for (const [k, sizes] of appends.entries()) {
            const entries = sizes.map((size, j) => item(at + j, k === 3 && j === 0 ? tailBytes * 2 : size));
            // The second append's first item starts the tail.
            if (k === 1) entries[0] = { ...entries[0]!, tailBytes, capped: true };
            const now = new Date(1_764_400_000_000 + k);
            const [a, b] = [await fs.append(id, at, entries, now), await memory.append(id, at, entries, now)];
            expect(a).toEqual(b);
            at += entries.length;
            const total = a.storedLines;
            const from = (readSeed * (k + 1)) % (total + 1);
            expect(await fs.read(id, from, 7)).toEqual(await memory.read(id, from, 7));
          }
          expect(await fs.read(id)).toEqual(await memory.read(id));
          await fs.close?.();
          const again = createFsLogStore(dir, { fsync: false });
          expect(await again.read(id)).toEqual(await memory.read(id));
          await again.close?.();
          const names = (await readdir(path.join(dir, "jobs"))).filter(
            (n) => n.includes(".ring-") || n.includes(".tail-"),
          );
          expect(names.length).toBeLessThanOrEqual(1);
        } finally {
          await fs.close?.();
          await rm(dir, { recursive: true, force: true });
        }
      },
    ),
    { numRuns: 60 },
  );
});

it("sizes the ring made by the append that cuts the log for the whole append: later ones as large are not copied", async () => {
  const dir = await mkdtemp(path.join(os.tmpdir(), "rd-tail-ring-"));
  const fs = createFsLogStore(dir, { fsync: false });
  const id = randomUUID();
  const ringNames = async () => (await readdir(path.join(dir, "jobs"))).filter((n) => n.startsWith(`${id}.ring-`));
  try {
    // A 4,000-byte tail (500-byte segments); appends of 14 lines of 100 bytes (116 counted, as the service counts
    // them), 40 % of the tail. The first append cuts after 10 lines: a ring sized for its 4 tail lines only is
    // copied once the tail is full; one sized for the whole append never is.
    const batch = (at: number, cutAt = -1) =>
      Array.from({ length: 14 }, (_, j) => ({
        ...item(at + j, 100),
        bytes: 116,
        ...(j === cutAt ? { tailBytes: 4_000, capped: true } : {}),
      }));
    await fs.append(id, 0, batch(0, 10));
    expect(await ringNames()).toEqual([`${id}.ring-1`]);
    for (let k = 1; k < 8; k++) await fs.append(id, 14 * k, batch(14 * k));
    expect(await ringNames()).toEqual([`${id}.ring-1`]);
    const lines = await fs.read(id);
    expect(lines[lines.length - 1]!.line).toBe(item(14 * 8 - 1, 100).stored[0]!.line);
  } finally {
    await fs.close?.();
    await rm(dir, { recursive: true, force: true });
  }
});
