/**
 * The server-wide bound on widened HTTP/2 windows (runner/server/flow-window.ts), through real sockets:
 * a server whose store backlog budget (limits.queuedBytes) is 2 MiB widens at most two
 * connections at once, gives a slot back when a widened connection closes, and widens none
 * while the backlog is over its budget. What the server announced is read from the
 * client's side (its remote settings).
 */
import { randomUUID } from "node:crypto";
import * as http2 from "node:http2";
import { describe, expect, it } from "vitest";
import { createRunnerService, startRunnerServer } from "../../../src/runner/index.js";
import { createMemoryLogStore, createMemoryQueue } from "../../../src/adapters/memory/index.js";
import type { JobLogStore } from "../../../src/runner/ports.js";
import { BUSY_CALL_BYTES, BUSY_WINDOW_BYTES } from "../../../src/runner/server/flow-window.js";
import { backlogOf } from "../../../src/runner/service/store-backlog.js";
import { line, until } from "../../fixtures/runner-service.js";
import { connect, frame, PATH } from "../../fixtures/runner-raw-calls.js";

/** Two widened connections at most (2 MiB ÷ 1 MiB). */
const BUDGET = 2 * 1024 * 1024;
const NARROW = 65_535;

/** One connection with one open StreamLogs call (no token: the service accepts any caller). */
interface Conn {
  session: http2.ClientHttp2Session;
  call: http2.ClientHttp2Stream;
  id: string;
  /** SETTINGS_INITIAL_WINDOW_SIZE the server announced, in order. */
  windows: number[];
}

function open(url: string): Conn {
  const session = connect(url);
  const windows: number[] = [];
  session.on("remoteSettings", (s) => windows.push(s.initialWindowSize ?? NARROW));
  const call = session.request({
    ":method": "POST",
    ":path": PATH,
    "content-type": "application/grpc",
    te: "trailers",
  });
  call.on("error", () => undefined);
  call.resume();
  return { session, call, id: randomUUID(), windows };
}

const windowOf = (c: Conn) => c.windows[c.windows.length - 1] ?? NARROW;

/** Lines `from`..`from + count - 1` of `c`'s job, `size` bytes of text each, as frames. */
function lines(c: Conn, from: number, count: number, size = 100): Buffer {
  return Buffer.concat(Array.from({ length: count }, (_, i) => frame(line(c.id, `${from + i} `.padEnd(size, "x")))));
}

/** Writes `bytes` and resolves once they went out (not waiting for the server to read them). */
function write(c: Conn, bytes: Buffer): Promise<void> {
  return new Promise((resolve, reject) => c.call.write(bytes, (error) => (error ? reject(error) : resolve())));
}

/** A ping round trip: frames the server sent before answering it have arrived. */
function ping(c: Conn): Promise<void> {
  return new Promise((resolve, reject) => c.session.ping((error) => (error ? reject(error) : resolve())));
}

/** A memory store whose appends wait while `held` is true. */
function holdableStore(): { logs: JobLogStore; hold(on: boolean): void } {
  const inner = createMemoryLogStore();
  let held = false;
  const logs: JobLogStore = Object.create(inner) as JobLogStore;
  logs.append = async (id, at, entries, now) => {
    await until(() => !held, "the store released");
    return inner.append(id, at, entries, now);
  };
  return { logs, hold: (on) => (held = on) };
}

async function stored(logs: JobLogStore, c: Conn): Promise<number> {
  return (await logs.read(c.id)).length;
}

/** Sends `count` lines from `from` and waits until the store has them all (the server read every byte). */
async function sendStored(logs: JobLogStore, c: Conn, from: number, count: number): Promise<void> {
  await write(c, lines(c, from, count));
  await until(async () => (await stored(logs, c)) === from + count, "the lines stored");
}

describe("runner server: a server-wide bound on widened windows", () => {
  it("with room for two, three busy connections: two widen, the third keeps 64 KiB until a widened one closes", async () => {
    const store = holdableStore();
    const runner = createRunnerService(createMemoryQueue(), { logs: store.logs, limits: { queuedBytes: BUDGET } });
    const server = await startRunnerServer(runner, { port: 0 });
    const conns = [open(server.url), open(server.url), open(server.url)];
    const [a, b, c] = conns as [Conn, Conn, Conn];
    try {
      const busy = Math.ceil(BUSY_CALL_BYTES / 100) + 500; // > 512 KiB of frames
      for (const widened of [a, b]) {
        await sendStored(store.logs, widened, 0, busy);
        await until(() => windowOf(widened) === BUSY_WINDOW_BYTES, "a busy connection widened");
      }
      await sendStored(store.logs, c, 0, busy);
      await ping(c);
      expect(c.windows.length).toBeGreaterThan(0);
      expect(c.windows.every((w) => w === NARROW)).toBe(true);

      // A widened connection goes: its slot is the third's on its next bytes.
      a.session.destroy();
      let sent = busy;
      await until(async () => {
        await sendStored(store.logs, c, sent, 50);
        sent += 50;
        await ping(c);
        return windowOf(c) === BUSY_WINDOW_BYTES;
      }, "the third connection widened");
      expect(windowOf(b)).toBe(BUSY_WINDOW_BYTES);
    } finally {
      for (const conn of conns) conn.session.destroy();
      await server.close();
      await runner.close();
    }
  }, 90_000);

  it("no connection widens while the store backlog is over its budget; it does once the store has drained", async () => {
    const store = holdableStore();
    const runner = createRunnerService(createMemoryQueue(), {
      logs: store.logs,
      limits: { queuedBytes: BUDGET, idleMs: 60_000 },
    });
    const backlog = backlogOf(runner)!;
    const server = await startRunnerServer(runner, { port: 0 });
    const conns = [open(server.url), open(server.url)];
    const [loud, late] = conns as [Conn, Conn];
    try {
      // The loud call widens (one slot of two taken, one free).
      await sendStored(store.logs, loud, 0, Math.ceil(BUSY_CALL_BYTES / 100) + 500);
      await until(() => windowOf(loud) === BUSY_WINDOW_BYTES, "the loud connection widened");

      // The late call sends one byte short of the widening threshold, all read by the server.
      const body = lines(late, 0, Math.ceil(BUSY_CALL_BYTES / 100) + 2000);
      await write(late, body.subarray(0, BUSY_CALL_BYTES - 1));
      await ping(late);
      await until(
        async () => (await stored(store.logs, late)) > 0 && backlog.held === 0,
        "the late call's lines stored",
      );

      // The store stops; the loud call fills the backlog past its budget and is paused.
      store.hold(true);
      void write(loud, lines(loud, 0, 3000, 1000)).catch(() => undefined);
      await until(() => backlog.over && backlog.waiting >= 1, "the backlog over its budget");

      // The late call's next bytes cross the threshold while the backlog is over: no widening.
      void write(late, body.subarray(BUSY_CALL_BYTES - 1)).catch(() => undefined);
      await until(() => backlog.waiting >= 2, "the late call paused behind the backlog");
      await ping(late);
      expect(backlog.over).toBe(true);
      expect(late.windows.every((w) => w === NARROW)).toBe(true);

      // The store drains: the late call reads on, and widens.
      store.hold(false);
      await until(() => windowOf(late) === BUSY_WINDOW_BYTES, "the late connection widened after the drain");
    } finally {
      store.hold(false);
      for (const conn of conns) conn.session.destroy();
      await server.close();
      await runner.close();
    }
  }, 90_000);
});
