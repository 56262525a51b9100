/**
 * The memory store's block pool (adapters/memory/block-pool.ts): blocks of pruned and archived jobs serve new jobs'
 * lines. The pool on its own, then the store: whatever jobs come and go, a read returns exactly its job's lines, never
 * a let-go job's bytes, and a let-go job reads as empty.
 */
import { randomUUID } from "node:crypto";
import fc from "fast-check";
import { describe, expect, it, vi } from "vitest";
import { BlockPool } from "../../../src/adapters/memory/block-pool.js";
import { createMemoryLogStore } from "../../../src/adapters/memory/log-store.js";
import { sampleJobResult } from "../../../src/testing/helpers.js";
import { lines as entries } from "../../../src/testing/log-store-cases.js";
import type { JobLogStore, StoredLine } from "../../../src/runner/ports.js";

describe("BlockPool", () => {
  it("hands back a given block zeroed, and a new one when empty", () => {
    const pool = new BlockPool(16, 2);
    const block = Buffer.alloc(16, 0x61);
    pool.give([block]);
    expect(pool.size).toBe(1);
    const taken = pool.take();
    expect(taken).toBe(block);
    expect(taken.every((b) => b === 0)).toBe(true);
    expect(pool.size).toBe(0);
    const fresh = pool.take();
    expect(fresh).not.toBe(block);
    expect(fresh.length).toBe(16);
  });

  it("keeps at most its capacity and only blocks of its size", () => {
    const pool = new BlockPool(16, 2);
    const small = Buffer.alloc(8, 1);
    pool.give([small, Buffer.alloc(16, 1), Buffer.alloc(16, 2), Buffer.alloc(16, 3)]);
    expect(pool.size).toBe(2);
    expect(small.every((b) => b === 1)).toBe(true);
    expect(pool.take()).not.toBe(small);
  });

  it("keeps a block given twice once, so it never serves two jobs", () => {
    const pool = new BlockPool(16, 4);
    const block = Buffer.alloc(16);
    pool.give([block]);
    pool.give([block]);
    expect(pool.size).toBe(1);
  });
});

/** Line `i` of job `tag`: its tag and number, padded to `len` with a letter of the job. */
function line(tag: number, i: number, len: number): StoredLine {
  const head = `${tag}/${i}:`;
  return { line: head + String.fromCharCode(97 + (tag % 26)).repeat(Math.max(0, len - head.length)), stderr: false };
}

/** Appends `lines` in batches of 500 and ends the job at `endedAt`. */
async function writeJob(store: JobLogStore, id: string, lines: StoredLine[], endedAt: string): Promise<void> {
  for (let at = 0; at < lines.length; at += 500)
    await store.append(id, at, entries(lines.slice(at, at + 500).map((l) => l.line)));
  await store.finish(id, sampleJobResult({ requestId: id, endedAt }), { at: lines.length });
}

describe("memory store: pooled blocks of let-go jobs", () => {
  it("gives a pruned job's full-size blocks to the next job and keeps every job's own lines", async () => {
    // How many new full-size blocks the next job's lines take: none with the pool (the pruned job's serve), five
    // without. 6,000 lines of 1,000 bytes: ~6 MiB, five full-size blocks past the first ~1 MiB.
    const newBlocks = async (options: { pooledBlocks?: number }) => {
      const store = createMemoryLogStore(options);
      const [a, b, kept] = [randomUUID(), randomUUID(), randomUUID()];
      const big = (tag: number) => Array.from({ length: 6000 }, (_, i) => line(tag, i, 1000));
      await writeJob(store, a, big(0), "2020-01-01T00:00:00.000Z");
      await writeJob(store, kept, big(2).slice(0, 10), "2030-01-01T00:00:00.000Z");
      expect(await store.prune!(new Date("2021-01-01T00:00:00.000Z"))).toBe(1);
      const alloc = vi.spyOn(Buffer, "allocUnsafe");
      try {
        await writeJob(store, b, big(1), "2030-01-01T00:00:00.000Z");
        return alloc.mock.calls.filter(([size]) => size === 1024 * 1024).length;
      } finally {
        alloc.mockRestore();
        expect(await store.read(a)).toEqual([]);
        expect(await store.read(b)).toEqual(big(1));
        expect(await store.read(kept)).toEqual(big(2).slice(0, 10));
        await store.close?.();
      }
    };
    expect(await newBlocks({})).toBe(0); // the default pool
    expect(await newBlocks({ pooledBlocks: 0 })).toBe(5);
  });

  it("takes pooledBlocks as an integer ≥ 0 and refuses anything else", () => {
    expect(() => createMemoryLogStore({ pooledBlocks: -1 })).toThrow(RangeError);
    expect(() => createMemoryLogStore({ pooledBlocks: 1.5 })).toThrow(/not 1\.5/);
    expect(() => createMemoryLogStore({ pooledBlocks: 0 })).not.toThrow();
  });

  it("reads each job's own lines exactly while pruned and archived jobs' blocks are reused", async () => {
    await fc.assert(
      fc.asyncProperty(
        // Each job: lines, their length, and how it is let go. A job's full-size blocks start past ~1 MiB of text
        // (4 KiB doubling to 512 KiB first), so only the larger jobs give blocks to the pool or take from it; the
        // case above makes sure that happens.
        fc.array(
          fc.record({
            lines: fc.integer({ min: 1, max: 1500 }),
            len: fc.integer({ min: 1, max: 2000 }),
            end: fc.constantFrom("prune", "archive", "keep"),
          }),
          { minLength: 2, maxLength: 6 },
        ),
        async (jobs) => {
          const store = createMemoryLogStore();
          const held: { id: string; lines: StoredLine[] }[] = [];
          for (const [tag, job] of jobs.entries()) {
            const id = randomUUID();
            const lines = Array.from({ length: job.lines }, (_, i) => line(tag, i, job.len));
            // Only a job to prune ends before the prune's time, so each prune lets go only the job just written.
            await writeJob(
              store,
              id,
              lines,
              job.end === "prune" ? "2020-01-01T00:00:00.000Z" : "2030-01-01T00:00:00.000Z",
            );
            expect(await store.read(id)).toEqual(lines);
            if (job.end === "keep") {
              held.push({ id, lines });
              continue;
            }
            if (job.end === "archive") {
              await store.markArchived!(id, {
                lines: lines.length,
                bytes: 1,
                chunks: 1,
                rawBytes: 1,
                at: "2020-01-02T00:00:00.000Z",
              });
            } else {
              expect(await store.prune!(new Date("2021-01-01T00:00:00.000Z"))).toBe(1);
            }
            expect(await store.read(id)).toEqual([]);
          }
          for (const h of held) expect(await store.read(h.id)).toEqual(h.lines);
        },
      ),
      { numRuns: 15 },
    );
  }, 60_000);
});
