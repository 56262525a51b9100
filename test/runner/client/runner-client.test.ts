/**
 * createRunnerClient against the real runner server over real HTTP/2 sockets: call
 * cutting and offsets, the status-code table (give up, retry, split, stop), back-off
 * until the deadline, back-pressure, a server restart mid-job, and TLS with mutual TLS.
 */
import { execFileSync } from "node:child_process";
import { randomUUID } from "node:crypto";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { createFsLogStore } from "../../../src/adapters/fs/index.js";
import { createMemoryLogStore } from "../../../src/adapters/memory/log-store.js";
import { createMemoryQueue, type MemoryQueue } from "../../../src/adapters/memory/index.js";
import { isRunnerDepotError } from "../../../src/errors.js";
import { createRunnerClient, type RunnerClientOptions } from "../../../src/runner/client/runner-client.js";
import type { JobLogStore, StoredLine } from "../../../src/runner/ports.js";
import { createRunnerService, type RunnerService, type RunnerServiceOptions } from "../../../src/runner/index.js";
import {
  startRunnerServer,
  type RunnerServer,
  type RunnerServerSettings,
} from "../../../src/runner/server/start-server.js";
import { mintJobToken } from "../../../src/runner/protocol/token.js";

const SECRET = "client-test-secret";

interface Harness {
  queue: MemoryQueue;
  runner: RunnerService;
  server: RunnerServer;
  logs: JobLogStore;
  client(
    extra?: Partial<RunnerClientOptions> & { requestId?: string },
  ): ReturnType<typeof createRunnerClient> & { requestId: string };
  stored(requestId: string): Promise<StoredLine[]>;
  close(): Promise<void>;
}

const harnesses: Harness[] = [];
afterAll(async () => {
  for (const h of harnesses) await h.close();
});

async function startHarness(options: RunnerServiceOptions = {}, settings: RunnerServerSettings = {}): Promise<Harness> {
  const queue = createMemoryQueue();
  const logs = options.logs ?? createMemoryLogStore();
  const runner = createRunnerService(queue, { secret: SECRET, ...options, logs });
  const server = await startRunnerServer(runner, { port: 0, ...settings });
  const clients: Array<ReturnType<typeof createRunnerClient>> = [];
  const h: Harness = {
    queue,
    runner,
    server,
    logs,
    client(extra = {}) {
      const requestId = extra.requestId ?? randomUUID();
      const c = createRunnerClient({
        endpoint: server.url,
        requestId,
        token: mintJobToken(SECRET, requestId),
        ...extra,
      });
      clients.push(c);
      return Object.assign(c, { requestId });
    },
    async stored(requestId) {
      return (await logs.read(requestId, 0, Number.MAX_SAFE_INTEGER)).map((l) => ({
        line: l.line,
        stderr: l.stderr,
        ...(l.marker ? { marker: true } : {}),
      }));
    },
    async close() {
      for (const c of clients) await c.close();
      await server.close();
      await runner.close();
    },
  };
  harnesses.push(h);
  return h;
}

let h: Harness;
beforeAll(async () => {
  h = await startHarness();
});

describe("createRunnerClient: the happy path", () => {
  it("cuts calls at about 4 MiB by default: ~2.9 MB of frames is one call, ~5.2 MB two (and one more first call of 64 KiB while runs may be sent)", async () => {
    // Each call costs both sides a stream, a token check and an answer (~1 ms of CPU a side
    // on the e2e bench), so the default cut is 4 MiB; it still bounds a replay. With runs on (the default), a job's
    // first call ends at 64 KiB, so its answer says soon whether the server takes runs.
    const line = "x".repeat(99);
    for (const [lines, calls, runs] of [
      [20_000, 1, false],
      [36_000, 2, false],
      [20_000, 2, true],
      [36_000, 3, true],
    ] as const) {
      const client = h.client({ runs });
      for (let i = 0; i < lines; i++) client.log(line);
      await client.flush();
      expect(client.stats.committed).toBe(lines);
      expect(client.stats.calls).toBe(calls);
      await client.end({ exitCode: 0, success: true });
      expect((await h.logs.get(client.requestId))?.committed).toBe(lines + 1);
    }
  });

  it("cuts its stream into many calls with running offsets and stores every line once, in order", async () => {
    const client = h.client({ maxCallBytes: 8 * 1024 });
    const sent: StoredLine[] = [];
    for (let i = 0; i < 5000; i++) {
      const line = i % 10 === 0 ? "" : `line ${i} ✓ ${"z".repeat(i % 50)}\r\u001b[0m`;
      sent.push({ line, stderr: i % 4 === 0 });
      client.log(line, i % 4 === 0);
    }
    await client.flush();
    expect(client.stats.committed).toBe(5000);
    expect(client.stats.spoolBytes).toBe(0);
    // 5000 frames of ~60 bytes do not fit in one 8 KiB call.
    expect(client.stats.calls).toBeGreaterThan(20);
    await client.end({ exitCode: -3, success: true, repoUrl: "https://example.com/r.git", commitSha: "deadbeef" });
    expect(await h.stored(client.requestId)).toEqual(sent);
    const results = h.queue.results.filter((r) => r.requestId === client.requestId);
    expect(results).toHaveLength(1);
    // Published exactly as sent: the service never infers success from the exit code.
    expect(results[0]).toMatchObject({
      outcome: "finished",
      exitCode: -3,
      success: true,
      repoUrl: "https://example.com/r.git",
      commitSha: "deadbeef",
      lines: { stdout: 3750, stderr: 1250 },
    });
    expect(client.stats.retries).toBe(0);
  });

  it("cuts a call at a random point of maxCallMs's last quarter, never later, so agents started together do not cut in step", async () => {
    // Math.random() near 1 is the earliest cut (three quarters of maxCallMs), 0 the latest.
    for (const [random, earliest, latest] of [
      [0.999, 1450, 1900],
      [0, 1950, 4000],
    ] as const) {
      const spy = vi.spyOn(Math, "random").mockReturnValue(random);
      try {
        const client = h.client({ maxCallMs: 2000, keepaliveMs: 60_000 });
        const t0 = performance.now();
        client.log("one line, then silence");
        // The line is acknowledged when its call is cut and answered.
        while (client.stats.committed < 1) await new Promise((r) => setTimeout(r, 10));
        const cutAfter = performance.now() - t0;
        expect(cutAfter).toBeGreaterThanOrEqual(earliest);
        expect(cutAfter).toBeLessThan(latest);
        expect(client.stats.calls).toBe(1);
        await client.close();
      } finally {
        spy.mockRestore();
      }
    }
  });

  it("sends the request ID lower-case and splits an over-long line itself (no server marker)", async () => {
    const requestId = randomUUID().toUpperCase();
    const client = h.client({ requestId, maxLineBytes: 1000 });
    const long = "ü".repeat(1200); // 2400 bytes → 1000 + 1000 + 400
    client.log(long, true);
    await client.end({ exitCode: 0, success: true });
    const log = await h.stored(requestId.toLowerCase());
    expect(log.map((l) => Buffer.byteLength(l.line))).toEqual([1000, 1000, 400]);
    expect(log.map((l) => l.line).join("")).toBe(long);
    expect(log.every((l) => l.stderr && !l.marker)).toBe(true);
  });

  it("logUtf8 stores a line's bytes as log() stores its text, and splits one over the line limit the same way", async () => {
    const requestId = randomUUID();
    const client = h.client({ requestId, maxLineBytes: 1000 });
    const long = "ü".repeat(1200);
    const src = Buffer.from(`<<ok ✓ line>>${long}`);
    const logUtf8 = client.logUtf8!; // unbound on purpose: it must not depend on `this`
    logUtf8(src, 2, Buffer.byteLength("<<ok ✓ line"), false);
    logUtf8(src, src.length - 2400, src.length, true);
    client.log("after", false);
    await client.end({ exitCode: 0, success: true });
    const log = await h.stored(requestId);
    expect(log.map((l) => [l.line, l.stderr])).toEqual([
      ["ok ✓ line", false],
      ["ü".repeat(500), true],
      ["ü".repeat(500), true],
      ["ü".repeat(200), true],
      ["after", false],
    ]);
    expect(client.stats.lines).toEqual({ stdout: 2, stderr: 3 });
  });

  it("logLines stores each line of a run as logUtf8 does, stops before a line over the limit, and nothing when not open", async () => {
    const requestId = randomUUID();
    const client = h.client({ requestId, maxLineBytes: 1000 });
    const logLines = client.logLines!; // unbound on purpose: it must not depend on `this`
    const long = "ü".repeat(600); // 1,200 bytes
    const src = Buffer.from(`>>one ✓\n\ntwo\n${long}\nthree\n<<`);
    const end = src.length - 2;
    // A run the caller limits to 10 bytes a line stops at "ü…"; its own limit (1,000) too.
    expect(logLines(src, 2, end, true, 1_700_000_000_000.5, 10)).toEqual({ next: 15, accepted: true });
    const rest = 15; // ">>" and "one ✓\n\ntwo\n"
    expect(logLines(src, rest, end, false, 1_700_000_000_001)).toEqual({ next: rest, accepted: true });
    client.logUtf8!(src, rest, rest + 1200, false);
    expect(logLines(src, rest + 1201, end, false, 1_700_000_000_002)).toEqual({ next: end, accepted: true });
    expect(client.stats.lines).toEqual({ stdout: 3, stderr: 3 });
    await client.end({ exitCode: 0, success: true });
    // Ended: nothing taken, the lines are the caller's (whose log() then refuses them).
    expect(logLines(src, 2, end, false)).toEqual({ next: 2, accepted: true });
    const log = await h.logs.read(requestId, 0, 100);
    expect(log.map((l) => [l.line, l.stderr, l.time])).toEqual([
      ["one ✓", true, 1_700_000_000_000.5],
      ["", true, 1_700_000_000_000.5],
      ["two", true, 1_700_000_000_000.5],
      ["ü".repeat(500), false, expect.any(Number)],
      ["ü".repeat(100), false, expect.any(Number)],
      ["three", false, 1_700_000_000_002],
    ]);
  });

  it("logLines says when the spool is over its high-water mark", async () => {
    const client = h.client({ highWaterMarkBytes: 16 * 1024 });
    const run = Buffer.from(`${"r".repeat(99)}\n`.repeat(200));
    expect(client.logLines!(run, 0, run.length, false)).toEqual({ next: run.length, accepted: false });
    await client.drained();
    await client.end({ exitCode: 0, success: true });
    expect(await h.stored(client.requestId)).toHaveLength(200);
  });

  it("applies back-pressure: log() returns false over the high-water mark and drained() resolves", async () => {
    const client = h.client({ highWaterMarkBytes: 16 * 1024 });
    let refused = 0;
    for (let i = 0; i < 3000; i++) {
      if (!client.log(`bp ${i} ${"q".repeat(40)}`)) {
        refused++;
        await client.drained();
        expect(client.stats.spoolBytes).toBeLessThanOrEqual(8 * 1024);
      }
    }
    expect(refused).toBeGreaterThan(0);
    await client.end({ exitCode: 0, success: true });
    const log = await h.stored(client.requestId);
    expect(log).toHaveLength(3000);
    expect(log[2999]!.line).toBe(`bp 2999 ${"q".repeat(40)}`);
  });

  it("refuses misuse locally with INVALID_ARGUMENT", async () => {
    expect(() => createRunnerClient({ endpoint: h.server.url, requestId: "not-a-uuid" })).toThrow(/not a UUID/);
    expect(() => createRunnerClient({ endpoint: "ftp://x", requestId: randomUUID() })).toThrow(/http/);
    const client = h.client();
    await expect(client.end({ exitCode: 1.5, success: false })).rejects.toMatchObject({ code: "INVALID_ARGUMENT" });
    await expect(client.end({ exitCode: 2 ** 31, success: false })).rejects.toMatchObject({ code: "INVALID_ARGUMENT" });
    const done = client.end({ exitCode: 0, success: true });
    expect(() => client.log("late")).toThrow(/after end/);
    await expect(client.end({ exitCode: 0, success: true })).rejects.toMatchObject({ code: "INVALID_ARGUMENT" });
    await done;
  });
});

describe("createRunnerClient: the status-code table", () => {
  it("UNAUTHENTICATED (no token): gives up at once, stops with reason failed, stores nothing", async () => {
    const client = h.client({ token: "" });
    client.log("x");
    const end = client.end({ exitCode: 0, success: true });
    await expect(end).rejects.toMatchObject({ code: "UNAUTHENTICATED" });
    const stop = await client.stopped;
    expect(stop.reason).toBe("failed");
    expect(isRunnerDepotError(stop.error, "UNAUTHENTICATED")).toBe(true);
    expect(client.stats.retries).toBe(0);
    expect(await h.logs.get(client.requestId)).toBeNull();
  });

  it("PERMISSION_DENIED (wrong token): gives up", async () => {
    const requestId = randomUUID();
    const client = h.client({ requestId, token: mintJobToken("wrong", requestId) });
    client.log("x");
    await expect(client.flush()).rejects.toMatchObject({ code: "PERMISSION_DENIED" });
    expect(client.stats.calls).toBe(1);
  });

  it("NOT_FOUND (unknown job with requireKnownJobs): gives up; a registered job streams", async () => {
    const known = await startHarness({ requireKnownJobs: true });
    const unknown = known.client();
    unknown.log("x");
    await expect(unknown.flush()).rejects.toMatchObject({ code: "NOT_FOUND" });
    const registered = known.client();
    await known.runner.expectJob(registered.requestId, { repoUrl: "r" });
    registered.log("y");
    await registered.end({ exitCode: 0, success: true });
    expect(await known.stored(registered.requestId)).toEqual([{ line: "y", stderr: false }]);
  });

  it("Ack ok = false (host cancelled): stops with runner-reason cancelled; end() rejects ABORTED", async () => {
    const client = h.client();
    client.log("before cancel");
    await client.flush();
    const stops: string[] = [];
    client.onStop((s) => stops.push(s.reason));
    await h.runner.cancelJob(client.requestId);
    client.log("after cancel");
    await expect(client.end({ exitCode: 0, success: true })).rejects.toMatchObject({ code: "ABORTED" });
    expect(await client.stopped).toEqual({ reason: "cancelled" });
    expect(stops).toEqual(["cancelled"]);
    expect(client.log("ignored once stopped")).toBe(true);
    expect(await h.stored(client.requestId)).toEqual([{ line: "before cancel", stderr: false }]);
    expect(h.queue.results.filter((r) => r.requestId === client.requestId)).toMatchObject([{ outcome: "cancelled" }]);
  });

  it("Ack ok = false (job already ended): a second agent for the job stops with reason ended", async () => {
    const first = h.client();
    first.log("one");
    await first.end({ exitCode: 0, success: true });
    const second = h.client({ requestId: first.requestId });
    // Items 0 and 1 (the job's line and end) count as duplicates and are skipped
    // without comparison; item 2 is new to an ended job.
    second.log("one");
    second.log("two");
    second.log("three");
    await expect(second.flush()).rejects.toMatchObject({ code: "ABORTED" });
    expect(await second.stopped).toEqual({ reason: "ended" });
    expect(await h.stored(first.requestId)).toEqual([{ line: "one", stderr: false }]);
  });

  it("UNAVAILABLE (queue down at the end): retries with back-off; the replayed end publishes once", async () => {
    const slow = await startHarness({ publishRetry: { maxMs: 50, initialDelayMs: 5, maxDelayMs: 10 } });
    const retries: string[] = [];
    const client = slow.client({ backoff: { initialMs: 5, maxMs: 20 }, onRetry: (e) => retries.push(e.code) });
    client.log("work");
    await client.flush();
    slow.queue.down = true;
    const end = client.end({ exitCode: 0, success: true });
    while (retries.length < 3) await new Promise((r) => setTimeout(r, 10));
    slow.queue.down = false;
    await end;
    expect(retries.slice(0, 3)).toEqual(["UNAVAILABLE", "UNAVAILABLE", "UNAVAILABLE"]);
    expect(slow.queue.results.filter((r) => r.requestId === client.requestId)).toHaveLength(1);
    expect(await slow.stored(client.requestId)).toEqual([{ line: "work", stderr: false }]);
  });

  it("RESOURCE_EXHAUSTED (message over the server's limit): splits the line until it fits", async () => {
    const small = await startHarness({ limits: { messageBytes: 4096 } });
    const client = small.client();
    const long = "é".repeat(10_000); // 20 000 bytes, one piece of 64 KiB for the client
    client.log("before", false, 1_000.001);
    client.log(long, false, 2_000.002);
    client.log("after", false, 3_000.003);
    await client.end({ exitCode: 0, success: true });
    const log = await small.stored(client.requestId);
    // Re-encoding the spool keeps each line's stamp, on every piece of a split one.
    const times = (await small.logs.read(client.requestId)).map((l) => l.time);
    expect(times).toEqual([1_000.001, ...log.slice(1, -1).map(() => 2_000.002), 3_000.003]);
    expect(log[0]).toEqual({ line: "before", stderr: false });
    expect(log.at(-1)).toEqual({ line: "after", stderr: false });
    const pieces = log.slice(1, -1);
    expect(pieces.map((p) => p.line).join("")).toBe(long);
    for (const p of pieces) expect(Buffer.byteLength(p.line)).toBeLessThanOrEqual(4096 - 64);
    expect(client.stats.retries).toBeGreaterThan(0);
    expect(small.queue.results.filter((r) => r.requestId === client.requestId)).toHaveLength(1);
  });

  it("end() resolves only once the end is stored, however many re-splits renumber the spool", async () => {
    const small = await startHarness({ limits: { messageBytes: 8192 } });
    const client = small.client();
    // 300 lines of 20 000 bytes: several RESOURCE_EXHAUSTED rounds, each renumbering every unacknowledged item.
    for (let i = 0; i < 300; i++) client.log(`${i} `.padEnd(20_000, "x"));
    await client.end({ exitCode: 0, success: true });
    expect(client.stats.retries).toBeGreaterThan(1);
    const state = await small.logs.get(client.requestId);
    expect(state).toMatchObject({ status: "finished", committed: client.stats.items });
    expect(small.queue.results.filter((r) => r.requestId === client.requestId)).toHaveLength(1);
    expect((await small.stored(client.requestId)).map((l) => l.line).join("")).toBe(
      Array.from({ length: 300 }, (_, i) => `${i} `.padEnd(20_000, "x")).join(""),
    );
  });

  it("FAILED_PRECONDITION that the spool cannot satisfy (server lost acknowledged items): gives up", async () => {
    // The proxy first leads to server A, then to a fresh server B that knows nothing of the job.
    const a = await startHarness();
    const b = await startHarness();
    const proxy = await startSwitchProxy(a.server.port);
    try {
      const requestId = randomUUID();
      const client = createRunnerClient({
        endpoint: `http://127.0.0.1:${proxy.port}`,
        requestId,
        token: mintJobToken(SECRET, requestId),
      });
      client.log("stored on A");
      await client.flush();
      proxy.switchTo(b.server.port);
      client.log("B has a gap");
      await expect(client.flush()).rejects.toMatchObject({ code: "FAILED_PRECONDITION" });
      expect((await client.stopped).reason).toBe("failed");
      expect(await b.logs.get(requestId)).toBeNull();
      await client.close();
    } finally {
      await proxy.close();
    }
  });

  it("network errors: retries with jittered back-off until the deadline, then fails UNAVAILABLE", async () => {
    const port = await closedPort();
    const requestId = randomUUID();
    const delays: number[] = [];
    const client = createRunnerClient({
      endpoint: `http://127.0.0.1:${port}`,
      requestId,
      // Three retries must fit in the deadline: 300 ms did not leave room for a loaded
      // machine's late timers (each retry waits on one).
      deadlineMs: 3_000,
      backoff: { initialMs: 10, maxMs: 40 },
      onRetry: (_e, delay) => delays.push(delay),
    });
    client.log("nobody listens");
    await expect(client.end({ exitCode: 0, success: true })).rejects.toMatchObject({ code: "UNAVAILABLE" });
    expect(delays.length).toBeGreaterThan(2);
    expect(Math.max(...delays)).toBeLessThanOrEqual(40);
    await client.close();
  });
});

describe("createRunnerClient: a server that accepts but never answers", () => {
  it("cancels a call whose response does not come (responseTimeoutMs), retries, gives up at the deadline", async () => {
    const sink = await startBlackHole();
    try {
      const retries: string[] = [];
      const client = createRunnerClient({
        endpoint: `http://127.0.0.1:${sink.port}`,
        requestId: randomUUID(),
        maxCallMs: 10,
        responseTimeoutMs: 30,
        keepaliveMs: 60_000,
        deadlineMs: 200,
        backoff: { initialMs: 5, maxMs: 10 },
        onRetry: (e) => retries.push(e.code),
      });
      client.log("into the void");
      await expect(client.flush()).rejects.toMatchObject({ code: "DEADLINE_EXCEEDED" });
      expect(retries.length).toBeGreaterThan(0);
      expect(new Set(retries)).toEqual(new Set(["DEADLINE_EXCEEDED"]));
      await client.close();
    } finally {
      await sink.close();
    }
  });

  it("drops a connection whose keep-alive PING goes unanswered", async () => {
    const sink = await startBlackHole();
    try {
      const messages: string[] = [];
      const client = createRunnerClient({
        endpoint: `http://127.0.0.1:${sink.port}`,
        requestId: randomUUID(),
        maxCallMs: 60_000,
        responseTimeoutMs: 60_000,
        keepaliveMs: 30,
        deadlineMs: 300,
        backoff: { initialMs: 5, maxMs: 10 },
        onRetry: (e) => messages.push(e.message),
      });
      client.log("into the void");
      await expect(client.flush()).rejects.toMatchObject({ code: "UNAVAILABLE" });
      expect(messages.some((m) => /keep-alive ping unanswered/.test(m))).toBe(true);
      expect(sink.connections).toBeGreaterThan(1);
      await client.close();
    } finally {
      await sink.close();
    }
  });
});

describe("createRunnerClient: server restart and TLS", () => {
  it("a graceful server restart mid-job loses and duplicates nothing", async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), "runner-depot-client-restart-"));
    const queue = createMemoryQueue();
    const logsA = createFsLogStore(dir, { fsync: false });
    const runnerA = createRunnerService(queue, { logs: logsA, secret: SECRET });
    const serverA = await startRunnerServer(runnerA, { port: 0, gracefulShutdownMs: 50 });
    // The agent's endpoint stays the same (a stable address in front of the orchestrator);
    // the restarted server listens on a new port behind it.
    const proxy = await startSwitchProxy(serverA.port);
    const requestId = randomUUID();
    const client = createRunnerClient({
      endpoint: `http://127.0.0.1:${proxy.port}`,
      requestId,
      token: mintJobToken(SECRET, requestId),
      backoff: { initialMs: 5, maxMs: 50 },
    });
    try {
      for (let i = 0; i < 2000; i++) client.log(`a ${i}`);
      await client.flush();
      for (let i = 0; i < 2000; i++) client.log(`b ${i}`);
      await serverA.close();
      await runnerA.close();
      await logsA.close?.();
      const logsB = createFsLogStore(dir, { fsync: false });
      const runnerB = createRunnerService(queue, { logs: logsB, secret: SECRET });
      const serverB = await startRunnerServer(runnerB, { port: 0 });
      proxy.switchTo(serverB.port);
      try {
        for (let i = 0; i < 2000; i++) client.log(`c ${i}`);
        await client.end({ exitCode: 0, success: true });
        const log = (await logsB.read(requestId, 0, 10_000)).map((l) => l.line);
        expect(log).toEqual(["a", "b", "c"].flatMap((p) => Array.from({ length: 2000 }, (_, i) => `${p} ${i}`)));
        expect(queue.results.filter((r) => r.requestId === requestId)).toHaveLength(1);
      } finally {
        await client.close();
        await serverB.close();
        await runnerB.close();
        await logsB.close?.();
      }
    } finally {
      await proxy.close();
      await rm(dir, { recursive: true, force: true });
    }
  });

  it("speaks TLS with mutual TLS; a client without a certificate cannot stream", async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), "runner-depot-client-tls-"));
    try {
      const server = await selfSigned(dir, "server", "subjectAltName=IP:127.0.0.1,DNS:localhost");
      const agent = await selfSigned(dir, "agent", "subjectAltName=DNS:agent");
      const tlsH = await startHarness({}, { tls: { cert: server.cert, key: server.key, ca: agent.cert } });
      expect(tlsH.server.url.startsWith("https://")).toBe(true);
      const client = tlsH.client({ tls: { ca: server.cert, cert: agent.cert, key: agent.key } });
      client.log("over TLS");
      await client.end({ exitCode: 0, success: true });
      expect(await tlsH.stored(client.requestId)).toEqual([{ line: "over TLS", stderr: false }]);

      const anonymous = tlsH.client({
        tls: { ca: server.cert },
        deadlineMs: 200,
        backoff: { initialMs: 10, maxMs: 20 },
      });
      anonymous.log("no certificate");
      await expect(anonymous.flush()).rejects.toMatchObject({ code: "UNAVAILABLE" });
      expect(await tlsH.logs.get(anonymous.requestId)).toBeNull();
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});

async function selfSigned(dir: string, name: string, san: string) {
  const key = path.join(dir, `${name}.key`);
  const cert = path.join(dir, `${name}.crt`);
  execFileSync(
    "openssl",
    [
      "req",
      "-x509",
      "-newkey",
      "ec",
      "-pkeyopt",
      "ec_paramgen_curve:prime256v1",
      "-nodes",
      "-keyout",
      key,
      "-out",
      cert,
      "-days",
      "1",
      "-subj",
      `/CN=${name}`,
      "-addext",
      san,
    ],
    { stdio: "ignore" },
  );
  return { key: await readFile(key), cert: await readFile(cert) };
}

async function closedPort(): Promise<number> {
  const s = net.createServer();
  await new Promise<void>((r) => s.listen(0, "127.0.0.1", r));
  const port = (s.address() as net.AddressInfo).port;
  await new Promise<void>((r) => s.close(() => r()));
  return port;
}

/** A TCP server that accepts connections and reads everything, never sending a byte. */
async function startBlackHole() {
  const sockets = new Set<net.Socket>();
  let connections = 0;
  const server = net.createServer((s) => {
    connections++;
    sockets.add(s);
    s.on("data", () => undefined);
    s.on("error", () => undefined);
    s.on("close", () => sockets.delete(s));
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return {
    port: (server.address() as net.AddressInfo).port,
    get connections() {
      return connections;
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

/** A TCP proxy whose target can be switched; switching cuts the open connections. */
async function startSwitchProxy(targetPort: number) {
  let target = targetPort;
  const sockets = new Set<net.Socket>();
  const server = net.createServer((down) => {
    const up = net.connect(target, "127.0.0.1");
    for (const s of [down, up]) {
      sockets.add(s);
      s.on("error", () => undefined);
      s.on("close", () => {
        sockets.delete(s);
        down.destroy();
        up.destroy();
      });
    }
    down.pipe(up);
    up.pipe(down);
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return {
    port: (server.address() as net.AddressInfo).port,
    switchTo(port: number) {
      target = port;
      for (const s of sockets) s.destroy();
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}
