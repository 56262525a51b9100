/**
 * What a crash can leave of a cut log's tail on the fs store (docs/decisions/log-tail.md, "Crashes"), reproduced
 * by writing it beside the store's files: torn records in every free byte of the tail's ring (an append whose state
 * never landed may have written any of them), a ring of the next generation whose state never landed, an old
 * generation's ring and a format-1 segment file whose removal the crash cut off. A store opened on the directory
 * reads what the last acknowledged append promised, nothing else, removes the leftovers and goes on appending.
 * And a store written with a file a segment (format 1) still reads, and moves the tail into a ring on its next
 * append.
 */
import { randomUUID } from "node:crypto";
import { appendFile, mkdtemp, open, readdir, readFile, rm, stat, unlink, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterEach, beforeEach, expect, it } from "vitest";
import { createFsLogStore } from "../../../src/adapters/fs/log-store.js";
import type { TailRecord, TailRing } from "../../../src/adapters/fs/log-tail-file.js";
import type { LogEntry } from "../../../src/runner/ports.js";

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), "rd-tail-crash-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

const entry = (line: string, tailBytes?: number): LogEntry => ({
  stored: [{ line, stderr: false, time: 1_764_400_000_000 }],
  stderr: false,
  bytes: 10,
  ...(tailBytes ? { tailBytes, capped: true } : {}),
});

/** A 2-line head, then a tail of 40 bytes (segments of 5: one item each): 20 tail items, the last 4 kept. */
async function cutJob(id: string) {
  const store = createFsLogStore(dir);
  const items = [entry("h0"), entry("h1"), entry("t0", 40)];
  for (let i = 1; i < 20; i++) items.push(entry(`t${i}`));
  for (let at = 0; at < items.length; at += 3) await store.append(id, at, items.slice(at, at + 3));
  const acked = (await store.get(id))!;
  const lines = await store.read(id);
  expect(lines.map((l) => l.line.slice(0, 3))).toEqual(["h0", "h1", "[ru", "t16", "t17", "t18", "t19"]);
  await store.close?.();
  return { acked, lines };
}

const jobsDir = () => path.join(dir, "jobs");
const tailNames = async (id: string) => (await readdir(jobsDir())).filter((n) => n.startsWith(`${id}.`)).sort();
const stateOf = async (id: string) =>
  JSON.parse(await readFile(path.join(jobsDir(), `${id}.json`), "utf8")) as TailRecord & Record<string, unknown>;

/** The ring's bytes no segment of `ring` holds (from the newest segment's end round to the oldest's start). */
function freeSpans(ring: TailRing): { at: number; length: number }[] {
  const used = ring.segments.reduce((sum, s) => sum + s.bytes, 0);
  const end = (ring.segments[0]!.at + used) % ring.size;
  const free = ring.size - used;
  const first = Math.min(free, ring.size - end);
  return first === free
    ? [{ at: end, length: free }]
    : [
        { at: end, length: first },
        { at: 0, length: free - first },
      ];
}

it("a crash in a tail append loses only what no ack promised: torn bytes ignored, unnamed tail files removed", async () => {
  const id = randomUUID();
  const { acked, lines } = await cutJob(id);
  const state = await stateOf(id);
  const ring = state.tailRing!;
  expect(ring.format).toBe(2);
  expect(ring.segments.map((s) => s.first)).toEqual(acked.cut!.segments.map((s) => s.first));
  const ringName = `${id}.ring-${ring.gen}`;
  expect((await tailNames(id)).filter((n) => n !== `${id}.json` && n !== `${id}.log`)).toEqual([ringName]);

  // The crash: an append wrote torn records over every free byte of the ring (the newest segment's end, the dropped
  // segments' bytes) and never renamed its state in; a copy into the next generation never landed; an old
  // generation's ring and a format-1 segment file were never removed.
  const fh = await open(path.join(jobsDir(), ringName), "r+");
  try {
    for (const span of freeSpans(ring)) {
      const torn = Buffer.from('p0"torn record"\n'.repeat(Math.ceil(span.length / 16) + 1).slice(0, span.length - 1));
      await fh.write(Buffer.concat([torn, Buffer.from("p")]), 0, span.length, span.at);
    }
  } finally {
    await fh.close();
  }
  await writeFile(path.join(jobsDir(), `${id}.ring-${ring.gen + 1}`), 'p0"t16"\np0"t17"\np0"t20"\n');
  await writeFile(path.join(jobsDir(), `${id}.ring-${ring.gen - 1 || 9}`), 'p0"t0"\n');
  await writeFile(path.join(jobsDir(), `${id}.tail-${acked.cut!.at + 1}`), 'p0"t0"\n');

  const reopened = createFsLogStore(dir);
  try {
    expect(await reopened.get(id)).toEqual(acked);
    expect(await reopened.read(id)).toEqual(lines);
    expect(await reopened.read(id, acked.storedLines - 2)).toEqual(lines.slice(-2));
    expect((await tailNames(id)).filter((n) => n !== `${id}.json` && n !== `${id}.log`)).toEqual([ringName]);
    // The resend of the lost item goes on as if the crash had not been.
    const next = await reopened.append(id, 22, [entry("t20")]);
    expect(next.committed).toBe(23);
    const after = ["h0", "h1", "[ru", "t17", "t18", "t19", "t20"];
    expect((await reopened.read(id)).map((l) => l.line.slice(0, 3))).toEqual(after);
    const named = (await stateOf(id)).tailRing!;
    expect((await stat(path.join(jobsDir(), `${id}.ring-${named.gen}`))).size).toBeGreaterThan(0);
    await reopened.close?.();
    // What the append wrote is read back by a store opened afresh (no index kept from the writer).
    const third = createFsLogStore(dir);
    expect((await third.read(id)).map((l) => l.line.slice(0, 3))).toEqual(after);
    await third.close?.();
  } finally {
    await reopened.close?.();
  }
});

it("a tail kept as a file a segment (format 1) still reads, leftovers go, and its next append moves it to a ring", async () => {
  const id = randomUUID();
  const { acked, lines } = await cutJob(id);
  // Rewrite the job as a store before the ring wrote it: a file a segment, listed with its valid bytes.
  const state = await stateOf(id);
  const ring = state.tailRing!;
  const bytes = await readFile(path.join(jobsDir(), `${id}.ring-${ring.gen}`));
  const files: { first: number; bytes: number }[] = [];
  for (const s of ring.segments) {
    const own = Buffer.alloc(s.bytes);
    for (let i = 0; i < s.bytes; i++) own[i] = bytes[(s.at + i) % ring.size]!;
    await writeFile(path.join(jobsDir(), `${id}.tail-${s.first}`), own);
    files.push({ first: s.first, bytes: s.bytes });
  }
  await unlink(path.join(jobsDir(), `${id}.ring-${ring.gen}`));
  delete state.tailRing;
  await writeFile(path.join(jobsDir(), `${id}.json`), JSON.stringify({ ...state, tailFiles: files }));
  // A format-1 crash: torn bytes past a listed segment's valid ones, an unlisted segment file.
  await appendFile(path.join(jobsDir(), `${id}.tail-${files.at(-1)!.first}`), 'p0"torn rec');
  await writeFile(path.join(jobsDir(), `${id}.tail-${acked.cut!.at + 1}`), 'p0"t0"\n');

  const reopened = createFsLogStore(dir);
  try {
    expect(await reopened.get(id)).toEqual(acked);
    expect(await reopened.read(id)).toEqual(lines);
    expect((await tailNames(id)).filter((n) => n.includes(".tail-"))).toEqual(
      files.map((f) => `${id}.tail-${f.first}`).sort(),
    );
    await reopened.append(id, 22, [entry("t20"), entry("t21")]);
    expect((await reopened.read(id)).map((l) => l.line.slice(0, 3))).toEqual([
      "h0",
      "h1",
      "[ru",
      "t18",
      "t19",
      "t20",
      "t21",
    ]);
    const moved = await stateOf(id);
    expect(moved.tailFiles).toBeUndefined();
    expect((await tailNames(id)).filter((n) => n !== `${id}.json` && n !== `${id}.log`)).toEqual([
      `${id}.ring-${moved.tailRing!.gen}`,
    ]);
  } finally {
    await reopened.close?.();
  }
});
