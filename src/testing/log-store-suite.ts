/** The conformance suite of the JobLogStore port. */
import { randomUUID } from "node:crypto";
import { describe, expect, it } from "vitest";
import { skipped, trackAdapters, healAfterEach } from "./register.js";
import { RunnerDepotError } from "../errors.js";
import type { JobLogStore, JobState, LogEntry } from "../runner/ports.js";
import { logEntry, sampleJobResult } from "./helpers.js";
import type { BackendOutage } from "./queue-suite.js";
import { lines, type LogStoreCases } from "./log-store-cases.js";
import { describeCutLogCases } from "./log-store-cut-cases.js";
import { describeSectionCases } from "./log-store-section-cases.js";
import { describeReadBoundCases } from "./log-store-read-bound-cases.js";

/** Options of {@link describeJobLogStore}. */
export interface JobLogStoreSuiteOptions<S extends JobLogStore = JobLogStore> {
  /**
   * A second store on the same backing as `store` (another process, a restart, another
   * replica). Enables the persistence and shared-store cases.
   */
  reopen?: (store: S) => JobLogStore | Promise<JobLogStore>;
  /** Backend failure cases, when the backend can be broken from the test. */
  outage?: Omit<BackendOutage<S>, "impatient">;
  /** Lines in the bulk case; default 20 000. */
  manyLines?: number;
}

async function failure(promise: Promise<unknown>): Promise<RunnerDepotError> {
  const error = await promise.then(
    () => null,
    (e: unknown) => e,
  );
  expect(error, "expected a rejection").toBeInstanceOf(RunnerDepotError);
  return error as RunnerDepotError;
}

/**
 * Registers the JobLogStore conformance suite (vitest) for an adapter.
 *
 * @example
 * describeJobLogStore("fs", () => createFsLogStore(dir), {
 *   reopen: () => createFsLogStore(dir),
 * });
 */
export function describeJobLogStore<S extends JobLogStore>(
  name: string,
  factory: () => S | Promise<S>,
  options: JobLogStoreSuiteOptions<S> = {},
): void {
  describe(`JobLogStore conformance: ${name}`, () => {
    const { fresh, again } = trackAdapters<JobLogStore, S>(factory, options.reopen);
    const withReopen = options.reopen ? it : skipped;
    const context: LogStoreCases<S> = { fresh, again, withReopen, canReopen: options.reopen !== undefined };

    it("open creates an open, empty job; get of an unknown job is null", async () => {
      const store = await fresh();
      const id = randomUUID();
      expect(await store.get(id)).toBeNull();
      const now = new Date("2026-01-02T03:04:05.678Z");
      const state = await store.open(id, { now });
      expect(state).toMatchObject({
        requestId: id,
        status: "open",
        committed: 0,
        storedLines: 0,
        storedBytes: 0,
        lines: { stdout: 0, stderr: 0 },
        logTruncated: false,
        expected: false,
        startedAt: null,
        lastSeenAt: now.toISOString(),
        result: null,
      });
      expect(await store.get(id)).toEqual(state);
      expect(await store.open(id)).toEqual(state);
    });

    it("open with expect marks the job and merges info", async () => {
      const store = await fresh();
      const id = randomUUID();
      await store.open(id, { expect: true, info: { repoUrl: "https://r.example/x.git" } });
      const state = await store.open(id, { expect: true, info: { commitSha: "abc" } });
      expect(state.expected).toBe(true);
      expect(state.info).toEqual({ repoUrl: "https://r.example/x.git", commitSha: "abc" });
      expect((await store.get(id))?.info).toEqual(state.info);
    });

    it("append stores lines in order and counts items, lines and bytes", async () => {
      const store = await fresh();
      const id = randomUUID();
      await store.open(id);
      const t = new Date("2026-03-01T00:00:00.000Z");
      const state = await store.append(id, 0, [...lines(["one", "twø"]), ...lines(["err"], true)], t);
      expect(state).toMatchObject({
        committed: 3,
        storedLines: 3,
        storedBytes: 3 + 4 + 3,
        lines: { stdout: 2, stderr: 1 },
        startedAt: t.toISOString(),
        lastSeenAt: t.toISOString(),
      });
      expect(await store.read(id)).toEqual([
        { line: "one", stderr: false },
        { line: "twø", stderr: false },
        { line: "err", stderr: true },
      ]);
      expect(await store.get(id)).toEqual(state);
    });

    it("lines round-trip byte for byte: unicode, ANSI escapes, carriage returns, NUL, empty", async () => {
      const store = await fresh();
      const id = randomUUID();
      const texts = [
        "héllo ✓ 🚀",
        "\u001b[31mred\u001b[0m",
        "progress 10%\rprogress 100%",
        "a\u0000b",
        "",
        "\ufffd",
        "  trailing  ",
      ];
      await store.append(id, 0, lines(texts));
      expect((await store.read(id)).map((l) => l.line)).toEqual(texts);
    });

    it("keeps each line's time to the microsecond and the server-time mark; a line without a time reads without one", async () => {
      const store = await fresh();
      const id = randomUUID();
      // Times around now, one before the job's start (an agent's clock behind) and one a day later.
      const now = Math.floor(Date.now()) + 0.123;
      const stored = [
        { line: "agent", stderr: false, time: now },
        { line: "behind", stderr: true, time: now - 5_000.001 },
        { line: "received", stderr: false, time: now + 86_400_000.999, serverTime: true },
        { line: "marker", stderr: false, marker: true, time: now + 1, serverTime: true },
        { line: "untimed", stderr: false },
      ];
      await store.append(id, 0, [
        { stored: stored.slice(0, 2), stderr: false, bytes: 11 },
        { stored: stored.slice(2, 4), stderr: false, bytes: 8 },
        { stored: stored.slice(4), stderr: false, bytes: 7 },
      ]);
      expect(await store.read(id)).toEqual(stored);
      expect(await store.read(id, 2, 2)).toEqual(stored.slice(2, 4));
    });

    it("an append past `committed` (a gap) is refused with FAILED_PRECONDITION and stores nothing", async () => {
      const store = await fresh();
      const id = randomUUID();
      await store.append(id, 0, lines(["a", "b"]));
      const before = await store.get(id);
      const error = await failure(store.append(id, 3, lines(["d"])));
      expect(error.code).toBe("FAILED_PRECONDITION");
      expect(await store.get(id)).toEqual(before);
      expect(await store.read(id)).toHaveLength(2);
    });

    it("an overlapping append skips what is stored (not compared) and appends the rest", async () => {
      const store = await fresh();
      const id = randomUUID();
      await store.append(id, 0, lines(["a", "b", "c"]));
      const state = await store.append(id, 1, lines(["B?", "C?", "d", "e"]));
      expect(state.committed).toBe(5);
      expect((await store.read(id)).map((l) => l.line)).toEqual(["a", "b", "c", "d", "e"]);
      const again = await store.append(id, 0, lines(["x", "y"]));
      expect(again.committed).toBe(5);
      expect(again.storedLines).toBe(5);
      expect((await store.read(id)).map((l) => l.line)).toEqual(["a", "b", "c", "d", "e"]);
    });

    it("an item may store several lines (line + marker) or none (capped): offsets count items", async () => {
      const store = await fresh();
      const id = randomUUID();
      const cut: LogEntry = {
        stored: [
          { line: "x".repeat(10), stderr: false },
          { line: "[line truncated]", stderr: false, marker: true },
        ],
        stderr: false,
        bytes: 10,
      };
      const cap: LogEntry = {
        stored: [{ line: "[log capped]", stderr: true, marker: true }],
        stderr: true,
        bytes: 0,
        capped: true,
      };
      const dropped: LogEntry = { stored: [], stderr: false, bytes: 0 };
      const state = await store.append(id, 0, [logEntry("a"), cut, cap, dropped, dropped]);
      expect(state).toMatchObject({
        committed: 5,
        storedLines: 4,
        storedBytes: 11,
        lines: { stdout: 4, stderr: 1 },
        logTruncated: true,
      });
      const stored = await store.read(id);
      expect(stored.map((l) => l.line)).toEqual(["a", "x".repeat(10), "[line truncated]", "[log capped]"]);
      expect(stored[2]!.marker).toBe(true);
      expect(stored[3]).toMatchObject({ marker: true, stderr: true });
      expect(stored[0]!.marker ?? false).toBe(false);
      // The next item goes at offset 5, whatever the line count.
      expect((await store.append(id, 5, lines(["b"]))).committed).toBe(6);
      expect(await store.read(id, 4)).toEqual([{ line: "b", stderr: false }]);
    });

    describeCutLogCases(context);
    describeReadBoundCases(context);

    it("read honours from and limit", async () => {
      const store = await fresh();
      const id = randomUUID();
      const texts = Array.from({ length: 50 }, (_, i) => `line ${i}`);
      await store.append(id, 0, lines(texts));
      expect((await store.read(id, 10, 5)).map((l) => l.line)).toEqual(texts.slice(10, 15));
      expect((await store.read(id, 48)).map((l) => l.line)).toEqual(texts.slice(48));
      expect(await store.read(id, 50)).toEqual([]);
      expect(await store.read(id, 0, 0)).toEqual([]);
      expect(await store.read(randomUUID())).toEqual([]);
    });

    it("finish with `at` counts the end item; the first finish wins, later ones change nothing", async () => {
      const store = await fresh();
      const id = randomUUID();
      await store.append(id, 0, lines(["a", "b"]));
      const result = sampleJobResult({ requestId: id, lines: { stdout: 2, stderr: 0 } });
      const first = await store.finish(id, result, { at: 2 });
      expect(first.first).toBe(true);
      expect(first.state).toMatchObject({ status: "finished", committed: 3, result });
      const other = sampleJobResult({ requestId: id, outcome: "cancelled", exitCode: -1, success: false });
      const second = await store.finish(id, other);
      expect(second.first).toBe(false);
      expect(second.state.status).toBe("finished");
      expect(second.state.result).toEqual(result);
      expect(second.state.committed).toBe(3);
      expect((await store.get(id))?.result).toEqual(result);
    });

    it("finish with `at` other than `committed` is refused with FAILED_PRECONDITION", async () => {
      const store = await fresh();
      const id = randomUUID();
      await store.append(id, 0, lines(["a"]));
      const error = await failure(store.finish(id, sampleJobResult({ requestId: id }), { at: 3 }));
      expect(error.code).toBe("FAILED_PRECONDITION");
      expect(await store.get(id)).toMatchObject({ status: "open", committed: 1, result: null });
    });

    it("cancelled and lost finishes set the status; a finish without `at` does not count an item", async () => {
      const store = await fresh();
      const a = randomUUID();
      const b = randomUUID();
      await store.append(a, 0, lines(["a"]));
      await store.open(b, { expect: true });
      const cancelled = await store.finish(
        a,
        sampleJobResult({ requestId: a, outcome: "cancelled", exitCode: -1, success: false }),
      );
      const lost = await store.finish(
        b,
        sampleJobResult({ requestId: b, outcome: "lost", exitCode: -1, success: false, startedAt: null }),
      );
      expect(cancelled.state).toMatchObject({ status: "cancelled", committed: 1 });
      expect(lost.state).toMatchObject({ status: "lost", committed: 0 });
    });

    it("concurrent finishes: exactly one is first and every caller sees its result", async () => {
      const store = await fresh();
      const stores: JobLogStore[] = [store];
      if (options.reopen) stores.push(await again(store));
      const id = randomUUID();
      await store.append(id, 0, lines(["a"]));
      const results = Array.from({ length: 12 }, (_, i) => sampleJobResult({ requestId: id, exitCode: i }));
      const outs = await Promise.all(
        results.map((r, i) => stores[i % stores.length]!.finish(id, r, { at: 1 }).catch((e) => e)),
      );
      // A loser may see `first: false` or a FAILED_PRECONDITION (its `at` is stale now).
      const won = outs.filter((o) => !(o instanceof Error) && o.first);
      expect(won).toHaveLength(1);
      for (const o of outs) {
        if (o instanceof Error) expect((o as RunnerDepotError).code).toBe("FAILED_PRECONDITION");
        else expect(o.state.result).toEqual(won[0].state.result);
      }
      expect((await store.get(id))?.committed).toBe(2);
    });

    it("an ended job refuses appends with FAILED_PRECONDITION and stores nothing", async () => {
      const store = await fresh();
      const id = randomUUID();
      await store.append(id, 0, lines(["a"]));
      await store.finish(id, sampleJobResult({ requestId: id }), { at: 1 });
      const before = await store.get(id);
      expect((await failure(store.append(id, 2, lines(["late"])))).code).toBe("FAILED_PRECONDITION");
      const cancelled = randomUUID();
      await store.open(cancelled);
      await store.finish(
        cancelled,
        sampleJobResult({ requestId: cancelled, outcome: "cancelled", exitCode: -1, success: false }),
      );
      expect((await failure(store.append(cancelled, 0, lines(["x"])))).code).toBe("FAILED_PRECONDITION");
      expect(await store.get(id)).toEqual(before);
      expect(await store.read(id)).toHaveLength(1);
      expect(await store.read(cancelled)).toHaveLength(0);
    });

    it("stale lists open jobs last seen before the time, and no ended ones", async () => {
      const store = await fresh();
      const old = randomUUID();
      const fresher = randomUUID();
      const ended = randomUUID();
      const t0 = new Date("2020-01-01T00:00:00.000Z");
      await store.open(old, { now: t0 });
      await store.append(fresher, 0, lines(["a"]), new Date("2020-01-01T02:00:00.000Z"));
      await store.open(ended, { now: t0 });
      await store.finish(
        ended,
        sampleJobResult({ requestId: ended, outcome: "cancelled", exitCode: -1, success: false }),
      );
      const stale = (await store.stale(new Date("2020-01-01T01:00:00.000Z"))).map((s: JobState) => s.requestId);
      expect(stale).toContain(old);
      expect(stale).not.toContain(fresher);
      expect(stale).not.toContain(ended);
      // An append moves lastSeenAt forward.
      await store.append(old, 0, lines(["alive"]), new Date("2020-01-01T03:00:00.000Z"));
      expect((await store.stale(new Date("2020-01-01T01:00:00.000Z"))).map((s) => s.requestId)).not.toContain(old);
    });

    it("prune forgets ended jobs older than the time and keeps open and newer ones", async () => {
      const store = await fresh();
      if (!store.prune) return;
      const gone = randomUUID();
      const kept = randomUUID();
      const openJob = randomUUID();
      await store.append(gone, 0, lines(["a"]));
      await store.finish(gone, sampleJobResult({ requestId: gone, endedAt: "2020-01-01T00:00:00.000Z" }), { at: 1 });
      await store.finish(kept, sampleJobResult({ requestId: kept, endedAt: "2020-06-01T00:00:00.000Z" }));
      await store.open(openJob, { now: new Date("2019-01-01T00:00:00.000Z") });
      expect(await store.prune(new Date("2020-03-01T00:00:00.000Z"))).toBeGreaterThanOrEqual(1);
      expect(await store.get(gone)).toBeNull();
      expect(await store.read(gone)).toEqual([]);
      expect(await store.get(kept)).not.toBeNull();
      expect(await store.get(openJob)).not.toBeNull();
    });

    it("list pages jobs newest first by creation, filters by state, and forgets pruned jobs", async () => {
      const store = await fresh();
      if (!store.list) return;
      // Far-future times put these jobs ahead of any other test's in a shared backend.
      const at = (minute: number) => new Date(Date.UTC(2099, 0, 1, 0, minute));
      const ids = Array.from({ length: 5 }, () => randomUUID());
      await store.open(ids[0]!, { now: at(1), expect: true, info: { repoUrl: "r0" } });
      await store.append(ids[1]!, 0, lines(["x"]), at(2));
      await store.open(ids[2]!, { now: at(3) });
      await store.finish(
        ids[2]!,
        sampleJobResult({ requestId: ids[2]!, outcome: "cancelled", endedAt: at(30).toISOString() }),
      );
      await store.open(ids[3]!, { now: at(4) });
      await store.open(ids[4]!, { now: at(5) });
      // Activity on an older job does not move it: the key is when it was created.
      await store.append(ids[0]!, 0, lines(["late"]), at(40));
      const top = { createdAt: "2100-01-01T00:00:00.000Z", requestId: "ffffffff-ffff-ffff-ffff-ffffffffffff" };
      const all = await store.list({ limit: 5, before: top });
      expect(all.map((s) => s.requestId)).toEqual([...ids].reverse());
      expect(all[4]).toMatchObject({
        requestId: ids[0],
        expected: true,
        info: { repoUrl: "r0" },
        storedLines: 1,
        createdAt: at(1).toISOString(),
      });
      const first = await store.list({ limit: 2, before: top });
      expect(first.map((s) => s.requestId)).toEqual([ids[4], ids[3]]);
      const next = await store.list({
        limit: 2,
        before: { createdAt: first[1]!.createdAt!, requestId: first[1]!.requestId },
      });
      expect(next.map((s) => s.requestId)).toEqual([ids[2], ids[1]]);
      const cancelled = await store.list({ limit: 10, before: top, status: ["cancelled"] });
      expect(cancelled[0]).toMatchObject({ requestId: ids[2], status: "cancelled" });
      expect(cancelled.every((s) => s.status === "cancelled")).toBe(true);
      const open = await store.list({ limit: 4, before: top, status: ["open"] });
      expect(open.map((s) => s.requestId)).toEqual([ids[4], ids[3], ids[1], ids[0]]);
      if (store.prune) {
        await store.prune(new Date(Date.UTC(2099, 0, 2)));
        const after = await store.list({ limit: 5, before: top });
        expect(after.map((s) => s.requestId)).not.toContain(ids[2]);
        expect(after.map((s) => s.requestId)).toContain(ids[3]);
      }
    });

    it("a large batch in one append is stored whole and in order", async () => {
      const store = await fresh();
      const id = randomUUID();
      const n = options.manyLines ?? 20_000;
      const texts = Array.from({ length: n }, (_, i) => `build step ${i} ${"·".repeat(i % 40)}`);
      const half = Math.floor(n / 2);
      await store.append(id, 0, lines(texts.slice(0, half)));
      const state = await store.append(id, half, lines(texts.slice(half)));
      expect(state.committed).toBe(n);
      expect(state.storedLines).toBe(n);
      const back = await store.read(id);
      expect(back).toHaveLength(n);
      expect(back.map((l) => l.line)).toEqual(texts);
    });

    it("concurrent appends of one job at the same offset store one copy (no duplicates, no mix)", async () => {
      const store = await fresh();
      const stores: JobLogStore[] = [store];
      if (options.reopen) stores.push(await again(store));
      const id = randomUUID();
      await store.open(id);
      const batches = Array.from({ length: 6 }, (_, k) =>
        lines(Array.from({ length: 200 }, (_, i) => `writer ${k} line ${i}`)),
      );
      await Promise.all(batches.map((b, k) => stores[k % stores.length]!.append(id, 0, b)));
      const state = await store.get(id);
      expect(state?.committed).toBe(200);
      expect(state?.storedLines).toBe(200);
      const back = (await store.read(id)).map((l) => l.line);
      expect(back).toHaveLength(200);
      const writer = back[0]!.split(" ")[1];
      expect(back).toEqual(Array.from({ length: 200 }, (_, i) => `writer ${writer} line ${i}`));
    });

    describeSectionCases(context);

    withReopen("state, lines and results survive a reopen of the backing store", async () => {
      const store = await fresh();
      const id = randomUUID();
      const done = randomUUID();
      await store.open(id, { expect: true, info: { repoUrl: "r" } });
      await store.append(id, 0, lines(["a", "b"]));
      await store.append(done, 0, lines(["x"]));
      const result = sampleJobResult({ requestId: done });
      await store.finish(done, result, { at: 1 });
      const before = await store.get(id);
      await store.close?.();
      const other = await again(store);
      expect(await other.get(id)).toEqual(before);
      expect((await other.read(id)).map((l) => l.line)).toEqual(["a", "b"]);
      expect(await other.get(done)).toMatchObject({ status: "finished", committed: 2, result });
      expect((await other.append(id, 2, lines(["c"]))).committed).toBe(3);
      expect((await other.finish(done, sampleJobResult({ requestId: done }))).first).toBe(false);
    });

    withReopen("a reopened store lists the same jobs in the same order", async () => {
      const store = await fresh();
      if (!store.list) return;
      const ids = Array.from({ length: 3 }, () => randomUUID());
      for (const [i, id] of ids.entries()) await store.open(id, { now: new Date(Date.UTC(2098, 5, 1, 0, i)) });
      const top = { createdAt: "2098-12-31T00:00:00.000Z", requestId: "ffffffff-ffff-ffff-ffff-ffffffffffff" };
      const before = (await store.list({ limit: 3, before: top })).map((s) => s.requestId);
      expect(before).toEqual([...ids].reverse());
      await store.close?.();
      const other = await again(store);
      expect((await other.list!({ limit: 3, before: top })).map((s) => s.requestId)).toEqual(before);
    });

    it("close twice is harmless", async () => {
      const store = await fresh();
      await store.open(randomUUID());
      await store.close?.();
      await store.close?.();
    });

    const outage = options.outage;
    if (outage)
      describe("backend outage", () => {
        const { broken } = healAfterEach<S>((store) => outage.heal(store));

        it("calls fail with an error while the backend is down, and nothing half-written remains", async () => {
          const store = await fresh();
          const id = randomUUID();
          await store.append(id, 0, lines(["a"]));
          broken(store);
          await outage!.break(store);
          await expect(store.append(id, 1, lines(["b", "c"]))).rejects.toBeInstanceOf(Error);
          await expect(store.finish(id, sampleJobResult({ requestId: id }), { at: 1 })).rejects.toBeInstanceOf(Error);
          await outage!.heal(store);
          expect(await store.get(id)).toMatchObject({ status: "open", committed: 1 });
          expect((await store.append(id, 1, lines(["b", "c"]))).committed).toBe(3);
        });

        it("an outage in the middle of a large append leaves all of it or none of it", async () => {
          const store = await fresh();
          const id = randomUUID();
          const n = options.manyLines ?? 20_000;
          await store.open(id);
          const pending = store
            .append(id, 0, lines(Array.from({ length: n }, (_, i) => `line ${i}`)))
            .catch((e: unknown) => e);
          broken(store);
          await outage!.break(store);
          await pending;
          await outage!.heal(store);
          const state = await store.get(id);
          expect([0, n]).toContain(state?.committed);
          expect(state?.storedLines).toBe(state?.committed);
          expect(await store.read(id)).toHaveLength(state!.committed);
        });
      });
  });
}
