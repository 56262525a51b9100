/**
 * The memory store reuses a dropped tail segment's blocks for the next segment (adapters/memory/log-store.ts,
 * `recycled`), and full-size blocks of dropped segments and let-go jobs for any job (block-pool.ts): whatever the
 * appends' sizes and the lines' lengths, a read returns exactly the kept lines, never bytes a dropped segment or
 * another job left in a reused block.
 */
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { createMemoryLogStore } from "../../../src/adapters/memory/log-store.js";
import type { JobLogStore, LogEntry } from "../../../src/runner/ports.js";
import { sampleJobResult } from "../../../src/testing/helpers.js";
import { lines } from "../../../src/testing/log-store-cases.js";
import { ReceivedLine } from "../../../src/runner/protocol/received-line.js";

const JOB = "3b7e8a52-8f0e-4a52-9d7a-2a8c0f3d1e11";
/** A second job of the same store, writing into blocks from the same pool. */
const OTHER = "5c1d2e3f-4a5b-4c6d-8e7f-8091a2b3c4d5";

/** Line i's text: its number, then `len` letters that differ from line to line. */
function text(i: number, len: number): string {
  return `${i}:` + String.fromCharCode(97 + (i % 26)).repeat(len);
}

/** Line i as the fast path hands it: a received line, a view of a chunk holding other bytes around it. */
function received(i: number, len: number): ReceivedLine {
  const body = Buffer.from(text(i, len), "utf8");
  const chunk = Buffer.concat([Buffer.from("~~~~"), body, Buffer.from("####")]);
  const line = new ReceivedLine("job", chunk, 4, 4 + body.length, i % 3 === 0, 1_764_400_000_000 + i, -1, true);
  line.bytes = 16 + body.length;
  return line;
}

/**
 * Appends batches of `sizes` lines (line i `len(i)` letters long) to a new job of a fresh store, the sixth line
 * starting a tail of `tailBytes`, and checks after each append that a read returns exactly the head, one marker and
 * the kept tail. `neighbour` runs after each append; `store` is the store to use. Returns the job's committed items.
 */
async function appendAndCheck(
  sizes: number[],
  len: (i: number) => number,
  tailBytes: number,
  {
    neighbour,
    store = createMemoryLogStore(),
  }: { neighbour?: (store: JobLogStore) => Promise<void>; store?: JobLogStore } = {},
): Promise<number> {
  const id = JOB;
  // Five head lines, then every line goes to the tail (the first one starts it).
  const entries: LogEntry[] = Array.from({ length: 5 }, (_, i) => received(i, len(i)));
  let at = 0;
  const all: LogEntry[] = [...entries];
  for (const size of sizes) {
    const batch: LogEntry[] = [];
    for (let k = 0; k < size; k++) {
      const i = all.length;
      const line = received(i, len(i));
      if (i === 5) {
        batch.push({
          stored: [{ line: line.line, stderr: line.stderr, time: line.time }],
          stderr: line.stderr,
          bytes: line.bytes,
          tailBytes,
          capped: true,
        });
      } else batch.push(line);
      all.push(line);
    }
    if (at === 0) batch.unshift(...entries);
    const state = await store.append(id, at, batch);
    at = state.committed;
    await neighbour?.(store);
    const read = await store.read(id);
    const cut = state.cut;
    if (!cut) {
      expect(read.map((l) => l.line)).toEqual(all.map((_, i) => text(i, len(i))));
      continue;
    }
    // Positions: 0…4 the head, 5 the marker, then the kept tail ends with the last line sent.
    const kept = read.length - 6;
    expect(read.slice(0, 5).map((l) => l.line)).toEqual([0, 1, 2, 3, 4].map((i) => text(i, len(i))));
    expect(read[5]).toMatchObject({ marker: true, skipped: cut.lines });
    const first = all.length - kept;
    expect(first).toBe(5 + cut.lines);
    expect(read.slice(6).map((l) => l.line)).toEqual(
      Array.from({ length: kept }, (_, k) => text(first + k, len(first + k))),
    );
    expect(read.slice(6).map((l) => l.stderr)).toEqual(Array.from({ length: kept }, (_, k) => (first + k) % 3 === 0));
  }
  return at;
}

describe("memory store: recycled tail segments", () => {
  it("a read under way on a pruned cut job finds no tail line, never another job's bytes", async () => {
    const store = createMemoryLogStore();
    // An 8 MiB tail of 1 MiB segments, each in one full-size block: what the pool takes when the job is let go.
    const at = await appendAndCheck(
      Array.from({ length: 10 }, () => 1000),
      () => 1000,
      8 * 1024 * 1024,
      { store },
    );
    await store.finish(JOB, sampleJobResult({ requestId: JOB, endedAt: "2020-01-01T00:00:00.000Z" }), { at });
    // The read takes the head now and the tail after an await; the prune and the other job's append run in between.
    const reading = store.read(JOB, 0, 20);
    const pruned = store.prune!(new Date("2021-01-01T00:00:00.000Z"));
    const texts = Array.from({ length: 3000 }, (_, k) => `other ${k}:` + "z".repeat(1000));
    const appended = store.append(OTHER, 0, lines(texts));
    expect(await pruned).toBe(1);
    await appended;
    const read = await reading;
    expect(read.slice(0, 5).map((l) => l.line)).toEqual([0, 1, 2, 3, 4].map((i) => text(i, 1000)));
    expect(read[5]).toMatchObject({ marker: true });
    expect(read).toHaveLength(6);
    expect((await store.read(OTHER)).map((l) => l.line)).toEqual(texts);
  });

  it("reads back exactly the head, one marker and the kept tail after appends of any size", async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.array(fc.integer({ min: 1, max: 60 }), { minLength: 1, maxLength: 25 }),
        fc.array(fc.integer({ min: 0, max: 120 }), { minLength: 1, maxLength: 40 }),
        fc.integer({ min: 200, max: 3000 }),
        async (sizes, lengths, tailBytes) => {
          await appendAndCheck(sizes, (i) => lengths[i % lengths.length]!, tailBytes);
        },
      ),
      { numRuns: 150 },
    );
  });

  it("keeps the tail exact when its segments' blocks are full-size ones, the size the store pools", async () => {
    // An 8 MiB tail: segments of 1 MiB, each in one full-size block; ~24 MiB of lines drop and recycle segments.
    // Beside it a second job writes 1 MiB a step into blocks from the same pool (adapters/memory/block-pool.ts), and
    // is pruned every fourth step so blocks go round; each job must read back only its own lines.
    let step = 0;
    let written: string[] = [];
    const neighbour = async (store: JobLogStore) => {
      if (step++ % 4 === 3) {
        await store.finish(OTHER, sampleJobResult({ requestId: OTHER, endedAt: "2020-01-01T00:00:00.000Z" }), {
          at: written.length,
        });
        expect(await store.prune!(new Date("2021-01-01T00:00:00.000Z"))).toBe(1);
        written = [];
        return;
      }
      const texts = Array.from({ length: 1000 }, (_, k) => `${step}/${k}:` + "z".repeat(1000));
      await store.append(OTHER, written.length, lines(texts));
      written.push(...texts);
      expect((await store.read(OTHER)).map((l) => l.line)).toEqual(written);
    };
    await appendAndCheck(
      Array.from({ length: 24 }, () => 1000),
      (i) => 900 + (i % 200),
      8 * 1024 * 1024,
      { neighbour },
    );
  }, 60_000);
});
