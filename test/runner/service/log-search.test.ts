/**
 * How many searches of one store run at once (log-search.ts): 4 run, 64 wait their turn, and more are refused
 * with UNAVAILABLE at once, so a flood of searches costs a server a bounded amount of memory; every accepted one
 * answers in full. On a real fs log store.
 */
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { expect, it } from "vitest";
import { createFsLogStore } from "../../../src/adapters/fs/index.js";
import { RunnerDepotError } from "../../../src/errors.js";
import { searchJobLog } from "../../../src/runner/service/log-search.js";

it("runs 4 searches of a store at once, queues 64, refuses the rest with UNAVAILABLE", async () => {
  const dir = await mkdtemp(join(tmpdir(), "runner-depot-search-gate-"));
  const logs = createFsLogStore(dir, { fsync: false });
  try {
    const id = "00000000-0000-4000-8000-00000000ca7e";
    await logs.open(id);
    const lines = Array.from({ length: 5000 }, (_, i) => (i % 1000 === 7 ? `hit ${i}` : `line ${i}`));
    await logs.append(
      id,
      0,
      lines.map((line) => ({ stored: [{ line, stderr: false }], stderr: false, bytes: line.length })),
    );
    const outcomes = await Promise.allSettled(
      Array.from({ length: 70 }, () => searchJobLog(logs, id, { pattern: "hit", matchCase: true })),
    );
    const refused = outcomes.filter((o) => o.status === "rejected");
    expect(refused).toHaveLength(2);
    for (const o of refused) expect(((o as PromiseRejectedResult).reason as RunnerDepotError).code).toBe("UNAVAILABLE");
    for (const o of outcomes)
      if (o.status === "fulfilled") expect(o.value.matches.map((m) => m.position)).toEqual([7, 1007, 2007, 3007, 4007]);
    // The slots all came back: a search now runs at once.
    expect((await searchJobLog(logs, id, { pattern: "hit 4007", matchCase: true })).matches).toHaveLength(1);
  } finally {
    await logs.close?.();
    await rm(dir, { recursive: true, force: true });
  }
});
