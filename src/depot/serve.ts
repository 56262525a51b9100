/**
 * Serving the depot router on node:http through srvx, whose Node adapter hands the router
 * native streaming request bodies (nothing is buffered whole).
 */
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { toNodeHandler } from "srvx/node";
import { RunnerDepotError } from "../errors.js";
import { isLoopbackHost } from "../net.js";

/**
 * What {@link servePackageRouter} serves: a depot router, or any web-standard fetch
 * handler wrapping one (a host adding its own routes in front of the depot).
 */
export interface FetchHandler {
  fetch(request: Request): Promise<Response>;
  /** False only when every request is authorized; a handler without it counts as open. */
  readonly isOpen?: boolean;
}

/** Options of {@link servePackageRouter}. */
export interface ServePackageRouterOptions {
  /** Interface to bind (default 127.0.0.1). */
  host?: string;
  /** Port (default 0: the OS picks). */
  port?: number;
  /** Allow an open router (no authorize hook) on a non-loopback address. */
  insecure?: boolean;
  /** Node's own header limit, above which it answers 431 before the router sees the request (default 64 KiB). */
  maxHeaderSize?: number;
}

/** A listening depot server. */
export interface PackageServer {
  /** Base URL, e.g. `http://127.0.0.1:41234`. */
  url: string;
  port: number;
  /** The node:http server (for hosts that need it). */
  server: Server;
  /** Stops listening and closes every connection. */
  close(): Promise<void>;
}

/**
 * Serves a depot router on node:http. An open router (no authorize hook) is refused on any
 * address but loopback unless `insecure` is set.
 *
 * @example
 * const server = await servePackageRouter(createPackageRouter(createFsStore(dir)), { port: 8080 });
 * console.log(server.url); // http://127.0.0.1:8080
 */
export async function servePackageRouter(router: FetchHandler, options: ServePackageRouterOptions = {}): Promise<PackageServer> {
  const host = options.host ?? "127.0.0.1";
  if (router.isOpen !== false && !isLoopbackHost(host) && !options.insecure) {
    throw new RunnerDepotError(
      "FAILED_PRECONDITION",
      `Refusing to serve an open depot (no authorize hook) on ${host}: give the router an authorize hook, bind a loopback address, or pass insecure: true`,
    );
  }
  const handler = toNodeHandler((request: Request) => router.fetch(request));
  const server = createServer(
    {
      maxHeaderSize: options.maxHeaderSize ?? 64 * 1024,
      // Uploads of up to 2 GiB on slow links: no whole-request deadline, only idle ones.
      requestTimeout: 0,
    },
    (req, res) => void handler(req as never, res as never),
  );
  server.on("clientError", (error: NodeJS.ErrnoException, socket) => {
    if (!socket.writable) return socket.destroy();
    const tooLarge = error.code === "HPE_HEADER_OVERFLOW";
    const problem = tooLarge
      ? new RunnerDepotError("HEADERS_TOO_LARGE", "Request headers are too large").toProblem()
      : new RunnerDepotError("BAD_REQUEST", "Malformed HTTP request").toProblem();
    const body = JSON.stringify(problem);
    socket.end(
      `HTTP/1.1 ${problem.status} ${tooLarge ? "Request Header Fields Too Large" : "Bad Request"}\r\n` +
        `Content-Type: application/problem+json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
    );
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(options.port ?? 0, host, () => {
      server.off("error", reject);
      resolve();
    });
  });
  const port = (server.address() as AddressInfo).port;
  const shown = host.includes(":") ? `[${host}]` : host;
  let closing: Promise<void> | undefined;
  return {
    url: `http://${shown}:${port}`,
    port,
    server,
    close() {
      closing ??= new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      });
      return closing;
    },
  };
}
