/**
 * The server-wide budget for entries queued for the store (limits.queuedBytes,
 * runner/service/store-backlog.ts), through a real socket: many calls (each its own HTTP/2 connection)
 * stream into a server whose store is held back, then slow. With the budget, what the
 * service holds unstored stays within the budget plus about one read chunk per call
 * (the readers pause; HTTP/2 flow control holds the agents back); nothing is lost and
 * every call completes. The same run with a budget too large to matter shows the bound
 * would not hold without it (the check can fail).
 */
import { randomUUID } from "node:crypto";
import * as http2 from "node:http2";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { describe, expect, it } from "vitest";
import { Runner, type LogItem } from "../../../src/gen/runner/v1/runner_pb.js";
import {
  createRunnerService,
  mintJobToken,
  startRunnerServer,
  type RunnerServiceOptions,
} from "../../../src/runner/index.js";
import { createMemoryLogStore, createMemoryQueue } from "../../../src/adapters/memory/index.js";
import type { JobLogStore } from "../../../src/runner/ports.js";
import { backlogOf } from "../../../src/runner/service/store-backlog.js";
import { end, line, send, until } from "../../fixtures/runner-service.js";
import { connect, frame, openCall } from "../../fixtures/runner-raw-calls.js";

const CALLS = 16;
const LINES = 3000;
const BUDGET = 256 * 1024;
/** Per call beyond the budget: about the chunk that crossed it (a DATA frame, ≤ 16 KiB on the wire), counted generously. */
const SLACK_PER_CALL = 32 * 1024;
const BOUND = BUDGET + CALLS * SLACK_PER_CALL;

/**
 * A memory store whose appends wait behind a gate, then run one at a time at ~0.05 ms an
 * entry (a store slower than the clients). The gate opens once `quiet()` has held for
 * 1.5 s: nothing more queued (the readers paused, or every line received). That is longer
 * than the calls' idle limit in these runs: a call the server holds back is not idle.
 */
function slowStore(quiet: () => number): { logs: JobLogStore; stop(): void } {
  const inner = createMemoryLogStore();
  let open = false;
  let last = -1;
  let still = 0;
  const poll = setInterval(() => {
    const now = quiet();
    still = now === last && now > 0 ? still + 1 : 0;
    last = now;
    if (still >= 30) open = true;
  }, 50);
  let chain: Promise<unknown> = Promise.resolve();
  const logs: JobLogStore = Object.create(inner) as JobLogStore;
  logs.append = (id, at, entries, now) => {
    const run = chain.then(async () => {
      await until(() => open, "the store gate");
      await new Promise((resolve) => setTimeout(resolve, Math.max(1, entries.length * 0.05)));
      return inner.append(id, at, entries, now);
    });
    chain = run.catch(() => undefined);
    return run;
  };
  return { logs, stop: () => clearInterval(poll) };
}

/**
 * A memory log store whose appends wait while its gate is closed (a store stalled, then
 * back): closed from the start unless `open` is false; `close()` stalls it again.
 */
function gatedStore(closed = true): { logs: JobLogStore; open(): void; close(): void } {
  const inner = createMemoryLogStore();
  let release = () => {};
  let gate = Promise.resolve();
  const close = () => {
    gate = new Promise<void>((resolve) => (release = resolve));
  };
  if (closed) close();
  const logs: JobLogStore = Object.create(inner) as JobLogStore;
  logs.append = async (id, at, entries, now) => {
    await gate;
    return inner.append(id, at, entries, now);
  };
  return { logs, open: () => release(), close };
}

/**
 * A runner service on `logs` with `secret` and `limits`, served on 127.0.0.1, with its
 * backlog; `stop()` opens the store's gate, drops the client sessions, closes both.
 */
async function backlogServer(
  store: { logs: JobLogStore; open(): void },
  secret: string,
  limits?: RunnerServiceOptions["limits"],
) {
  const runner = createRunnerService(createMemoryQueue(), { logs: store.logs, secret, limits });
  const backlog = backlogOf(runner)!;
  const server = await startRunnerServer(runner, { port: 0 });
  const sessions: http2.ClientHttp2Session[] = [];
  const stop = async () => {
    store.open();
    for (const session of sessions) session.destroy();
    await server.close();
    await runner.close();
  };
  return { backlog, server, sessions, stop };
}

/**
 * Opens a job's call on `session` that sends 2,000 lines and the job's end held back, and
 * waits until the backlog holds its reader back (the store is stalled). `finish()` opens the
 * store, ends the job and checks that every line was stored once.
 */
async function holdLoudCall(
  session: http2.ClientHttp2Session,
  secret: string,
  store: { open(): void },
  backlog: { waiting: number },
) {
  const id = randomUUID();
  const held = openCall(session, "grpc", mintJobToken(secret, id));
  held.stream.write(Buffer.concat(Array.from({ length: 2000 }, (_, i) => frame(line(id, `${i} ${"x".repeat(90)}`)))));
  await until(() => backlog.waiting > 0, "a job's call held back by the backlog");
  const finish = async () => {
    store.open();
    held.stream.end(frame(end(id)));
    expect(await held.status).toMatchObject({ code: 0, committed: "2001" });
  };
  return { finish };
}

async function fleetRun(queuedBytes: number) {
  let held = () => 0;
  const store = slowStore(() => held());
  const queue = createMemoryQueue();
  const runner = createRunnerService(queue, { logs: store.logs, limits: { queuedBytes, idleMs: 1000 } });
  const backlog = backlogOf(runner)!;
  held = () => backlog.held;
  const server = await startRunnerServer(runner, { port: 0 });
  try {
    const jobs = Array.from({ length: CALLS }, () => randomUUID());
    const text = (i: number) => `${i} ${"x".repeat(90)}`;
    const outcomes = await Promise.all(
      jobs.map((id) => {
        // Its own transport: its own HTTP/2 connection, as every agent of a fleet.
        const client = createClient(Runner, createGrpcTransport({ baseUrl: server.url }));
        const items: LogItem[] = Array.from({ length: LINES }, (_, i) => line(id, text(i)));
        items.push(end(id));
        return send(client, items);
      }),
    );
    const stored = await Promise.all(jobs.map(async (id) => (await store.logs.read(id)).map((l) => l.line)));
    return {
      outcomes,
      stored,
      peak: backlog.peak,
      held: backlog.held,
      results: queue.results.length,
      expected: Array.from({ length: LINES }, (_, i) => text(i)),
    };
  } finally {
    store.stop();
    await server.close();
    await runner.close();
  }
}

describe("runner store backlog: a server-wide budget for entries queued for the store", () => {
  it(`${CALLS} calls into a store that lags: queued bytes stay within the budget plus a chunk per call, nothing lost, every call completes (none cut idle while held back)`, async () => {
    const run = await fleetRun(BUDGET);
    for (const outcome of run.outcomes) expect(outcome).toMatchObject({ ok: true, committed: String(LINES + 1) });
    for (const lines of run.stored) expect(lines).toEqual(run.expected);
    expect(run.results).toBe(CALLS);
    expect(run.held).toBe(0);
    expect(run.peak).toBeGreaterThan(BUDGET);
    expect(run.peak).toBeLessThanOrEqual(BOUND);
  }, 120_000);

  it("the same run with a budget too large to matter queues far past that bound (what the budget prevents)", async () => {
    const run = await fleetRun(1024 * 1024 * 1024);
    for (const outcome of run.outcomes) expect(outcome).toMatchObject({ ok: true, committed: String(LINES + 1) });
    expect(run.held).toBe(0);
    expect(run.peak).toBeGreaterThan(2 * BOUND);
  }, 120_000);

  it("while the backlog holds calls back, a call that has not passed authentication (made-up token, no item) still ends at the idle limit", async () => {
    const secret = "backlog-idle-secret-0123456789abcdef";
    const store = gatedStore();
    const { backlog, server, sessions, stop } = await backlogServer(store, secret, {
      queuedBytes: 64 * 1024,
      idleMs: 1000,
    });
    sessions.push(connect(server.url), connect(server.url));
    try {
      // A job's call fills the budget behind the closed store: its reader is paused (held back).
      const held = await holdLoudCall(sessions[0]!, secret, store, backlog);
      // A caller with a made-up (well-formed) token that sends nothing: the backlog holds
      // nothing of it, so its wait is its own silence and the idle limit applies.
      const stranger = openCall(sessions[1]!, "grpc", "made-up-token");
      const status = await Promise.race([
        stranger.status,
        new Promise<null>((resolve) => setTimeout(resolve, 15_000, null)),
      ]);
      expect(status).toMatchObject({ code: 4 });
      expect(status!.committed).toBeUndefined();
      expect(backlog.waiting).toBeGreaterThan(0);
      // The held call is not idle: once the store drains it completes.
      await held.finish();
    } finally {
      await stop();
    }
  }, 60_000);

  it("while the backlog holds one job's call back, another job's call that passed authentication before and then went silent still ends at the idle limit (the hold is per call)", async () => {
    const secret = "backlog-silent-secret-0123456789abcd";
    const store = gatedStore(false);
    const { backlog, server, sessions, stop } = await backlogServer(store, secret, {
      queuedBytes: 64 * 1024,
      idleMs: 3000,
    });
    sessions.push(connect(server.url), connect(server.url));
    try {
      // A job's call authenticates and stores a line while the store keeps up, then sends nothing.
      const quietId = randomUUID();
      const quiet = openCall(sessions[1]!, "grpc", mintJobToken(secret, quietId));
      quiet.stream.write(frame(line(quietId, "one line, then silence")));
      await until(async () => (await store.logs.get(quietId))?.committed === 1, "the quiet job's line stored");
      // The store stalls and another job's call fills the budget: its reader is held back.
      store.close();
      const held = await holdLoudCall(sessions[0]!, secret, store, backlog);
      // The quiet call is not held (nothing of it is waiting to be read): its silence is its own.
      const status = await Promise.race([
        quiet.status,
        new Promise<null>((resolve) => setTimeout(resolve, 20_000, null)),
      ]);
      expect(status).toMatchObject({ code: 4, committed: "1" });
      expect(backlog.waiting).toBeGreaterThan(0);
      await held.finish();
    } finally {
      await stop();
    }
  }, 60_000);

  it("one job replacing its own calls behind a stalled store cannot fill the budget: each replaced call answers ABORTED at once and lets go of what it read", async () => {
    const secret = "backlog-replace-secret-0123456789abc";
    const store = gatedStore();
    const { backlog, server, sessions, stop } = await backlogServer(store, secret);
    try {
      const id = randomUUID();
      const token = mintJobToken(secret, id);
      // ~1.1 MB a call: past the 1 MiB a reader queues for a service that does not take.
      const body = Buffer.concat(Array.from({ length: 11_000 }, (_, i) => frame(line(id, `${i} ${"y".repeat(90)}`))));
      let previous: ReturnType<typeof openCall> | null = null;
      for (let k = 0; k < 6; k++) {
        const session = connect(server.url);
        sessions.push(session);
        const call = openCall(session, "grpc", token);
        call.stream.on("data", () => undefined);
        call.stream.write(body);
        // Read on past its first message: the call passed authentication and took the job.
        await until(() => call.stream.writableLength < body.length - 256 * 1024, `call ${k} read on`);
        if (previous !== null) {
          // The newer call took the job: the older one answers now, though the store is stalled.
          const status = await Promise.race([
            previous.status,
            new Promise<null>((resolve) => setTimeout(resolve, 15_000, null)),
          ]);
          expect(status, `call ${k}`).toMatchObject({ code: 10 });
        }
        previous = call;
      }
      await until(() => backlog.held > 512 * 1024, "the last call's messages read");
      // The first call's entries queued for the stalled store (~1.8 MB, bytes + 64 each) and
      // the last call's read queue (~1 MiB) at most: not another ~1 MiB per replaced call
      // (what the old code kept, waiting for the job's lock).
      expect(backlog.held).toBeLessThan(4 * 1024 * 1024);
      store.open();
      previous!.stream.end(frame(end(id)));
      expect(await previous!.status).toMatchObject({ code: 0, committed: "11001" });
      await until(() => backlog.held === 0, "the backlog drained");
    } finally {
      await stop();
    }
  }, 90_000);
});
