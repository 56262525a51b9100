/**
 * How many searches of one store run at once (log-search.ts): 4 run, 64 wait their turn, and more are refused
 * with UNAVAILABLE at once, so a flood of searches costs a server a bounded amount of memory; every accepted one
 * answers in full. On a real fs log store.
 * And a cut log (log-tail.ts) searched through a real runner server: each match at its own position past the drop
 * marker, on the fs store's read path (its fast path declines a cut log) and the memory store.
 */
import { randomUUID } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { expect, it } from "vitest";
import { createFsLogStore } from "../../../src/adapters/fs/index.js";
import { createMemoryLogStore, createMemoryQueue } from "../../../src/adapters/memory/index.js";
import { createRunnerClient, createRunnerService, startRunnerServer } from "../../../src/runner/index.js";
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

it("finds lines of a cut log at their own positions, in the head and in the tail, on the fs and memory stores", async () => {
  const dir = await mkdtemp(join(tmpdir(), "runner-depot-search-cut-"));
  try {
    for (const logs of [createFsLogStore(dir, { fsync: false }), createMemoryLogStore()]) {
      const runner = createRunnerService(createMemoryQueue(), { logs, limits: { jobLogBytes: 64 * 1024 } });
      const server = await startRunnerServer(runner, { host: "127.0.0.1", port: 0 });
      try {
        const id = randomUUID();
        await runner.expectJob(id, {});
        const client = createRunnerClient({ endpoint: server.url, requestId: id });
        for (let i = 1; i <= 20_000; i++) if (!client.log(`line ${i}`, false)) await client.drained();
        client.log("FATAL: the end", true);
        await client.end({ exitCode: 1, success: false });
        await client.close();
        const state = (await logs.get(id))!;
        expect(state.cut?.lines).toBeGreaterThan(0);
        // Line i (from 1) is at position i - 1 in the head and at position i past the marker.
        for (const regex of [false, true]) {
          const search = async (pattern: string) =>
            (await searchJobLog(logs, id, { pattern, regex, matchCase: true })).matches.map((m) => [
              m.position,
              m.line,
            ]);
          expect(await search("FATAL")).toEqual([[state.storedLines - 1, "FATAL: the end"]]);
          expect(await search("line 19999$".slice(0, regex ? 11 : 10))).toEqual([[19_999, "line 19999"]]);
          expect(await search("line 7$".slice(0, regex ? 7 : 6))).toContainEqual([6, "line 7"]);
        }
        const [at] = await logs.read(id, 19_999, 1);
        expect(at?.line).toBe("line 19999");
      } finally {
        await server.close();
        await runner.close();
        await logs.close?.();
      }
    }
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
