/**
 * The runner client's HTTP/2 connection: one session reused by every call, replaced when
 * it closes or the server sends GOAWAY, bounded in the time it may take to connect, and
 * pinged while a call is open so a dead peer is noticed without waiting for TCP.
 */
import http2 from "node:http2";
import { RunnerDepotError } from "../../errors.js";
import type { RunnerClientTlsOptions } from "./types.js";

/** The session of one client. */
export interface ClientSessions {
  /** The open session, or a new connection. */
  get(): http2.ClientHttp2Session;
  /** Destroys the current session (starting a call on it threw), so the next call connects anew. */
  discard(): void;
  /** Closes the current session; calls open on it may finish. */
  closeCurrent(): void;
  /** Pings `s` every keepaliveMs while `callOpen()`; an unanswered ping destroys it. */
  startKeepalive(s: http2.ClientHttp2Session, callOpen: () => boolean): void;
  /** Stops the pings (the call closed). */
  stopKeepalive(): void;
  /** Forgets the current session and closes it, waiting for its close (at most 1 s). */
  close(): Promise<void>;
}

/** Connection settings of {@link createClientSessions}. */
interface ClientSessionSettings {
  tls?: RunnerClientTlsOptions;
  connectTimeoutMs: number;
  keepaliveMs: number;
}

/**
 * The sessions of one client to `url`'s origin.
 *
 * @example
 * const sessions = createClientSessions(parseEndpoint("http://10.0.0.1:50051"), {
 *   connectTimeoutMs: 10_000,
 *   keepaliveMs: 20_000,
 * });
 * const stream = sessions.get().request({ ":method": "POST", ":path": "/runner.v1.Runner/StreamLogs" });
 */
export function createClientSessions(url: URL, settings: ClientSessionSettings): ClientSessions {
  const { connectTimeoutMs, keepaliveMs } = settings;
  let session: http2.ClientHttp2Session | null = null;
  let keepaliveTimer: NodeJS.Timeout | null = null;

  function get(): http2.ClientHttp2Session {
    if (session !== null && !session.closed && !session.destroyed) return session;
    const s = http2.connect(url.origin, {
      ...(url.protocol === "https:" ? settings.tls : {}),
      settings: { enablePush: false },
    });
    // Errors surface on the call's stream; an unhandled session 'error' would crash the agent.
    s.on("error", () => {});
    s.on("close", () => {
      if (session === s) session = null;
    });
    s.on("goaway", () => {
      // The server is going away: new calls use a new connection; open ones may finish.
      if (session === s) session = null;
      if (!s.closed) s.close();
    });
    const t = setTimeout(() => {
      if (!s.connecting) return;
      s.destroy(new Error(`connect timeout after ${connectTimeoutMs} ms`));
    }, connectTimeoutMs);
    t.unref();
    s.once("connect", () => clearTimeout(t));
    session = s;
    return s;
  }

  function startKeepalive(s: http2.ClientHttp2Session, callOpen: () => boolean): void {
    if (keepaliveTimer !== null) return;
    keepaliveTimer = setInterval(() => {
      if (!callOpen() || s.destroyed) return;
      let answered = false;
      const timeout = setTimeout(() => {
        if (!answered) s.destroy(new Error("keep-alive ping unanswered"));
      }, keepaliveMs);
      timeout.unref();
      try {
        s.ping((err) => {
          answered = true;
          clearTimeout(timeout);
          if (err !== null && !s.destroyed) s.destroy(err);
        });
      } catch (e) {
        // Too many pings outstanding or the session is going away: treat it as dead.
        clearTimeout(timeout);
        if (!s.destroyed) s.destroy(e as Error);
      }
    }, keepaliveMs);
    keepaliveTimer.unref();
  }

  function stopKeepalive(): void {
    if (keepaliveTimer !== null) clearInterval(keepaliveTimer);
    keepaliveTimer = null;
  }

  async function close(): Promise<void> {
    const s = session;
    session = null;
    if (s !== null && !s.destroyed) {
      await new Promise<void>((resolve) => {
        // Idle sessions are unref'd; a process whose last work is this close() must
        // still wait for it, or Node exits before the caller's code after close() runs.
        s.ref();
        // A peer that never answers must not hold close() forever.
        const fallback = setTimeout(() => s.destroy(), 1000);
        s.once("close", () => {
          clearTimeout(fallback);
          resolve();
        });
        s.close();
      });
    }
  }

  return {
    get,
    discard() {
      session?.destroy();
      session = null;
    },
    closeCurrent() {
      session?.close();
    },
    startKeepalive,
    stopKeepalive,
    close,
  };
}

/** The `endpoint` option: `host:port` means `http://host:port`; only http and https. */
export function parseEndpoint(endpoint: string): URL {
  let url: URL;
  try {
    url = new URL(/^[a-z][a-z0-9+.-]*:\/\//i.test(endpoint) ? endpoint : `http://${endpoint}`);
  } catch (e) {
    throw new RunnerDepotError("INVALID_ARGUMENT", `endpoint is not a URL: ${JSON.stringify(endpoint)}`, { cause: e });
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    throw new RunnerDepotError("INVALID_ARGUMENT", `endpoint must be http:// or https://: ${endpoint}`);
  }
  return url;
}
