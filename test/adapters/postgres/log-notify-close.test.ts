/**
 * The PostgreSQL log store's change events at shutdown: close() sends the NOTIFYs still
 * pending (an append's event is sent at the end of its event-loop turn, so an append
 * followed at once by close() leaves one pending) before it ends the connection. Another
 * store's watcher must hear the last event. PostgreSQL delivers notifications of different
 * transactions in commit order, so a marker NOTIFY sent after close() returned arrives
 * after any event close() sent: once the watcher has the marker, an event it lacks was
 * never sent.
 */
import { randomUUID } from "node:crypto";
import { describe, expect, it } from "vitest";
import { createPostgresLogStore } from "../../../src/adapters/postgres/index.js";
import { channelOf, encodeLogEvent } from "../../../src/adapters/postgres/log-notify.js";
import type { JobLogEvent, JobLogStore } from "../../../src/runner/ports.js";
import { logEntry } from "../../../src/testing/index.js";
import { createTestSchema, needs } from "../../fixtures/backends.js";

needs("postgres");

/** Generous: a loaded CI machine delivers a notification within milliseconds, this allows 30 s. */
const HEAR_WITHIN_MS = 30_000;

/** The events a store's watch() reports, and a wait for one of them. */
function recordEvents() {
  const events: JobLogEvent[] = [];
  const waiters = new Set<() => void>();
  return {
    events,
    listener(event: JobLogEvent) {
      events.push(event);
      for (const wake of waiters) wake();
    },
    /** Resolves once an event matching `wanted` was heard; rejects, saying what, after HEAR_WITHIN_MS. */
    until(wanted: (event: JobLogEvent) => boolean, what: string): Promise<void> {
      return new Promise((resolve, reject) => {
        const check = () => {
          if (!events.some(wanted)) return;
          cleanup();
          resolve();
        };
        const timer = setTimeout(() => {
          cleanup();
          reject(new Error(`not heard within ${HEAR_WITHIN_MS} ms: ${what}; heard ${JSON.stringify(events)}`));
        }, HEAR_WITHIN_MS);
        const cleanup = () => {
          clearTimeout(timer);
          waiters.delete(check);
        };
        waiters.add(check);
        check();
      });
    },
  };
}

const about = (id: string, storedLines: number) => (e: JobLogEvent) =>
  e !== null && e.requestId === id && e.storedLines === storedLines;

/**
 * Runs `body` on a fresh schema that store B watches (B listens before `body` starts).
 * `writer()` makes another store on the schema (closed after, again: close twice is
 * harmless); `allSentHeard()` sends a marker NOTIFY and waits until B heard it, so B has
 * heard every event sent before the call.
 */
async function withWatcher(
  body: (t: {
    heard: ReturnType<typeof recordEvents>;
    writer: () => JobLogStore;
    allSentHeard: () => Promise<void>;
  }) => Promise<void>,
): Promise<void> {
  const db = await createTestSchema();
  const stores: JobLogStore[] = [];
  const writer = () => {
    const store = createPostgresLogStore({ pool: db.pool, schema: db.schema });
    stores.push(store);
    return store;
  };
  const heard = recordEvents();
  const stop = writer().watch!(heard.listener);
  const allSentHeard = async () => {
    const marker = randomUUID();
    await db.pool.query(`SELECT pg_notify($1, $2)`, [channelOf(db.schema), encodeLogEvent(marker, 1, false)]);
    await heard.until(about(marker, 1), "the marker sent after close()");
  };
  try {
    // B's first `null` comes once its connection LISTENs.
    await heard.until((e) => e === null, "B listening");
    await body({ heard, writer, allSentHeard });
  } finally {
    stop();
    for (const store of stores) await store.close?.();
    await db.drop();
  }
}

describe("PostgreSQL log store: close() sends its pending change events", () => {
  it("an append made just before close() reaches another store's watcher", () =>
    withWatcher(async ({ heard, writer, allSentHeard }) => {
      const a = writer();
      const id = randomUUID();
      await a.open(id);
      await a.append(id, 0, [logEntry("line 0")]);
      // A's connection is up once B heard its first event.
      await heard.until(about(id, 1), "the first append's event");
      await a.append(id, 1, [logEntry("line 1")]);
      await a.close?.();
      await allSentHeard();
      expect(heard.events.filter(about(id, 2))).toHaveLength(1);
    }));

  it("an event published while the notifier's first connection is being made goes out on it at close()", () =>
    withWatcher(async ({ heard, writer, allSentHeard }) => {
      const c = writer();
      const id = randomUUID();
      await c.open(id);
      await c.append(id, 0, [logEntry("line 0")]);
      // The append's send runs at the end of this turn and, finding no connection, starts
      // one; close() comes while that connect is in flight.
      await new Promise((resolve) => setImmediate(resolve));
      await c.close?.();
      await allSentHeard();
      expect(heard.events.filter(about(id, 1))).toHaveLength(1);
    }));

  it("an event published on a notifier that never connected, with close() in the same turn, goes out at close()", () =>
    withWatcher(async ({ heard, writer, allSentHeard }) => {
      const d = writer();
      const id = randomUUID();
      await d.open(id);
      // close() before the turn ends: the append's send has not run, so no connect was started
      // (a short-lived writer that appends and exits).
      await d.append(id, 0, [logEntry("line 0")]);
      await d.close?.();
      await allSentHeard();
      expect(heard.events.filter(about(id, 1))).toHaveLength(1);
    }));
});
