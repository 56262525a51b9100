/**
 * What a crash can leave of a cut log's tail on the fs store (docs/decisions/log-tail.md, "Crashes"), reproduced
 * by writing it beside the store's files: the torn end of an append whose state never landed, a segment file made
 * by such an append, and a dropped segment's file whose removal the crash cut off. A store opened on the directory
 * reads what the last acknowledged append promised, nothing else, removes the leftovers and goes on appending.
 */
import { randomUUID } from "node:crypto";
import { appendFile, mkdtemp, readdir, rm, stat, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterEach, beforeEach, expect, it } from "vitest";
import { createFsLogStore } from "../../../src/adapters/fs/log-store.js";
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

it("a crash in a tail append loses only what no ack promised: torn bytes cut, unlisted segments removed", async () => {
  const store = createFsLogStore(dir);
  const id = randomUUID();
  // A 2-line head, then a tail of 40 bytes (segments of 5: one item each): 20 tail items, the last 4 kept.
  const items = [entry("h0"), entry("h1"), entry("t0", 40)];
  for (let i = 1; i < 20; i++) items.push(entry(`t${i}`));
  for (let at = 0; at < items.length; at += 3) await store.append(id, at, items.slice(at, at + 3));
  const acked = (await store.get(id))!;
  const lines = await store.read(id);
  expect(lines.map((l) => l.line.slice(0, 3))).toEqual(["h0", "h1", "[ru", "t16", "t17", "t18", "t19"]);
  await store.close?.();

  const jobs = path.join(dir, "jobs");
  const segments = (await readdir(jobs)).filter((n) => n.startsWith(`${id}.tail-`)).sort();
  expect(segments).toHaveLength(4);
  const last = acked.cut!.segments.at(-1)!;
  // The crash: an append wrote half a record to the newest segment and a new segment file, and never renamed its
  // state in; an earlier append's dropped segment was never removed.
  await appendFile(path.join(jobs, `${id}.tail-${last.first}`), 'p0"torn rec');
  await writeFile(path.join(jobs, `${id}.tail-${last.first + 1}`), 'p0"t20"\n');
  await writeFile(path.join(jobs, `${id}.tail-${acked.cut!.at + 1}`), 'p0"t0"\n');

  const reopened = createFsLogStore(dir);
  try {
    expect(await reopened.get(id)).toEqual(acked);
    expect(await reopened.read(id)).toEqual(lines);
    const after = (await readdir(jobs)).filter((n) => n.startsWith(`${id}.tail-`)).sort();
    expect(after).toEqual(segments);
    // The resend of the lost item goes on as if the crash had not been.
    const next = await reopened.append(id, 22, [entry("t20")]);
    expect(next.committed).toBe(23);
    expect((await reopened.read(id)).map((l) => l.line.slice(0, 3))).toEqual([
      "h0",
      "h1",
      "[ru",
      "t17",
      "t18",
      "t19",
      "t20",
    ]);
    const listed = next.cut!.segments.at(-1)!;
    expect((await stat(path.join(jobs, `${id}.tail-${listed.first}`))).size).toBeGreaterThan(0);
  } finally {
    await reopened.close?.();
  }
});
