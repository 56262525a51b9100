/**
 * One PostgreSQL connection that LISTENs on one channel, shared by the log store's notifier
 * (log-notify.ts) and the records store's watch (record-notify.ts). It is made from the
 * pool's settings, not taken from the pool, so LISTEN never pins a pooled connection.
 * A lost connection tells the owner (watchers must look again: notifications sent while
 * it was away are gone), is reopened with doubling backoff, and tells the owner again once
 * it is back, so no notification is missed without a "look again" between.
 */
import type { Client } from "pg";

/** What the owner of a listening connection is told. */
interface ListenConnectionHooks {
  /** A notification on the channel (the owner bounds and parses the payload). */
  onPayload(payload: string): void;
  /** The connection is up (and listening if `wantsListen()`): watchers look again. */
  onConnected(): void;
  /** The connection was lost: watchers look again; a reconnect is already scheduled. */
  onLost(): void;
  /** Whether LISTEN is wanted now; checked when the connection comes up and by `listen()`. Default: always. */
  wantsListen?(): boolean;
  /** A connection or LISTEN error (the connection is retried regardless). */
  onError?(error: unknown): void;
  /** The longest wait between reconnect attempts; default 5 s. */
  reconnectMaxMs?: number;
  /**
   * How often a connected client is pinged (`SELECT 1`, or its LISTEN again), and how long it has to answer before
   * it counts as lost; default 15 s and 10 s. A LISTEN connection only ever reads: without
   * this, a link that drops bytes would leave it silent, and its watchers unwarned, for good.
   */
  pingMs?: { every?: number; timeout?: number };
}

/** The owner's handle on the connection. */
interface ListenConnection {
  /** The connected client (for the owner's own queries, e.g. NOTIFY, through `query`), or null while away. */
  client(): Client | null;
  /**
   * Runs a statement on `c` after every other statement this connection sent on it: pings,
   * LISTEN and the owner's own share one client, and pg deprecates overlapping queries.
   */
  query(c: Client, text: string, values?: unknown[]): Promise<unknown>;
  /** Connects (and LISTENs) unless connected or connecting; never rejects. */
  open(): Promise<void>;
  /** Drops `c` as lost (its owner saw it time out) and reconnects; nothing if it is no longer current. */
  lost(c: Client, error: unknown): void;
  /** Makes a connected client LISTEN now (once per connection), or connects. */
  listen(): void;
  /**
   * Stops retrying, waits for a connect in flight, runs `beforeEnd` on a live client, then ends it. Twice is harmless.
   */
  close(beforeEnd?: (client: Client) => Promise<void>): Promise<void>;
}

/**
 * Creates a listening connection on `channel`; nothing connects until `open()` or `listen()`.
 *
 * @example
 * const conn = createListenConnection(() => new pg.Client(pool.options), "rdrec_runner_depot", {
 *   onPayload: (payload) => console.log(payload),
 *   onConnected: () => console.log("look again"),
 *   onLost: () => console.log("look again"),
 * });
 * await conn.open();
 * await conn.close();
 */
export function createListenConnection(
  connect: () => Client,
  channel: string,
  hooks: ListenConnectionHooks,
): ListenConnection {
  const quoted = `"${channel.replace(/"/g, '""')}"`;
  const wantsListen = () => hooks.wantsListen?.() ?? true;
  let client: Client | null = null;
  let listening = false;
  let connecting: Promise<void> | null = null;
  let retryTimer: NodeJS.Timeout | null = null;
  let delay = 100;
  let closed = false;
  let pingTimer: NodeJS.Timeout | null = null;
  const pingEvery = hooks.pingMs?.every ?? 15_000;
  const pingTimeout = hooks.pingMs?.timeout ?? 10_000;

  // Each client's last statement: the next one starts after it settles. O(1) a statement.
  const tails = new WeakMap<Client, Promise<unknown>>();
  function query(c: Client, text: string, values?: unknown[]): Promise<unknown> {
    const run = (tails.get(c) ?? Promise.resolve()).then(() => c.query(text, values));
    tails.set(
      c,
      run.catch(() => undefined),
    );
    return run;
  }

  function report(error: unknown) {
    try {
      hooks.onError?.(error);
    } catch {
      // A broken hook must not break the connection.
    }
  }

  function onNotification(message: { channel: string; payload?: string }) {
    if (message.channel !== channel || message.payload === undefined) return;
    hooks.onPayload(message.payload);
  }

  /** Ends a client without waiting; its late errors are swallowed, they no longer concern us. */
  function discard(c: Client) {
    c.removeListener("notification", onNotification);
    c.removeListener("error", onLost);
    c.on("error", () => {});
    void c.end().catch(() => {});
  }

  function drop() {
    const old = client;
    client = null;
    listening = false;
    if (pingTimer) clearTimeout(pingTimer);
    pingTimer = null;
    if (old) discard(old);
  }

  /** Pings `c` every pingEvery; no answer within pingTimeout (or an error) loses it. */
  function schedulePing(c: Client) {
    if (pingTimer) clearTimeout(pingTimer);
    pingTimer = setTimeout(() => {
      pingTimer = null;
      if (client !== c || closed) return;
      let answered = false;
      const deadline = setTimeout(() => {
        if (!answered && client === c)
          onLost(new Error(`PostgreSQL LISTEN connection: no answer in ${pingTimeout} ms`));
      }, pingTimeout);
      deadline.unref?.();
      // LISTEN again when listening: a no-op for the server, and the session's last query
      // (pg_stat_activity) stays the LISTEN that monitoring looks for.
      query(c, listening ? `LISTEN ${quoted}` : "SELECT 1").then(
        () => {
          answered = true;
          clearTimeout(deadline);
          if (client === c) schedulePing(c);
        },
        (error: unknown) => {
          answered = true;
          clearTimeout(deadline);
          if (client === c) onLost(error);
        },
      );
    }, pingEvery);
    pingTimer.unref?.();
  }

  function onLost(error: unknown) {
    report(error);
    drop();
    hooks.onLost();
    retryLater();
  }

  function retryLater() {
    if (retryTimer || closed) return;
    retryTimer = setTimeout(() => {
      retryTimer = null;
      void open();
    }, delay);
    retryTimer.unref?.();
    delay = Math.min(delay * 2, hooks.reconnectMaxMs ?? 5_000);
  }

  async function listenOn(c: Client): Promise<void> {
    if (listening || !wantsListen()) return;
    listening = true;
    await query(c, `LISTEN ${quoted}`);
  }

  function open(): Promise<void> {
    if (client || closed) return Promise.resolve();
    connecting ??= (async () => {
      const c = connect();
      c.on("error", onLost);
      c.on("notification", onNotification);
      try {
        await c.connect();
        client = c;
        // Closed meanwhile: close() awaits this connect, runs its beforeEnd on the client
        // (e.g. the last NOTIFYs) and ends it.
        if (closed) return;
        await listenOn(c);
        schedulePing(c);
        delay = 100;
        if (!closed) hooks.onConnected();
      } catch (error) {
        report(error);
        if (client === c) drop();
        else discard(c);
        retryLater();
      } finally {
        connecting = null;
      }
    })();
    return connecting;
  }

  return {
    client: () => client,
    query,
    open,
    lost(c, error) {
      if (client === c) onLost(error);
    },
    listen() {
      if (client) void listenOn(client).catch(onLost);
      else void open();
    },
    async close(beforeEnd) {
      if (closed) return;
      closed = true;
      if (retryTimer) clearTimeout(retryTimer);
      await connecting;
      try {
        if (client && beforeEnd) await beforeEnd(client);
      } finally {
        drop();
      }
    },
  };
}
