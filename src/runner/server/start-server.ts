/**
 * Hosting the runner service on HTTP/2: `startRunnerServer` (h2c, TLS or mutual TLS),
 * its sessions, keep-alive and shutdown. The request handler itself is runner/server/handler.ts
 * (`createRunnerHandler`, also for hosts with their own HTTP/2 server).
 */
import * as http2 from "node:http2";
import { isIP } from "node:net";
import { isLoopbackHost } from "../../loopback.js";
import { DEFAULT_ACCEPTORS, listenAcceptors } from "./acceptors.js";
import { createRunnerHandler, type RunnerDrainReport } from "./handler.js";
import type { RunnerHealth } from "./health.js";
import { silentLogger, type Logger } from "../../telemetry.js";
import type { RunnerReadLimits } from "./read-budget.js";
import type { RunnerLimits, RunnerService } from "../service/runner-service.js";
import { kSessionInfo, type CountedStream, type SessionInfo, type WideWindows } from "./session-streams.js";
import { wideWindowSessions } from "./flow-window.js";
import { backlogOf } from "../service/store-backlog.js";
import { DEFAULT_RUNNER_LIMITS } from "../service/contract.js";
import { createConnectionGate } from "./connection-cap.js";

/** TLS material for {@link startRunnerServer}. */
export interface RunnerTlsSettings {
  /** Server certificate chain (PEM). */
  cert: string | Buffer;
  /** Server private key (PEM). */
  key: string | Buffer;
  /** Client CA (PEM): with it, clients must present a certificate it signed (mutual TLS). */
  ca?: string | Buffer;
  /** Ask clients for a certificate; default true when `ca` is set. */
  requestCert?: boolean;
}

/** Default idle-connection limit of startRunnerServer (docs/runner-protocol.md, §11). */
export const DEFAULT_IDLE_CONNECTION_MS = 300_000;

/** Default SETTINGS_MAX_HEADER_LIST_SIZE of startRunnerServer (docs/runner-protocol.md, §11). */
export const DEFAULT_MAX_HEADER_LIST_SIZE = 16 * 1024;

function onStreamClose(this: CountedStream): void {
  const info = this[kSessionInfo];
  if (--info.streams === 0) info.idleSince = Date.now();
}

function ignoreSessionError(): void {
  // A peer that vanished; the session closes on its own.
}

/** Options of {@link startRunnerServer}. */
export interface RunnerServerSettings {
  /** Interface to listen on; default 127.0.0.1. */
  host?: string;
  /** Port; default 50051; 0 asks the OS. */
  port?: number;
  /** TLS (and mutual TLS with `tls.ca`); default plain h2c. */
  tls?: RunnerTlsSettings;
  /**
   * Allow listening beyond loopback with a service that accepts any caller (neither secret
   * nor authorize hook). Mutual TLS alone does not count: a client certificate proves the
   * caller is one of the fleet, not which job it may write to.
   */
  insecure?: boolean;
  /** Overrides the service's message limit for this server. */
  limits?: Partial<Pick<RunnerLimits, "messageBytes">>;
  /** HTTP/2 keep-alive: ping every session this often; default 30 000; 0 disables. */
  keepAliveMs?: number;
  /** A session that does not answer a ping within this is dropped; default 10 000. */
  keepAliveTimeoutMs?: number;
  /**
   * A connection with no open stream for this long is closed (GOAWAY): one that answers
   * pings is otherwise kept for ever, a descriptor and 5–18 KiB each. Default 300 000; 0 never.
   */
  idleConnectionMs?: number;
  /**
   * Listening sockets on the port (SO_REUSEPORT, Linux only; elsewhere always 1). Node accepts
   * one connection per listening socket per event-loop turn, and a server busy with many jobs
   * has long turns: with one socket, agents waited in the kernel's accept queue until their
   * keep-alive gave up (see runner/server/acceptors.ts). Default 8; 1 binds one socket without SO_REUSEPORT.
   */
  acceptors?: number;
  /**
   * Open connections at most; a connection past it is closed on arrival, before TLS or HTTP/2
   * (default 8 192, never over three quarters of the process's descriptor limit).
   */
  maxConnections?: number;
  /** Open connections from one peer address at most; more are closed on arrival (default 2 048). */
  maxConnectionsPerPeer?: number;
  /** HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS per connection (clients queue beyond it); default 1000. */
  maxConcurrentStreams?: number;
  /**
   * HTTP/2 SETTINGS_MAX_HEADER_LIST_SIZE: decoded bytes of one request's header list (name +
   * value + 32 per field); a larger list resets the stream before any handler runs. Bounds
   * HPACK amplification (one dynamic-table entry referenced again and again); default 16 384.
   */
  maxHeaderListSize?: number;
  /** Time calls in flight get on close before they end UNAVAILABLE; default 5 000. */
  gracefulShutdownMs?: number;
  /** Serve plain gRPC StreamLogs calls on the fast path; default true (see RunnerHandlerOptions.fastPath). */
  fastPath?: boolean;
  /**
   * Bounds on the request bytes held in memory: the first message of a call (read before it
   * is authenticated), per connection and per server; see RunnerReadLimits for the defaults.
   */
  readLimits?: Partial<RunnerReadLimits>;
  /** Serve gRPC health checking (`grpc.health.v1.Health`) on the same port; default true. */
  health?: boolean;
  /** Pino-compatible logger for the server's own events (`drain started`, `drain finished`); default silent. */
  logger?: Logger;
}

/** Options of {@link RunnerServer.drain}. */
export interface RunnerDrainOptions {
  /**
   * How long the server goes on accepting calls after health turned NOT_SERVING, so that
   * probes and load balancers see it and stop sending new calls; default 0. A `close()`
   * during this time ends it at once.
   */
  notServingMs?: number;
  /** Time calls in flight get to finish before they end UNAVAILABLE; default the server's `gracefulShutdownMs`. */
  graceMs?: number;
}

/** A running runner server. */
export interface RunnerServer {
  /** Base URL for clients, e.g. `http://127.0.0.1:50051`. */
  url: string;
  /** The port listened on. */
  port: number;
  /**
   * Bytes of request messages not yet fully arrived, held in memory right now (what RunnerReadLimits caps); for metrics
   * and tests.
   */
  readonly heldBytes: number;
  /** Graceful shutdown: idle connections cut at once, calls in flight get the grace time. Never hangs. */
  close(): Promise<void>;
  /**
   * Graceful shutdown for a host's SIGTERM: health turns NOT_SERVING at once (Check,
   * Watch), the server keeps accepting for `notServingMs`, then stops accepting (GOAWAY),
   * calls in flight get `graceMs` to finish, the rest end UNAVAILABLE with
   * `runner-committed` (the runner's client resumes them elsewhere). Resolves with what was
   * cut. Calling it again, or `close()`, joins the same shutdown.
   *
   * @example
   * process.once("SIGTERM", async () => {
   *   const { inFlight, cut } = await server.drain({ notServingMs: 5_000, graceMs: 30_000 });
   *   logger.info({ inFlight, cut }, "runner server drained");
   *   process.exitCode = 0;
   * });
   */
  drain(options?: RunnerDrainOptions): Promise<RunnerDrainReport>;
  /** The health service this server answers (null with `health: false`). */
  readonly health: RunnerHealth | null;
}

/**
 * Starts an HTTP/2 server for the runner service (gRPC, gRPC-web and Connect on one port).
 *
 * @example
 * const runner = createRunnerService(createMemoryQueue(), { secret });
 * const server = await startRunnerServer(runner, { host: "0.0.0.0", port: 50051, tls: { cert, key } });
 * // …
 * await server.close();
 */
export async function startRunnerServer(
  runner: RunnerService,
  settings: RunnerServerSettings = {},
): Promise<RunnerServer> {
  const host = settings.host ?? "127.0.0.1";
  const tls = settings.tls;
  // The contract's rule, literally: mutual TLS is transport security, but a service without
  // secret or authorize hook would still let any certificate holder write to any job.
  if (runner.acceptsAnyCaller && !settings.insecure && !isLoopbackHost(host)) {
    throw new Error(
      `refusing to listen on ${host}: the runner service has neither a secret nor an authorize hook ` +
        "(mutual TLS alone does not say which job a caller may write to); configure one, or set insecure: true",
    );
  }
  const runnerHandler = createRunnerHandler(runner, {
    messageBytes: settings.limits?.messageBytes,
    fastPath: settings.fastPath,
    readLimits: settings.readLimits,
    health: settings.health === false ? false : undefined,
  });
  const logger = settings.logger ?? silentLogger;
  const http2Settings: http2.Settings = {
    maxConcurrentStreams: settings.maxConcurrentStreams ?? 1000,
    maxHeaderListSize: settings.maxHeaderListSize ?? DEFAULT_MAX_HEADER_LIST_SIZE,
  };
  const server: http2.Http2Server | http2.Http2SecureServer = tls
    ? http2.createSecureServer({
        cert: tls.cert,
        key: tls.key,
        ca: tls.ca,
        requestCert: tls.requestCert ?? !!tls.ca,
        rejectUnauthorized: !!tls.ca,
        allowHTTP1: false,
        settings: http2Settings,
      })
    : http2.createServer({ settings: http2Settings });
  // The raw 'stream' event, not 'request': StreamLogs calls on the fast path get no
  // compatibility-layer request and response (runner/server/handler.ts makes them for the rest).
  server.on("stream", runnerHandler.stream);

  const sessions = new Map<http2.ServerHttp2Session, SessionInfo>();
  // Widened windows, bounded server-wide by the store backlog's budget (runner/server/flow-window.ts); a
  // service that is not runner-depot's own gets the default budget's bound and no backlog check.
  const backlog = backlogOf(runner);
  const wide: WideWindows = {
    count: 0,
    max: wideWindowSessions(backlog?.limit ?? DEFAULT_RUNNER_LIMITS.queuedBytes),
    backlog,
  };
  const keepAliveMs = settings.keepAliveMs ?? 30_000;
  const keepAliveTimeoutMs = settings.keepAliveTimeoutMs ?? 10_000;
  // Listeners shared by every session and stream (found through `sessions` and a symbol on
  // the stream): closures per session and per stream were kept as long as they stayed open.
  server.on("session", (session: http2.ServerHttp2Session) => {
    sessions.set(session, { streams: 0, idleSince: Date.now(), widened: false, wide });
    session.on("stream", onSessionStream);
    session.on("error", ignoreSessionError);
    session.once("close", onSessionClose);
  });
  function onSessionStream(this: http2.ServerHttp2Session, stream: http2.ServerHttp2Stream) {
    const info = sessions.get(this);
    if (info === undefined) return;
    info.streams++;
    info.idleSince = 0;
    (stream as unknown as CountedStream)[kSessionInfo] = info;
    // Comes once; on() keeps no once() wrapper per open stream.
    stream.on("close", onStreamClose);
  }
  function onSessionClose(this: http2.ServerHttp2Session) {
    // Its widened windows' slot is free again for the next busy connection.
    if (sessions.get(this)?.widened === true) wide.count--;
    sessions.delete(this);
  }
  // Keep-alive: one timer pings every session (a timer per session cost each connection a
  // Timeout and its closure for as long as it stayed open). O(sessions) every keepAliveMs.
  const pinger = keepAliveMs > 0 ? setInterval(() => pingAll(), keepAliveMs) : null;
  pinger?.unref();
  function pingAll() {
    for (const session of sessions.keys()) {
      if (session.destroyed || session.closed) continue;
      const timer = setTimeout(() => session.destroy(), keepAliveTimeoutMs);
      timer.unref();
      try {
        session.ping((error) => {
          clearTimeout(timer);
          if (error && !session.destroyed) session.destroy();
        });
      } catch {
        clearTimeout(timer);
      }
    }
  }
  // Idle connections: one sweep over the sessions every quarter of the limit (at most 30 s). O(sessions).
  const idleConnectionMs = settings.idleConnectionMs ?? DEFAULT_IDLE_CONNECTION_MS;
  const idleSweep =
    idleConnectionMs > 0
      ? setInterval(() => closeIdleSessions(), Math.max(10, Math.min(idleConnectionMs / 4, 30_000)))
      : null;
  idleSweep?.unref();
  function closeIdleSessions() {
    const now = Date.now();
    for (const [session, info] of sessions) {
      if (info.streams > 0 || session.destroyed || now - info.idleSince < idleConnectionMs) continue;
      // GOAWAY, then the socket closes (a stream racing in still finishes); one that lingers a sweep later is cut.
      if (session.closed) session.destroy();
      else session.close();
    }
  }
  // TLS handshakes that fail (no client certificate) must not crash the process.
  server.on("tlsClientError", () => undefined);
  server.on("sessionError", () => undefined);

  // A fleet reconnecting at once (a restart, a deploy) opens a thousand connections in a
  // few seconds; past the backlog (Node's default 511) SYNs are dropped and retried after
  // 1, 3, 7 s, so a busy server turned into agents' connect timeouts in the fleet bench.
  // The kernel caps it at net.core.somaxconn. Several sockets: see runner/server/acceptors.ts.
  // Connections past the caps are closed before TLS or HTTP/2 (runner/server/connection-cap.ts).
  const gate = createConnectionGate({
    maxConnections: settings.maxConnections,
    maxConnectionsPerPeer: settings.maxConnectionsPerPeer,
  });
  const acceptors = await listenAcceptors(
    { host, port: settings.port ?? 50051, count: settings.acceptors ?? DEFAULT_ACCEPTORS, backlog: 4096 },
    (socket) => {
      if (gate.admit(socket)) server.emit("connection", socket);
    },
  );
  const bound = acceptors.port;
  const urlHost = isIP(host) === 6 ? `[${host}]` : host;
  const url = `${tls ? "https" : "http"}://${urlHost}:${bound}`;

  let draining: Promise<RunnerDrainReport> | null = null;
  // Ends a drain's not-serving time early (close() during a drain).
  let endNotServing: (() => void) | null = null;
  const grace = settings.gracefulShutdownMs ?? 5000;

  function cutIdleSessions() {
    for (const [session, info] of sessions) {
      if (session.destroyed) continue;
      if (info.streams === 0) {
        try {
          session.goaway(http2.constants.NGHTTP2_NO_ERROR);
        } catch {
          // Already going away.
        }
        session.destroy();
      } else if (!session.closed) {
        // GOAWAY: no new streams on this connection; those in flight go on.
        session.close();
      }
    }
  }

  const drain = (options: RunnerDrainOptions = {}) => {
    draining ??= drainServer(options);
    return draining;
  };
  return {
    url,
    port: bound,
    get heldBytes() {
      return runnerHandler.heldBytes;
    },
    get health() {
      return runnerHandler.health;
    },
    async close() {
      endNotServing?.();
      await drain();
    },
    drain,
  };

  async function drainServer(options: RunnerDrainOptions): Promise<RunnerDrainReport> {
    runnerHandler.health?.setStatus("NOT_SERVING");
    logger.info(
      { activeCalls: runnerHandler.activeRequests, notServingMs: options.notServingMs ?? 0 },
      "drain started",
    );
    if ((options.notServingMs ?? 0) > 0) {
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, options.notServingMs);
        endNotServing = () => {
          clearTimeout(timer);
          resolve();
        };
      });
    }
    endNotServing = null;
    const report = await stopServing(options.graceMs ?? grace);
    logger.info({ ...report }, "drain finished");
    return report;
  }

  /** Stops accepting, lets calls in flight finish within `graceMs`, cuts the rest. Never hangs. */
  async function stopServing(graceMs: number): Promise<RunnerDrainReport> {
    const serverClosed = acceptors.close();
    cutIdleSessions();
    // Sessions whose calls finish during the grace period are cut as they go idle.
    const sweeper = setInterval(cutIdleSessions, 50);
    let report: RunnerDrainReport;
    try {
      report = await runnerHandler.shutdown(graceMs);
    } finally {
      clearInterval(sweeper);
    }
    // Give trailers a moment to leave, then nothing is waited for any more.
    cutIdleSessions();
    await Promise.race([serverClosed, new Promise((resolve) => setTimeout(resolve, 250))]);
    for (const session of sessions.keys()) session.destroy();
    if (pinger) clearInterval(pinger);
    if (idleSweep) clearInterval(idleSweep);
    await serverClosed;
    return report;
  }
}
