/**
 * The job-result publish through a real gRPC client over a real h2c socket: one publish in
 * flight per job (a slow queue never gets two results), cancel while an end is being
 * published, the per-attempt limit, a bounded close(), the check order while a job is
 * being cancelled or declared lost, and follow() on jobs that never appear or are pruned.
 */
import { randomUUID } from "node:crypto";
import { createClient, type Client } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { describe, expect, it } from "vitest";
import { Runner } from "../../../src/gen/runner/v1/runner_pb.js";
import {
  createRunnerService,
  startRunnerServer,
  type RunnerServer,
  type RunnerService,
  type RunnerServiceOptions,
} from "../../../src/runner/index.js";
import { RunnerDepotError } from "../../../src/errors.js";
import type { JobResult, JobResultQueue } from "../../../src/runner/ports.js";
import { empty, end, line, send, startHarness, until } from "../../fixtures/runner-service.js";

/** A queue whose every publish is decided by `behave` (the attempt number counts from 0). */
function scriptedQueue(behave: (result: JobResult, attempt: number) => Promise<void>) {
  const accepted: JobResult[] = [];
  let attempts = 0;
  let running = 0;
  let maxRunning = 0;
  const queue: JobResultQueue & { accepted: JobResult[]; readonly attempts: number; readonly maxConcurrent: number } = {
    accepted,
    get attempts() {
      return attempts;
    },
    /** Most publishes of this queue that were in flight at the same time. */
    get maxConcurrent() {
      return maxRunning;
    },
    async publishJobResult(result) {
      maxRunning = Math.max(maxRunning, ++running);
      try {
        await behave(result, attempts++);
      } finally {
        running--;
      }
      accepted.push(structuredClone(result));
    },
  };
  return queue;
}

/** A publish the test settles by hand. */
function gate() {
  let accept!: () => void;
  let refuse!: (error: unknown) => void;
  const promise = new Promise<void>((resolve, reject) => {
    accept = resolve;
    refuse = reject;
  });
  return { promise, accept, refuse };
}

interface Setup {
  runner: RunnerService;
  server: RunnerServer;
  client: Client<typeof Runner>;
  errors: unknown[];
  ended: JobResult[];
  close(): Promise<void>;
}

async function setup(queue: JobResultQueue, options: RunnerServiceOptions = {}): Promise<Setup> {
  const errors: unknown[] = [];
  const ended: JobResult[] = [];
  const runner = createRunnerService(queue, {
    onError: (e) => errors.push(e),
    onEnd: (r) => ended.push(r),
    ...options,
  });
  const server = await startRunnerServer(runner, { port: 0 });
  const client = createClient(Runner, createGrpcTransport({ baseUrl: server.url }));
  return {
    runner,
    server,
    client,
    errors,
    ended,
    async close() {
      await server.close();
      await runner.close();
    },
  };
}

const FAST_BOUND = { maxMs: 150, initialDelayMs: 10, maxDelayMs: 50 };

describe("one publish in flight per job", () => {
  it("a queue slower than the bound: UNAVAILABLE first, the replays wait for the same publish, exactly one result", async () => {
    const queue = scriptedQueue(() => new Promise((r) => setTimeout(r, 400)));
    const s = await setup(queue, { publishRetry: FAST_BOUND });
    try {
      const id = randomUUID();
      expect(await send(s.client, [line(id, "a"), end(id, 0)])).toMatchObject({ code: "Unavailable", committed: "1" });
      // The agent replays the end until it is acknowledged.
      let out = await send(s.client, [end(id, 0)], { offset: 1 });
      for (let i = 0; out.ok !== true && i < 100; i++) {
        expect(out).toMatchObject({ code: "Unavailable", committed: "1" });
        out = await send(s.client, [end(id, 0)], { offset: 1 });
      }
      expect(out).toMatchObject({ ok: true, committed: "2" });
      expect(await send(s.client, [line(id, "a"), end(id, 0)])).toMatchObject({ ok: true, committed: "2" });
      expect(queue.attempts).toBe(1);
      expect(queue.accepted.map((r) => r.requestId)).toEqual([id]);
      expect(s.ended).toHaveLength(1);
      expect(queue.maxConcurrent).toBe(1);
    } finally {
      await s.close();
    }
  });

  it("while the first publish is in flight a replay starts none and new items wait; once accepted it is recorded without a waiter", async () => {
    const first = gate();
    const queue = scriptedQueue((_r, n) => (n === 0 ? first.promise : Promise.resolve()));
    const s = await setup(queue, { publishRetry: FAST_BOUND });
    try {
      const id = randomUUID();
      expect(await send(s.client, [line(id, "a"), end(id, 4, false, "r", "c")])).toMatchObject({
        code: "Unavailable",
        committed: "1",
      });
      expect(await send(s.client, [end(id, 4, false, "r", "c")], { offset: 1 })).toMatchObject({
        code: "Unavailable",
        committed: "1",
      });
      // A log item where the end was sent waits for the end's publish too, and stores nothing.
      expect(await send(s.client, [line(id, "b")], { offset: 1 })).toMatchObject({
        code: "Unavailable",
        committed: "1",
      });
      expect(queue.attempts).toBe(1);
      first.accept();
      await until(
        async () => (await s.runner.logs.get(id))?.status === "finished",
        "the accepted end recorded in the background",
      );
      expect(await s.runner.logs.get(id)).toMatchObject({ committed: 2 });
      expect(await send(s.client, [end(id, 4, false, "r", "c")], { offset: 1 })).toMatchObject({
        ok: true,
        committed: "2",
      });
      expect(await send(s.client, [line(id, "b")], { offset: 2 })).toMatchObject({
        ok: false,
        reason: "ended",
        committed: "2",
      });
      expect(queue.attempts).toBe(1);
      expect(queue.accepted).toHaveLength(1);
      expect(queue.accepted[0]).toMatchObject({
        requestId: id,
        outcome: "finished",
        exitCode: 4,
        lines: { stdout: 1, stderr: 0 },
      });
      expect((await s.runner.logs.read(id)).map((l) => l.line)).toEqual(["a"]);
      expect(s.ended).toHaveLength(1);
    } finally {
      await s.close();
    }
  });

  it("a pending publish that fails: only then does a replay start a new one", async () => {
    const first = gate();
    const queue = scriptedQueue((_r, n) => (n === 0 ? first.promise : Promise.resolve()));
    const s = await setup(queue, { publishRetry: FAST_BOUND });
    try {
      const id = randomUUID();
      expect(await send(s.client, [end(id, 0)])).toMatchObject({ code: "Unavailable", committed: "0" });
      first.refuse(new Error("broker said no"));
      expect(await send(s.client, [end(id, 0)])).toMatchObject({ ok: true, committed: "1" });
      expect(queue.attempts).toBe(2);
      expect(queue.accepted).toHaveLength(1);
    } finally {
      await s.close();
    }
  });

  it("cancel while the end is being published: the end is accepted, cancelJob resolves null, one result (finished)", async () => {
    const first = gate();
    const queue = scriptedQueue((_r, n) => (n === 0 ? first.promise : Promise.resolve()));
    const s = await setup(queue, { publishRetry: FAST_BOUND });
    try {
      const id = randomUUID();
      expect(await send(s.client, [line(id, "a"), end(id, 0)])).toMatchObject({ code: "Unavailable", committed: "1" });
      const cancelled = s.runner.cancelJob(id);
      // The orchestrator no longer wants the job: the runner is told so at once.
      expect(await send(s.client, [end(id, 0)], { offset: 1 })).toMatchObject({
        ok: false,
        reason: "cancelled",
        committed: "1",
      });
      expect(queue.attempts).toBe(1);
      first.accept();
      expect(await cancelled).toBeNull();
      expect(queue.attempts).toBe(1);
      expect(queue.accepted.map((r) => r.outcome)).toEqual(["finished"]);
      expect(await send(s.client, [end(id, 0)], { offset: 1 })).toMatchObject({ ok: true, committed: "2" });
    } finally {
      await s.close();
    }
  });

  it("cancel while the end is being published: the end is refused, the cancel publishes the end's result (it may have been sent), one outcome (finished)", async () => {
    const first = gate();
    const queue = scriptedQueue((_r, n) => (n === 0 ? first.promise : Promise.resolve()));
    const s = await setup(queue, { publishRetry: FAST_BOUND });
    try {
      const id = randomUUID();
      expect(await send(s.client, [line(id, "a"), end(id, 0)])).toMatchObject({ code: "Unavailable", committed: "1" });
      const cancelled = s.runner.cancelJob(id);
      // A refusal does not prove nothing reached the queue (RabbitMQ's publish timeout leaves it on its channel).
      first.refuse(new Error("broker said no"));
      expect(await cancelled).toBeNull();
      expect(queue.attempts).toBe(2);
      expect(queue.accepted.map((r) => r.outcome)).toEqual(["finished"]);
      expect(await send(s.client, [end(id, 0)], { offset: 1 })).toMatchObject({ ok: true, committed: "2" });
      expect(s.ended.map((r) => r.outcome)).toEqual(["finished"]);
    } finally {
      await s.close();
    }
  });

  it("cancel of a job whose end was never handed to the queue publishes cancelled", async () => {
    const queue = scriptedQueue(() => Promise.resolve());
    const s = await setup(queue, { publishRetry: FAST_BOUND });
    try {
      const id = randomUUID();
      expect(await send(s.client, [line(id, "a")])).toMatchObject({ ok: true, committed: "1" });
      expect(await s.runner.cancelJob(id)).toMatchObject({ requestId: id, outcome: "cancelled", exitCode: -1 });
      expect(queue.accepted.map((r) => r.outcome)).toEqual(["cancelled"]);
    } finally {
      await s.close();
    }
  });

  it("cancel after a stalled end's publish was given up on: the end's result is the job's, one outcome (issue 31)", async () => {
    // The queue takes the end's publish and answers only later (a broker stalled with its TCP alive).
    const first = gate();
    const queue = scriptedQueue((_r, n) => (n === 0 ? first.promise : Promise.resolve()));
    const s = await setup(queue, { publishRetry: { ...FAST_BOUND, attemptTimeoutMs: 300 } });
    try {
      const id = randomUUID();
      expect(await send(s.client, [line(id, "a"), end(id, 0)])).toMatchObject({ code: "Unavailable", committed: "1" });
      await until(() => s.errors.some((e) => /given up on/.test(String(e))), "the attempt given up on");
      // The end may still reach the queue: a cancel now must not publish a different result.
      const cancelled = await s.runner.cancelJob(id);
      first.accept();
      await until(() => queue.accepted.length === queue.attempts, "every publish settled");
      // Before: ["finished", "cancelled"] under one message ID (the stalled end accepted after the cancel).
      const outcomes = queue.accepted.map((r) => r.outcome);
      expect(new Set(outcomes)).toEqual(new Set(["finished"]));
      // Every copy is the same result (consumers deduplicate on the request ID; a queue may drop the copy).
      expect(new Set(queue.accepted.map((r) => JSON.stringify(r))).size).toBe(1);
      expect(cancelled).toBeNull();
      expect(await s.runner.logs.get(id)).toMatchObject({ status: "finished", committed: 2 });
      expect(s.ended.map((r) => r.outcome)).toEqual(["finished"]);
      expect(await send(s.client, [end(id, 0)], { offset: 1 })).toMatchObject({ ok: true, committed: "2" });
    } finally {
      await s.close();
    }
  });

  it("a stalled end's publish accepted after it was given up on is recorded by itself: the job ends finished", async () => {
    const first = gate();
    const queue = scriptedQueue((_r, n) => (n === 0 ? first.promise : Promise.resolve()));
    const s = await setup(queue, { publishRetry: { ...FAST_BOUND, attemptTimeoutMs: 300 } });
    try {
      const id = randomUUID();
      expect(await send(s.client, [line(id, "a"), end(id, 0)])).toMatchObject({ code: "Unavailable", committed: "1" });
      await until(() => s.errors.some((e) => /given up on/.test(String(e))), "the attempt given up on");
      first.accept();
      await until(async () => (await s.runner.logs.get(id))?.status === "finished", "the late result recorded");
      expect(queue.attempts).toBe(1);
      expect(await s.runner.cancelJob(id)).toBeNull();
      expect(queue.accepted.map((r) => r.outcome)).toEqual(["finished"]);
    } finally {
      await s.close();
    }
  });

  it("a publish that never settles is given up on after attemptTimeoutMs (reported); the next replay publishes", async () => {
    const queue = scriptedQueue((_r, n) => (n === 0 ? new Promise<void>(() => {}) : Promise.resolve()));
    const s = await setup(queue, { publishRetry: { ...FAST_BOUND, attemptTimeoutMs: 300 } });
    try {
      const id = randomUUID();
      expect(await send(s.client, [end(id, 0)])).toMatchObject({ code: "Unavailable", committed: "0" });
      let out = await send(s.client, [end(id, 0)]);
      for (let i = 0; out.ok !== true && i < 100; i++) {
        expect(out.code).toBe("Unavailable");
        expect(queue.attempts).toBe(1);
        out = await send(s.client, [end(id, 0)]);
      }
      expect(out).toMatchObject({ ok: true, committed: "1" });
      expect(queue.attempts).toBe(2);
      expect(queue.accepted).toHaveLength(1);
      expect(s.errors.map(String).join("\n")).toMatch(/given up on/);
    } finally {
      await s.close();
    }
  });
});

describe("close() is bounded", () => {
  it("a cancelled result the queue never answers: close() resolves after closeTimeoutMs and reports the job", async () => {
    const queue = scriptedQueue(() => new Promise<void>(() => {}));
    // The attempt limit far above closeTimeoutMs: the one attempt must still be in flight at
    // close() (with 400 ms, a loaded machine's slow call below let it expire first and retry).
    const s = await setup(queue, {
      closeTimeoutMs: 200,
      publishRetry: { attemptTimeoutMs: 2_000, initialDelayMs: 10, maxDelayMs: 20 },
    });
    const id = randomUUID();
    expect(await send(s.client, [line(id, "a")])).toMatchObject({ ok: true, committed: "1" });
    const cancelled = s.runner.cancelJob(id);
    cancelled.catch(() => undefined);
    expect(await send(s.client, [line(id, "b")], { offset: 1 })).toMatchObject({
      ok: false,
      reason: "cancelled",
      committed: "1",
    });
    await s.server.close();
    await s.runner.close();
    expect(s.errors.map(String).join("\n")).toMatch(new RegExp(`unfinished.*${id}`));
    // The attempt limit then ends the background publish: nothing retries after close.
    await expect(cancelled).rejects.toThrow(/not published before close/);
    expect(queue.attempts).toBe(1);
    expect(queue.accepted).toHaveLength(0);
    // A second close() is the same (finished) close.
    await s.runner.close();
  });
});

describe("check order while a job is being cancelled or declared lost", () => {
  it("cancelled (result still being published): malformed offset, empty item and oversized item are refused before ok = false", async () => {
    const h = await startHarness({
      memoryStore: true,
      limits: { messageBytes: 4096 },
      publishRetry: { initialDelayMs: 5, maxDelayMs: 20 },
    });
    try {
      const id = randomUUID();
      expect(await send(h.client, [line(id, "a")])).toMatchObject({ ok: true, committed: "1" });
      h.queue.down = true;
      const cancelled = h.runner.cancelJob(id);
      await until(() => h.queue.attempts >= 1, "the cancel publishing");
      expect(await send(h.client, [line(id, "b")], { offset: "x1" })).toMatchObject({
        code: "InvalidArgument",
        committed: "1",
      });
      expect(await send(h.client, [empty(id)], { offset: 1 })).toMatchObject({
        code: "InvalidArgument",
        committed: "1",
      });
      // An oversized first message is refused on its frame prefix, before it is decoded (it
      // is read unauthenticated): no job is known yet, so no runner-committed.
      expect(await send(h.client, [line(id, "x".repeat(5000))], { offset: 1 })).toMatchObject({
        code: "ResourceExhausted",
        committed: null,
      });
      expect(await send(h.client, [line(id, "b")], { offset: 1 })).toMatchObject({
        ok: false,
        reason: "cancelled",
        committed: "1",
      });
      h.queue.down = false;
      expect(await cancelled).toMatchObject({ outcome: "cancelled" });
      expect((await h.logs.read(id)).map((l) => l.line)).toEqual(["a"]);
      expect(h.queue.results).toHaveLength(1);
    } finally {
      h.queue.down = false;
      await h.close();
    }
  });

  it("lost (result still being published): malformed offset and empty item are refused before ok = false", async () => {
    const h = await startHarness({
      memoryStore: true,
      lostAfterMs: 100,
      sweepIntervalMs: 20,
      publishRetry: { initialDelayMs: 5, maxDelayMs: 20 },
    });
    try {
      const id = randomUUID();
      h.queue.down = true;
      expect(await send(h.client, [line(id, "a")])).toMatchObject({ ok: true, committed: "1" });
      await until(() => h.queue.attempts >= 1, "the lost result publishing");
      expect(await send(h.client, [line(id, "b")], { offset: "-1" })).toMatchObject({
        code: "InvalidArgument",
        committed: "1",
      });
      expect(await send(h.client, [empty(id)], { offset: 1 })).toMatchObject({
        code: "InvalidArgument",
        committed: "1",
      });
      expect(await send(h.client, [line(id, "b")], { offset: 1 })).toMatchObject({
        ok: false,
        reason: "lost",
        committed: "1",
      });
      h.queue.down = false;
      expect(await h.queue.next()).toMatchObject({ requestId: id, outcome: "lost" });
      expect(h.queue.results).toHaveLength(1);
    } finally {
      h.queue.down = false;
      await h.close();
    }
  });
});

describe("follow() of jobs that are not (or no longer) there", () => {
  it("an ID that never appears: the iteration ends empty once lostAfterMs has passed", async () => {
    const h = await startHarness({ memoryStore: true, lostAfterMs: 200 });
    try {
      const seen: string[] = [];
      for await (const l of h.runner.follow(randomUUID())) seen.push(l.line);
      expect(seen).toEqual([]);
    } finally {
      await h.close();
    }
  });

  it("an ID followed before its first item (a VM just launched): its lines come once it speaks", async () => {
    const h = await startHarness({ memoryStore: true, lostAfterMs: 30_000 });
    try {
      const id = randomUUID();
      const seen: string[] = [];
      const following = (async () => {
        for await (const l of h.runner.follow(id)) seen.push(l.line);
      })();
      expect(await send(h.client, [line(id, "a"), line(id, "b"), end(id)])).toMatchObject({ ok: true, committed: "3" });
      await following;
      expect(seen).toEqual(["a", "b"]);
    } finally {
      await h.close();
    }
  });

  it("a job pruned while a slow follower is behind: the iteration ends instead of polling forever", async () => {
    // Retention well above the time to the follower's first read (400 ms could pass on a
    // loaded machine, pruning the job before the follower had its first page).
    const h = await startHarness({ memoryStore: true, lostAfterMs: 60, retentionMs: 2_000, sweepIntervalMs: 20 });
    try {
      const id = randomUUID();
      const items = Array.from({ length: 1100 }, (_, i) => line(id, `line ${i}`));
      expect(await send(h.client, [...items, end(id)])).toMatchObject({ ok: true, committed: "1101" });
      const it = h.runner.follow(id)[Symbol.asyncIterator]();
      expect((await it.next()).value).toMatchObject({ line: "line 0" });
      await until(async () => (await h.logs.get(id)) === null, "the job pruned");
      let count = 1;
      while (!(await it.next()).done) count++;
      // The first read (1 024 lines) was already in hand; the rest went with the job.
      expect(count).toBe(1024);
    } finally {
      await h.close();
    }
  });
});

describe("retries inside a call", () => {
  it("a queue that keeps refusing: attempts follow one another (never two at a time), then UNAVAILABLE", async () => {
    const queue = scriptedQueue(() => Promise.reject(new RunnerDepotError("UNAVAILABLE", "broker down")));
    // A bound of its own: a second attempt must fit in it after the first, which a loaded
    // machine could stretch past FAST_BOUND's 150 ms.
    const s = await setup(queue, { publishRetry: { ...FAST_BOUND, maxMs: 2_000 } });
    try {
      const id = randomUUID();
      expect(await send(s.client, [end(id, 0)])).toMatchObject({ code: "Unavailable", committed: "0" });
      expect(queue.attempts).toBeGreaterThan(1);
      expect(queue.maxConcurrent).toBe(1);
      expect(queue.accepted).toHaveLength(0);
    } finally {
      await s.close();
    }
  });
});
