/**
 * Hosting the runner service on HTTP/2: `startRunnerServer` (h2c, TLS or mutual TLS)
 * and `createRunnerHandler` for hosts that mount it on their own HTTP/2 server.
 */
import { setMaxListeners } from "node:events";
import * as http2 from "node:http2";
import { isIP } from "node:net";
import type { AddressInfo } from "node:net";
import { createContextValues } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { Runner } from "../gen/runner/v1/runner_pb.js";
import { isLoopbackHost } from "../net.js";
import { createStreamLogsFastPath } from "./grpc-fast-path.js";
import { kMessageBytes, kShutdownSignal, wireLimitFor, type RunnerLimits, type RunnerService } from "./service.js";

/** Options of {@link createRunnerHandler}. */
export interface RunnerHandlerOptions {
  /** Largest request message; default the service's `limits.messageBytes`. */
  messageBytes?: number;
  /** Path prefix the service is mounted under; default none. */
  requestPathPrefix?: string;
  /**
   * Serve plain gRPC StreamLogs calls on the fast path (frames read and decoded here, items
   * handed to the service in batches); default true. false sends every call through connect-node.
   */
  fastPath?: boolean;
}

/** A Node HTTP/2 request handler serving the runner service, and what its host needs to shut it down. */
export interface RunnerHandler {
  /** The request listener (`http2Server.on("request", handler)`); answers gRPC, gRPC-web and Connect. */
  handler: (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => void;
  /**
   * Lets calls in flight run for `graceMs`, then ends them UNAVAILABLE (with
   * `runner-committed`) and resolves once their responses are out (or given up on).
   */
  shutdown(graceMs?: number): Promise<void>;
  /** Requests in progress. */
  readonly activeRequests: number;
}

/**
 * Creates the HTTP/2 request handler of a runner service, for hosts with their own server.
 *
 * @example
 * const runnerHandler = createRunnerHandler(runner);
 * const server = http2.createServer(runnerHandler.handler);
 * // on exit: await runnerHandler.shutdown(5_000); then close your sessions and server
 */
export function createRunnerHandler(runner: RunnerService, options: RunnerHandlerOptions = {}): RunnerHandler {
  const shutdownController = new AbortController();
  // Every call in flight listens for the shutdown.
  setMaxListeners(0, shutdownController.signal);
  const active = new Set<http2.Http2ServerResponse>();
  const idle = new Set<() => void>();
  const readMaxBytes = wireLimitFor(options.messageBytes ?? runner.limits.messageBytes);
  const contextValues = () => createContextValues().set(kShutdownSignal, shutdownController.signal).set(kMessageBytes, options.messageBytes);
  const adapter = connectNodeAdapter({
    routes: (router) => router.service(Runner, runner),
    readMaxBytes,
    requestPathPrefix: options.requestPathPrefix,
    contextValues,
  });
  // connect-node's per-message pipeline caps a stream at ~120k items/s; plain gRPC
  // StreamLogs calls skip it (same service, same response writer).
  const fastPath = options.fastPath === false ? null : createStreamLogsFastPath(runner, { readMaxBytes, requestPathPrefix: options.requestPathPrefix, contextValues });

  const handler = (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => {
    active.add(res);
    let done = false;
    const finished = () => {
      if (done) return;
      done = true;
      active.delete(res);
      // The response is out but the client may still be sending (the call ended early):
      // reset the stream with NO_ERROR, as gRPC servers do, so it never stays half open.
      const stream = req.stream;
      const reset = (tries = 0) => {
        if (stream.destroyed || stream.closed) return;
        // nghttp2 drops frames still queued for a stream it resets: wait until the
        // trailers have left the session's queue.
        const queued = stream.session?.state.outboundQueueSize ?? 0;
        if (queued > 0 && tries < 200) {
          setImmediate(() => reset(tries + 1));
          return;
        }
        try {
          stream.close(http2.constants.NGHTTP2_NO_ERROR);
        } catch {
          // The stream went away meanwhile.
        }
      };
      // The RST must follow the trailers: the response sends them on 'wantTrailers'
      // (its listener runs before ours), so reset right after, never before.
      if (stream && !stream.destroyed && !stream.closed) {
        if (stream.sentTrailers) setImmediate(reset);
        else {
          stream.once("wantTrailers", () => setImmediate(reset));
          // A response without trailers: reset once its last frame is out.
          stream.once("finish", () => setTimeout(reset, 100).unref());
        }
      }
      if (active.size === 0) for (const wake of idle) wake();
    };
    // Http2ServerResponse emits finish/close only once the whole stream is closed, which
    // a runner still sending never lets happen: hook the end of the response instead.
    const endResponse = res.end.bind(res) as (...args: unknown[]) => unknown;
    (res as { end: (...args: unknown[]) => unknown }).end = (...args: unknown[]) => {
      const value = endResponse(...args);
      finished();
      return value;
    };
    res.once("close", finished);
    if (fastPath === null || !fastPath(req, res)) adapter(req, res);
  };

  return {
    handler,
    get activeRequests() {
      return active.size;
    },
    async shutdown(graceMs = 5000) {
      if (active.size > 0 && graceMs > 0) await waitIdle(graceMs);
      shutdownController.abort();
      // Calls end UNAVAILABLE now; give their responses a moment to be written.
      if (active.size > 0) await waitIdle(2000);
    },
  };

  function waitIdle(ms: number): Promise<void> {
    return new Promise<void>((resolve) => {
      const wake = () => {
        clearTimeout(timer);
        idle.delete(wake);
        resolve();
      };
      const timer = setTimeout(wake, ms);
      idle.add(wake);
    });
  }
}

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
  /** HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS per connection (clients queue beyond it); default 1000. */
  maxConcurrentStreams?: number;
  /** Time calls in flight get on close before they end UNAVAILABLE; default 5 000. */
  gracefulShutdownMs?: number;
  /** Serve plain gRPC StreamLogs calls on the fast path; default true (see RunnerHandlerOptions.fastPath). */
  fastPath?: boolean;
}

/** A running runner server. */
export interface RunnerServer {
  /** Base URL for clients, e.g. `http://127.0.0.1:50051`. */
  url: string;
  /** The port listened on. */
  port: number;
  /** Graceful shutdown: idle connections cut at once, calls in flight get the grace time. Never hangs. */
  close(): Promise<void>;
}

// Re-exported only so the runner barrel keeps compiling until it drops the name; the one copy lives in src/net.ts.

/**
 * Starts an HTTP/2 server for the runner service (gRPC, gRPC-web and Connect on one port).
 *
 * @example
 * const runner = createRunnerService(createMemoryQueue(), { secret });
 * const server = await startRunnerServer(runner, { host: "0.0.0.0", port: 50051, tls: { cert, key } });
 * // …
 * await server.close();
 */
export async function startRunnerServer(runner: RunnerService, settings: RunnerServerSettings = {}): Promise<RunnerServer> {
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
  const runnerHandler = createRunnerHandler(runner, { messageBytes: settings.limits?.messageBytes, fastPath: settings.fastPath });
  const http2Settings: http2.Settings = { maxConcurrentStreams: settings.maxConcurrentStreams ?? 1000 };
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
  server.on("request", runnerHandler.handler);

  const sessions = new Map<http2.ServerHttp2Session, { streams: number }>();
  const keepAliveMs = settings.keepAliveMs ?? 30_000;
  const keepAliveTimeoutMs = settings.keepAliveTimeoutMs ?? 10_000;
  server.on("session", (session: http2.ServerHttp2Session) => {
    const info = { streams: 0 };
    sessions.set(session, info);
    session.on("stream", (stream) => {
      info.streams++;
      stream.once("close", () => {
        info.streams--;
      });
    });
    let pinger: NodeJS.Timeout | undefined;
    if (keepAliveMs > 0) {
      pinger = setInterval(() => {
        if (session.destroyed || session.closed) return;
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
      }, keepAliveMs);
      pinger.unref();
    }
    session.on("error", () => {
      // A peer that vanished; the session closes on its own.
    });
    session.once("close", () => {
      clearInterval(pinger);
      sessions.delete(session);
    });
  });
  // TLS handshakes that fail (no client certificate) must not crash the process.
  server.on("tlsClientError", () => undefined);
  server.on("sessionError", () => undefined);

  const port = settings.port ?? 50051;
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => {
      server.off("error", reject);
      resolve();
    });
  });
  const bound = (server.address() as AddressInfo).port;
  const urlHost = isIP(host) === 6 ? `[${host}]` : host;
  const url = `${tls ? "https" : "http"}://${urlHost}:${bound}`;

  let closing: Promise<void> | null = null;
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

  return {
    url,
    port: bound,
    close() {
      closing ??= (async () => {
        const serverClosed = new Promise<void>((resolve) => server.close(() => resolve()));
        cutIdleSessions();
        // Sessions whose calls finish during the grace period are cut as they go idle.
        const sweeper = setInterval(cutIdleSessions, 50);
        try {
          await runnerHandler.shutdown(grace);
        } finally {
          clearInterval(sweeper);
        }
        // Give trailers a moment to leave, then nothing is waited for any more.
        cutIdleSessions();
        await Promise.race([serverClosed, new Promise((resolve) => setTimeout(resolve, 250))]);
        for (const session of sessions.keys()) session.destroy();
        await serverClosed;
      })();
      return closing;
    },
  };
}
