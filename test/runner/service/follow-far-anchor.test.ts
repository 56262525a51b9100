/**
 * follow() with a far-future `from`: a follower asking for line 1e12 that attaches first
 * must not anchor the job's shared ring there. Before, no line entered the ring afterwards
 * and each of the other followers read the store itself (33x the reads). Real fs log
 * store, reads counted through a wrapper; lines stored the way another replica's appear
 * (straight into the store, seen by the poll).
 */
import { randomUUID } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { describe, expect, it } from "vitest";
import { createFsLogStore } from "../../../src/adapters/fs/index.js";
import { createMemoryQueue } from "../../../src/adapters/memory/index.js";
import { createRunnerService } from "../../../src/runner/index.js";
import { countingReads } from "../../fixtures/log-reads.js";
import type { LogEntry, StoredLine } from "../../../src/runner/ports.js";

const FOLLOWERS = 100;
const LINES = 50;

async function drain(lines: AsyncIterable<StoredLine>): Promise<number> {
  let n = 0;
  for await (const _ of lines) n++;
  return n;
}

describe("follow(): a far-future from does not anchor the shared ring", () => {
  it(`a follower at from=1e12 attached first; ${FOLLOWERS} followers from 0 still share the store reads`, async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), "follow-anchor-"));
    const fsStore = createFsLogStore(dir);
    const counted = countingReads(fsStore);
    const logs = counted.store;
    let base = 0;
    const runner = createRunnerService(createMemoryQueue(), { logs, follow: { pollMs: 20 } });
    const id = randomUUID();
    try {
      await runner.expectJob(id);
      const stop = new AbortController();
      const far = drain(runner.follow(id, { from: 1e12, signal: stop.signal }));
      await new Promise((r) => setTimeout(r, 200)); // the far follower is waiting
      const followers = Array.from({ length: FOLLOWERS }, () => drain(runner.follow(id)));
      await new Promise((r) => setTimeout(r, 200)); // they wait at the live end too
      base = counted.reads();
      const entries: LogEntry[] = Array.from(
        { length: LINES },
        (_, i) => ({ stored: [{ line: `line ${i}`, stderr: false }] }) as LogEntry,
      );
      await fsStore.append(id, 0, entries);
      await runner.cancelJob(id);
      const counts = await Promise.all(followers);
      expect(counts.every((n) => n === LINES)).toBe(true);
      // Shared: a handful of fills, not one read (or more) per follower.
      expect(counted.reads() - base).toBeLessThan(FOLLOWERS / 4);
      stop.abort();
      await far;
    } finally {
      await runner.close();
      await rm(dir, { recursive: true, force: true });
    }
  }, 60_000);
});
