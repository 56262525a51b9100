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
import { createPostgresLogStore } from "../src/adapters/postgres/index.js";
import { channelOf, encodeLogEvent } from "../src/adapters/postgres/log-notify.js";
import type { JobLogEvent } from "../src/runner/ports.js";
import { logEntry } from "../src/testing/index.js";
import { createTestSchema, needs } from "./backends-fixtures.js";

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

const about = (id: string, storedLines: number) => (e: JobLogEvent) => e !== null && e.requestId === id && e.storedLines === storedLines;

describe("PostgreSQL log store: close() sends its pending change events", () => {
  it("an append made just before close() reaches another store's watcher", async () => {
    const db = await createTestSchema();
    const a = createPostgresLogStore({ pool: db.pool, schema: db.schema });
    const b = createPostgresLogStore({ pool: db.pool, schema: db.schema });
    const heard = recordEvents();
    const stop = b.watch!(heard.listener);
    try {
      // B's first `null` comes once its connection LISTENs.
      await heard.until((e) => e === null, "B listening");
      const id = randomUUID();
      await a.open(id);
      await a.append(id, 0, [logEntry("line 0")]);
      // A's connection is up once B heard its first event.
      await heard.until(about(id, 1), "the first append's event");
      await a.append(id, 1, [logEntry("line 1")]);
      await a.close?.();
      const marker = randomUUID();
      await db.pool.query(`SELECT pg_notify($1, $2)`, [channelOf(db.schema), encodeLogEvent(marker, 1, false)]);
      await heard.until(about(marker, 1), "the marker sent after close()");
      expect(heard.events.filter(about(id, 2))).toHaveLength(1);
    } finally {
      stop();
      await a.close?.();
      await b.close?.();
      await db.drop();
    }
  });

  it("an event published while the notifier's first connection is being made goes out on it at close()", async () => {
    const db = await createTestSchema();
    const b = createPostgresLogStore({ pool: db.pool, schema: db.schema });
    const heard = recordEvents();
    const stop = b.watch!(heard.listener);
    const c = createPostgresLogStore({ pool: db.pool, schema: db.schema });
    try {
      await heard.until((e) => e === null, "B listening");
      const id = randomUUID();
      await c.open(id);
      await c.append(id, 0, [logEntry("line 0")]);
      // The append's send runs at the end of this turn and, finding no connection, starts
      // one; close() comes while that connect is in flight.
      await new Promise((resolve) => setImmediate(resolve));
      await c.close?.();
      const marker = randomUUID();
      await db.pool.query(`SELECT pg_notify($1, $2)`, [channelOf(db.schema), encodeLogEvent(marker, 1, false)]);
      await heard.until(about(marker, 1), "the marker sent after close()");
      expect(heard.events.filter(about(id, 1))).toHaveLength(1);
    } finally {
      stop();
      await c.close?.();
      await b.close?.();
      await db.drop();
    }
  });
});
