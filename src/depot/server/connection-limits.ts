/**
 * Bounds on a node:http server's connections (issue 9 depot item 1): without them a thousand idle TCP
 * connections exhaust the file descriptors and every client is refused.
 * Why: docs/decisions/depot-server.md, "connection-limits.ts: bounds on node:http connections".
 */
import type { IncomingMessage, Server } from "node:http";
import type { Socket } from "node:net";
import { RunnerDepotError } from "../../errors.js";
import { connectionCapFor } from "./descriptors.js";

/** Connection bounds; each has a default that suits a depot on the open internet. */
export interface ConnectionLimits {
  /** The request line and headers must arrive within this, ms (default 30,000). */
  headersTimeoutMs?: number;
  /** An idle keep-alive connection is closed after this, ms (default 5,000). */
  keepAliveTimeoutMs?: number;
  /**
   * Open connections at most; more are refused with 503 (default 2,000, and never over three quarters of the process's
   * file-descriptor limit).
   */
  maxConnections?: number;
  /** Open connections from one peer address at most; more are refused with 503 (default 128). */
  maxConnectionsPerPeer?: number;
  /**
   * The last connections under `maxConnections` that serve only `/healthz`, `/readyz` and
   * requests with an `Authorization` header; others get 503 (default a tenth of the cap).
   */
  reservedConnections?: number;
}

/** The defaults of {@link ConnectionLimits}. */
export const DEFAULT_CONNECTION_LIMITS: Required<Omit<ConnectionLimits, "reservedConnections">> = {
  headersTimeoutMs: 30_000,
  keepAliveTimeoutMs: 5_000,
  maxConnections: 2_000,
  maxConnectionsPerPeer: 512,
};

const refused = new WeakSet<Socket>();
/**
 * Connections past `maxConnections - reservedConnections`: they serve health checks and authenticated requests only.
 */
const reserveOnly = new WeakSet<Socket>();

/** Answers one 503 TOO_MANY_CONNECTIONS on `socket` (nothing of it parsed or answered yet) and closes it. */
function refuse(socket: Socket, detail: string): void {
  refused.add(socket);
  const body = JSON.stringify(new RunnerDepotError("TOO_MANY_CONNECTIONS", detail).toProblem());
  socket.on("error", () => undefined);
  socket.end(
    `HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/problem+json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n` +
      `Retry-After: 1\r\nConnection: close\r\n\r\n${body}`,
    () => socket.destroy(),
  );
}

/** True when the server refused this connection over its cap (its requests are ignored). */
export function isRefusedConnection(socket: Socket): boolean {
  return refused.has(socket);
}

/**
 * Applies connection bounds to a node:http server (one the host created, e.g. Express's
 * or Fastify's), before it listens (Node reads its header-check interval then), and answers its client errors with
 * problem+json
 * (431 for oversized headers, 408 for headers too slow, 400 otherwise).
 *
 * @example
 * const server = http.createServer((req, res) => void handler(req, res));
 * applyConnectionLimits(server, { maxConnections: 1000 });
 */
export function applyConnectionLimits(server: Server, limits: ConnectionLimits = {}): void {
  const { headersTimeoutMs, keepAliveTimeoutMs, maxConnectionsPerPeer } = { ...DEFAULT_CONNECTION_LIMITS, ...limits };
  const maxConnections = connectionCapFor(limits.maxConnections ?? DEFAULT_CONNECTION_LIMITS.maxConnections);
  const reserved = Math.min(maxConnections - 1, limits.reservedConnections ?? Math.floor(maxConnections / 10));
  server.requestTimeout = 0;
  server.headersTimeout = headersTimeoutMs;
  server.keepAliveTimeout = keepAliveTimeoutMs;
  // Node checks header deadlines on this interval; keep it well under the deadline.
  (server as Server & { connectionsCheckingInterval?: number }).connectionsCheckingInterval = Math.min(
    30_000,
    Math.max(50, headersTimeoutMs / 4),
  );
  let open = 0;
  // Per peer address: one peer cannot hold every connection (issue 30 item 3). O(1) per connection.
  const perPeer = new Map<string, number>();
  // Runs before Node's own connection listener, so a refused socket is never parsed.
  server.prependListener("connection", (socket: Socket) => {
    const peer = socket.remoteAddress ?? "";
    const fromPeer = perPeer.get(peer) ?? 0;
    if (open >= maxConnections || fromPeer >= maxConnectionsPerPeer) {
      refuse(
        socket,
        open >= maxConnections
          ? `The server holds ${maxConnections} connections; retry shortly`
          : `This address holds ${maxConnectionsPerPeer} connections; close some first`,
      );
      return;
    }
    open++;
    perPeer.set(peer, fromPeer + 1);
    if (open > maxConnections - reserved) reserveOnly.add(socket);
    socket.once("close", () => {
      open--;
      const left = (perPeer.get(peer) ?? 1) - 1;
      if (left > 0) perPeer.set(peer, left);
      else perPeer.delete(peer);
    });
  });
  // Before the host's handler: on a reserved connection only health checks and authenticated requests.
  server.prependListener("request", (req: IncomingMessage) => {
    if (refused.has(req.socket)) return req.socket.destroy();
    if (!reserveOnly.has(req.socket) || req.headers.authorization !== undefined) return;
    const path = (req.url ?? "").split("?")[0];
    if (path === "/healthz" || path === "/readyz") return;
    refuse(
      req.socket,
      `The server holds ${maxConnections - reserved} connections; its last ${reserved} serve authenticated requests`,
    );
  });
  // CONNECT (a proxy tunnel) is no request for a depot; without a listener Node would drop
  // the connection without a word. Answered 405 with an empty Allow (the authority named
  // allows no method) unless the host listens for CONNECT itself.
  server.on("connect", (req: IncomingMessage, socket: Socket) => {
    if (server.listenerCount("connect") > 1) return;
    if (refused.has(socket)) return socket.destroy();
    socket.on("error", () => undefined);
    const failure = new RunnerDepotError(
      "METHOD_NOT_ALLOWED",
      `CONNECT ${(req.url ?? "").slice(0, 100)} is not served here`,
    );
    const body = JSON.stringify(failure.toProblem());
    socket.end(
      `HTTP/1.1 405 Method Not Allowed\r\nAllow: \r\nContent-Type: application/problem+json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
    );
  });
  server.on("clientError", (error: NodeJS.ErrnoException, socket) => {
    if (!socket.writable || refused.has(socket as Socket)) return socket.destroy();
    // As Node itself does: a connection that already had a response (an idle keep-alive one
    // the header deadline caught, measured from its last request's start) is closed without
    // an answer, since a client reusing it at that moment would take the 408 for its own.
    if (error.code === "ERR_HTTP_REQUEST_TIMEOUT" && (socket as Socket).bytesWritten > 0) return socket.destroy();
    const [status, text, failure] =
      error.code === "HPE_HEADER_OVERFLOW"
        ? [
            431,
            "Request Header Fields Too Large",
            new RunnerDepotError("HEADERS_TOO_LARGE", "Request headers are too large"),
          ]
        : error.code === "ERR_HTTP_REQUEST_TIMEOUT"
          ? [
              408,
              "Request Timeout",
              new RunnerDepotError(
                "REQUEST_TIMEOUT",
                `The request headers did not arrive within ${headersTimeoutMs} ms`,
              ),
            ]
          : [400, "Bad Request", new RunnerDepotError("BAD_REQUEST", "Malformed HTTP request")];
    const body = JSON.stringify(failure.toProblem());
    socket.end(
      `HTTP/1.1 ${status} ${text}\r\nContent-Type: application/problem+json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
    );
  });
}
