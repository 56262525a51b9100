/**
 * Serving the depot router on node:http with the native Node handler (depot/server/node-handler.ts:
 * blob bytes move between socket and store as Node streams) and every connection phase
 * bounded (depot/server/connection-limits.ts).
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { RunnerDepotError } from "../../errors.js";
import { isLoopbackHost } from "../../loopback.js";
import {
  applyConnectionLimits,
  DEFAULT_CONNECTION_LIMITS,
  isRefusedConnection,
  type ConnectionLimits,
} from "./connection-limits.js";
import { createNodeHandler, type NodeHandlerOptions } from "./node-handler.js";
import type { MeterProvider, ObservableResult } from "@opentelemetry/api";
import { meterOf, silentLogger, type Logger } from "../../telemetry.js";

/**
 * What {@link servePackageRouter} serves: a depot router, or any web-standard fetch
 * handler wrapping one (a host adding its own routes in front of the depot).
 */
export interface FetchHandler {
  fetch(request: Request): Promise<Response>;
  /** False only when every request is authorized; a handler without it counts as open. */
  readonly isOpen?: boolean;
  /** Work still running after its answers (a depot router's commits); `close()` waits for it. */
  idle?(): Promise<void>;
}

/**
 * Options of {@link servePackageRouter}. The time and connection bounds (README,
 * "Configuration"; docs/decisions/depot-server.md) default to values that hold against
 * idle and stalled clients while a slow but moving upload still completes.
 */
export interface ServePackageRouterOptions
  extends ConnectionLimits, Pick<NodeHandlerOptions, "bodyIdleMs" | "sendIdleMs"> {
  /** Interface to bind (default 127.0.0.1). */
  host?: string;
  /** Port (default 0: the OS picks). */
  port?: number;
  /** Allow an open router (no authorize hook) on a non-loopback address. */
  insecure?: boolean;
  /** Node's own header limit, above which it answers 431 before the router sees the request (default 64 KiB). */
  maxHeaderSize?: number;
  /** Structured logger (pino-compatible) for listening, handler faults and what a close cut; default: silent. */
  logger?: Logger;
  /** Meter provider for `depot.requests.active`; default: the global one when the server starts. */
  meterProvider?: MeterProvider;
}

/** Options of {@link PackageServer.drain}. */
export interface CloseOptions {
  /**
   * How long requests in flight may run on after the listener closes, ms (default 0: cut
   * at once). Requests arriving on kept-alive connections meanwhile are answered 503.
   */
  graceMs?: number;
}

/** What a close did: the requests that finished within the grace time and those it cut. */
export interface CloseReport {
  /** Requests that were in flight when the close began and finished within the grace time. */
  finished: number;
  /** Requests still running when the grace time ran out (or at once, without one). */
  cut: Array<{ method: string; path: string; ms: number }>;
}

/** A listening depot server. */
export interface PackageServer {
  /** Base URL, e.g. `http://127.0.0.1:41234`. */
  url: string;
  port: number;
  /** The node:http server (for hosts that need it). */
  server: Server;
  /** Stops listening and closes every connection at once (a drain with no grace time). */
  close(): Promise<void>;
  /**
   * Stops listening, lets requests in flight finish for `graceMs`, then closes every
   * connection and waits for the router's after-answer work (a commit's index). The
   * report (also logged) names what was cut. After the first call, close and drain
   * return the same outcome.
   */
  drain(options?: CloseOptions): Promise<CloseReport>;
}

/**
 * Serves a depot router on node:http. An open router (no authorize hook) is refused on any
 * address but loopback unless `insecure` is set.
 *
 * @example
 * const server = await servePackageRouter(createPackageRouter(createFsStore(dir)), { port: 8080 });
 * console.log(server.url); // http://127.0.0.1:8080
 */
export async function servePackageRouter(
  router: FetchHandler,
  options: ServePackageRouterOptions = {},
): Promise<PackageServer> {
  const host = options.host ?? "127.0.0.1";
  if (router.isOpen !== false && !isLoopbackHost(host) && !options.insecure) {
    throw new RunnerDepotError(
      "FAILED_PRECONDITION",
      `Refusing to serve an open depot (no authorize hook) on ${host}: give the router an authorize hook, bind a loopback address, or pass insecure: true`,
    );
  }
  const log = options.logger ?? silentLogger;
  const handler = createNodeHandler(router, {
    bodyIdleMs: options.bodyIdleMs,
    sendIdleMs: options.sendIdleMs,
    ...(options.logger ? { onError: (error: unknown) => log.error({ err: error }, "response failed") } : {}),
  });
  // Requests in flight, for a graceful close: O(1) per request on and off.
  const inFlight = new Map<IncomingMessage, number>();
  // Observed at a scrape from inFlight (O(1)), not counted per request: the SDK's record
  // path (a clock read, an attributes hash) would run twice on every request.
  const active = meterOf(options.meterProvider).createObservableUpDownCounter("depot.requests.active", {
    unit: "{request}",
    description: "Requests in flight on the depot port",
  });
  const observeActive = (result: ObservableResult) => result.observe(inFlight.size);
  active.addCallback(observeActive);
  let draining = false;
  let settle: (() => void) | undefined;
  const headersTimeoutMs = options.headersTimeoutMs ?? DEFAULT_CONNECTION_LIMITS.headersTimeoutMs;
  const onRequest = (req: IncomingMessage, res: ServerResponse) => {
    if (isRefusedConnection(req.socket)) return;
    if (draining) return refuseWhileDraining(res);
    inFlight.set(req, performance.now());
    res.once("close", () => {
      inFlight.delete(req);
      if (draining) {
        server.closeIdleConnections();
        if (inFlight.size === 0) settle?.();
      }
    });
    void handler(req, res);
  };
  const server = createServer(
    {
      maxHeaderSize: options.maxHeaderSize ?? 64 * 1024,
      // Uploads of up to 2 GiB on slow links: no whole-request deadline, a deadline per phase instead.
      requestTimeout: 0,
      headersTimeout: headersTimeoutMs,
      connectionsCheckingInterval: Math.min(30_000, Math.max(50, headersTimeoutMs / 4)),
    },
    onRequest,
  );
  // An Expect other than 100-continue: served as if it were absent (RFC 9110 lets a server
  // ignore it), instead of Node's bare 417 without a problem document.
  server.on("checkExpectation", onRequest);
  applyConnectionLimits(server, options);
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(options.port ?? 0, host, () => {
      server.off("error", reject);
      resolve();
    });
  });
  const port = (server.address() as AddressInfo).port;
  const shown = host.includes(":") ? `[${host}]` : host;
  const url = `http://${shown}:${port}`;
  log.info({ url }, "depot listening");

  /** Stops accepting, waits up to `graceMs` for the requests in flight, then cuts the rest. */
  async function drain(graceMs: number): Promise<CloseReport> {
    draining = true;
    const started = inFlight.size;
    const closed = new Promise<void>((resolve) => server.close(() => resolve()));
    server.closeIdleConnections();
    if (graceMs > 0 && inFlight.size > 0) {
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, graceMs);
        settle = () => {
          clearTimeout(timer);
          resolve();
        };
      });
    }
    const at = performance.now();
    const cut = [...inFlight].map(([req, since]) => ({
      method: req.method ?? "?",
      path: pathOnly(req.url),
      ms: Math.round(at - since),
    }));
    server.closeAllConnections();
    await closed;
    active.removeCallback(observeActive);
    await router.idle?.();
    const report = { finished: Math.max(0, started - cut.length), cut };
    if (cut.length > 0) log.warn({ cut: cut.length, requests: cut }, "depot closed: requests cut");
    else log.info({ finished: report.finished }, "depot closed");
    return report;
  }

  let closing: Promise<CloseReport> | undefined;
  return {
    url,
    port,
    server,
    drain(drainOptions = {}) {
      closing ??= drain(Math.max(0, drainOptions.graceMs ?? 0));
      return closing;
    },
    async close() {
      closing ??= drain(0);
      await closing;
    },
  };
}

/** A request that arrives on a kept-alive connection during a close: 503, and the connection closes. */
function refuseWhileDraining(res: ServerResponse): void {
  const body = JSON.stringify(
    new RunnerDepotError("UNAVAILABLE", "The depot is shutting down; retry on another instance").toProblem(),
  );
  res.writeHead(503, {
    "Content-Type": "application/problem+json",
    "Retry-After": "1",
    Connection: "close",
    "Cache-Control": "no-store",
  });
  res.end(body);
}

/** A request's path without its query (a signed URL's query is a credential: never logged). */
function pathOnly(url: string | undefined): string {
  const raw = url ?? "/";
  const q = raw.indexOf("?");
  return (q === -1 ? raw : raw.slice(0, q)).slice(0, 200);
}
