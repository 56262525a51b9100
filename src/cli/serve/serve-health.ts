/**
 * `serve`'s operator endpoints: `GET /healthz` (the process answers), `GET /readyz`
 * (every backend reachable, and not draining) and `GET /metrics` (Prometheus text),
 * answered on the depot port or on a separate `--metrics-port` listener
 * (docs/depot-api.md §Operations).
 */
import { createHash, timingSafeEqual } from "node:crypto";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import type { Logger } from "../../telemetry.js";

/** One backend readiness depends on; `check` rejects when it is unreachable. */
export interface Probe {
  name: string;
  check(): Promise<unknown>;
}

/** What `/readyz` answers. */
interface Readiness {
  status: "ready" | "unready" | "draining";
  /** `ok`, or why not (an error code, never a message that could carry a URL). */
  checks: Record<string, string>;
  /** The backends that are not reachable. */
  unreachable: string[];
}

/** Options of {@link createOperatorEndpoints}. */
interface OperatorEndpointsOptions {
  probes: Probe[];
  /** A probe slower than this counts as unreachable, ms (default 2,000). */
  timeoutMs?: number;
  /** Prometheus text of every metric. */
  metricsText(): Promise<string>;
  /** Bearer token `/metrics` needs; null: none (the separate metrics listener). */
  metricsToken: string | null;
  logger: Logger;
}

/** The endpoints and the drain switch. */
export interface OperatorEndpoints {
  /** The answer for `pathname`, or undefined when it is not an operator endpoint. */
  answer(request: Request, pathname: string, options?: { metrics?: boolean }): Promise<Response> | undefined;
  /** Readiness goes false for good (the first step of a drain). */
  drain(): void;
  readiness(): Promise<Readiness>;
}

const PROMETHEUS_TYPE = "text/plain; version=0.0.4; charset=utf-8";

/**
 * Creates the operator endpoints. Concurrent `/readyz` requests share one probe run, so
 * a probe storm costs the backends one check each at a time; each probe is bounded by
 * `timeoutMs`.
 *
 * @example
 * const ops = createOperatorEndpoints({
 *   probes: [{ name: "store", check: () => store.getRecord("format") }],
 *   metricsText,
 *   metricsToken: adminToken,
 *   logger,
 * });
 * const answer = ops.answer(request, new URL(request.url).pathname); // undefined for other paths
 */
export function createOperatorEndpoints(options: OperatorEndpointsOptions): OperatorEndpoints {
  const timeoutMs = options.timeoutMs ?? 2_000;
  let draining = false;
  let running: Promise<Readiness> | undefined;
  let lastStatus: Readiness["status"] | undefined;
  const expected = options.metricsToken === null ? null : hash(`Bearer ${options.metricsToken}`);

  async function probeAll(): Promise<Readiness> {
    const results = await Promise.all(
      options.probes.map(async (probe) => [probe.name, await outcome(probe, timeoutMs)] as const),
    );
    const checks = Object.fromEntries(results);
    const unreachable = results.filter(([, result]) => result !== "ok").map(([name]) => name);
    const status = draining ? "draining" : unreachable.length > 0 ? "unready" : "ready";
    // One line per change of state, not one per probe request.
    if (status !== lastStatus) {
      const log =
        status === "ready" ? options.logger.info.bind(options.logger) : options.logger.warn.bind(options.logger);
      log({ status, unreachable, checks }, "readiness changed");
      lastStatus = status;
    }
    return { status, checks, unreachable };
  }

  function readiness(): Promise<Readiness> {
    running ??= probeAll().finally(() => {
      running = undefined;
    });
    return running;
  }

  async function metrics(request: Request): Promise<Response> {
    if (expected !== null) {
      const given = request.headers.get("authorization");
      if (given === null || !timingSafeEqual(hash(given), expected)) {
        return new Response(
          JSON.stringify({
            status: 401,
            code: "UNAUTHENTICATED",
            title: "Unauthorized",
            detail: "GET /metrics needs the admin token",
          }),
          {
            status: 401,
            headers: {
              "Content-Type": "application/problem+json",
              "WWW-Authenticate": 'Bearer realm="runner-depot"',
              "Cache-Control": "no-store",
            },
          },
        );
      }
    }
    return new Response(await options.metricsText(), {
      status: 200,
      headers: { "Content-Type": PROMETHEUS_TYPE, "Cache-Control": "no-store" },
    });
  }

  return {
    answer(request, pathname, answerOptions = {}) {
      const known =
        pathname === "/healthz" ||
        pathname === "/readyz" ||
        (pathname === "/metrics" && answerOptions.metrics !== false);
      if (!known) return undefined;
      if (request.method !== "GET" && request.method !== "HEAD") {
        return Promise.resolve(new Response(null, { status: 405, headers: { Allow: "GET, HEAD" } }));
      }
      if (pathname === "/healthz") return Promise.resolve(jsonResponse(200, { status: "alive" }));
      if (pathname === "/readyz") return readiness().then((r) => jsonResponse(r.status === "ready" ? 200 : 503, r));
      return metrics(request);
    },
    drain() {
      draining = true;
    },
    readiness,
  };
}

/** Serves only the operator endpoints (`--metrics-host/--metrics-port`), without auth. */
export async function serveOperatorEndpoints(
  endpoints: OperatorEndpoints,
  host: string,
  port: number,
): Promise<{ url: string; server: Server; close(): Promise<void> }> {
  const server = createServer(
    { requestTimeout: 10_000, headersTimeout: 5_000, maxHeaderSize: 16 * 1024 },
    (req, res) => {
      const pathname = new URL(req.url ?? "/", "http://operator.local").pathname;
      const request = new Request(`http://operator.local${pathname}`, {
        method: req.method === "HEAD" ? "HEAD" : req.method === "GET" ? "GET" : "POST",
      });
      const pending = endpoints.answer(request, pathname) ?? Promise.resolve(new Response(null, { status: 404 }));
      void pending.then(
        async (response) => {
          const body = req.method === "HEAD" ? "" : await response.text();
          res.writeHead(response.status, Object.fromEntries(response.headers));
          res.end(body);
        },
        () => {
          res.writeHead(500);
          res.end();
        },
      );
    },
  );
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => resolve());
  });
  const bound = (server.address() as AddressInfo).port;
  return {
    url: `http://${host.includes(":") ? `[${host}]` : host}:${bound}`,
    server,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}

async function outcome(probe: Probe, timeoutMs: number): Promise<string> {
  let timer: NodeJS.Timeout | undefined;
  try {
    await Promise.race([
      probe.check(),
      new Promise((_, reject) => {
        timer = setTimeout(() => reject(Object.assign(new Error("probe timed out"), { code: "TIMEOUT" })), timeoutMs);
      }),
    ]);
    return "ok";
  } catch (error) {
    const code = (error as { code?: unknown } | null)?.code;
    return typeof code === "string" && /^[A-Za-z0-9_]{1,40}$/.test(code) ? code : "unreachable";
  } finally {
    clearTimeout(timer);
  }
}

function jsonResponse(status: number, body: unknown): Response {
  return new Response(JSON.stringify(body), {
    status,
    headers: { "Content-Type": "application/json", "Cache-Control": "no-store" },
  });
}

function hash(text: string): Buffer {
  return createHash("sha256").update(text).digest();
}
