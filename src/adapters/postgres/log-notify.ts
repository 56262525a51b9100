/**
 * Job-log change events between replicas sharing one PostgreSQL: after an append or a finish commits, the
 * replica sends `NOTIFY` (coalesced: one statement per event-loop turn for every job that changed in it) on
 * its own connection, which also `LISTEN`s for all of the replica's followers: one connection per replica,
 * none per follower.
 * Why: docs/decisions/runner-throughput.md, "log-notify.ts: one notifying connection per replica".
 */
import type { Client } from "pg";
import type { JobLogEvent } from "../../runner/ports.js";
import { createListenConnection } from "./listen-connection.js";
import { isConnectionFailure } from "./schema.js";

/** One replica's end of the notification channel. */
interface PostgresLogNotifier {
  /** Queues an event; sent with every other queued one at the end of this turn. O(1). */
  publish(requestId: string, storedLines: number, ended: boolean): void;
  /** Subscribes; the first subscriber makes the connection LISTEN (kept until close). */
  watch(listener: (event: JobLogEvent) => void): () => void;
  /**
   * Sends what is pending (waiting up to CLOSE_FLUSH_MS for it), then stops listening and
   * sending; calling it twice is harmless.
   */
  close(): Promise<void>;
}

/** The channel of a schema: PostgreSQL channel names are identifiers of at most 63 bytes. */
export function channelOf(schemaName: string): string {
  return `rdlog_${schemaName}`.slice(0, 63);
}

/** A notification's payload: `<storedLines> <0|1> <request id>`. */
export function encodeLogEvent(requestId: string, storedLines: number, ended: boolean): string {
  return `${storedLines} ${ended ? 1 : 0} ${requestId}`;
}

/**
 * How long close() waits for the pending NOTIFYs (and one already in flight) to be sent
 * before it ends the connection anyway: a shutdown is never held up by a stuck server,
 * and a follower that misses the last event still sees the lines at its next poll.
 */
const CLOSE_FLUSH_MS = 5_000;

const PAYLOAD = /^(\d{1,15}) ([01]) ([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$/;

/**
 * Parses a payload; anything else on the channel (another program's NOTIFY) is null. O(payload), bounded by the regex.
 */
export function decodeLogEvent(payload: string): { requestId: string; storedLines: number; ended: boolean } | null {
  if (payload.length > 80) return null;
  const m = PAYLOAD.exec(payload);
  if (!m) return null;
  return { requestId: m[3]!, storedLines: Number(m[1]), ended: m[2] === "1" };
}

/**
 * Creates the notifier of one log store. It owns ONE connection of its own (made from the
 * pool's settings, not taken from the pool): it sends the NOTIFYs and, once someone
 * watches, LISTENs, so the append path's pool and its round trips are untouched.
 *
 * @example
 * const notifier = createPostgresLogNotifier(() => new pg.Client(pool.options), "runner_depot");
 * const stop = notifier.watch((event) => console.log(event));
 * notifier.publish(requestId, 120, false);
 */
export function createPostgresLogNotifier(
  connect: () => Client,
  schemaName: string,
  options: { onError?: (error: unknown) => void; reconnectMaxMs?: number } = {},
): PostgresLogNotifier {
  const channel = channelOf(schemaName);
  const report = (error: unknown) => {
    try {
      options.onError?.(error);
    } catch {
      // A broken hook must not break the store.
    }
  };
  // Pending events, one per job (the latest wins): memory O(jobs that changed meanwhile).
  let pending = new Map<string, { lines: number; ended: boolean }>();
  let scheduled = false;
  /** The statement in flight, if any: one at a time on the connection. */
  let sending: Promise<void> | null = null;
  const listeners = new Set<(event: JobLogEvent) => void>();
  let closed = false;

  function emit(event: JobLogEvent) {
    for (const listener of listeners) {
      try {
        listener(event);
      } catch (error) {
        report(error);
      }
    }
  }

  const connection = createListenConnection(connect, channel, {
    onPayload(payload) {
      const event = decodeLogEvent(payload);
      if (event) emit(event);
    },
    onConnected() {
      emit(null);
      if (pending.size > 0) schedule();
    },
    // Events sent while we were away are gone: everyone looks again.
    onLost: () => emit(null),
    // The connection sends from the start; it LISTENs only once someone watches.
    wantsListen: () => listeners.size > 0,
    onError: report,
    reconnectMaxMs: options.reconnectMaxMs,
  });

  /** Sends what is pending in one statement; one in flight at a time, the rest waits for the next. */
  async function flush(): Promise<void> {
    scheduled = false;
    if (sending || closed || pending.size === 0) return;
    const client = connection.client();
    if (!client) {
      void connection.open();
      return;
    }
    await send(client);
    if (pending.size > 0) schedule();
  }

  /** Sends every pending event in one statement: O(pending) payloads, one round trip. */
  async function send(client: Client): Promise<void> {
    const payloads: string[] = [];
    for (const [id, e] of pending) payloads.push(encodeLogEvent(id, e.lines, e.ended));
    pending = new Map();
    const statement = (async () => {
      try {
        await connection.query(client, `SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p`, [channel, payloads]);
      } catch (error) {
        // Followers elsewhere fall back to their poll: late, not lost. A timed-out or broken
        // connection is dropped and reopened, not used again.
        report(error);
        if (isConnectionFailure(error)) connection.lost(client, error);
      }
    })();
    sending = statement;
    await statement;
    if (sending === statement) sending = null;
  }

  /**
   * close()'s last send: waits for the statement in flight, then sends what was published
   * meanwhile, so the last event before close reaches the other replicas. At most
   * CLOSE_FLUSH_MS: after it the connection is ended under a statement still running.
   */
  async function sendRemaining(client: Client): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<void>((resolve) => {
      timer = setTimeout(resolve, CLOSE_FLUSH_MS);
    });
    const drained = (async () => {
      await sending;
      if (pending.size > 0) await send(client);
    })();
    try {
      await Promise.race([drained, timeout]);
    } finally {
      clearTimeout(timer);
    }
  }

  function schedule() {
    if (scheduled) return;
    scheduled = true;
    setImmediate(() => void flush());
  }

  return {
    publish(requestId, storedLines, ended) {
      if (closed) return;
      const prior = pending.get(requestId);
      pending.set(requestId, {
        lines: Math.max(storedLines, prior?.lines ?? 0),
        ended: ended || (prior?.ended ?? false),
      });
      schedule();
    },
    watch(listener) {
      listeners.add(listener);
      connection.listen();
      // LISTEN stays once issued (until close): a replica that follows once usually
      // follows again, and an idle LISTEN costs nothing.
      return () => {
        listeners.delete(listener);
      };
    },
    async close() {
      if (closed) return;
      closed = true;
      listeners.clear();
      // Whatever is pending goes out before the connection does (publish() takes no more:
      // `closed` is set). The connection waits for a connect in flight, so an event
      // published just before close on a fresh notifier goes out too; and one whose send
      // has not run yet (close() in the same turn) starts that connect here.
      if (pending.size > 0 && !connection.client()) void connection.open();
      await connection.close(sendRemaining);
    },
  };
}
