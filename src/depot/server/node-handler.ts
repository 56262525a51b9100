/**
 * The depot router as a node:http request listener (also for Express and Fastify), moving blob bytes as Node
 * Buffers: an upload is read straight from the IncomingMessage into the store's putBlob, and a download is
 * written from the store's stream (the fs store's file stream) to the ServerResponse with backpressure, with
 * no Web-stream conversion per chunk (depot/server/native-body.ts).
 * Why: docs/decisions/depot-server.md, "node-handler.ts: blob bytes without Web streams".
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import { RunnerDepotError } from "../../errors.js";
import { isBorrowed } from "../store/blob-chunks.js";
import { nativeResponseBody, setNativeRequestBody, setRequestClient } from "./native-body.js";
import { lazyWebStream, webChunks } from "./web-streams.js";

/** What the handler serves: a depot router or a fetch handler wrapping one. */
export interface NodeFetchHandler {
  fetch(request: Request): Promise<Response>;
}

/** Options of {@link createNodeHandler}. */
export interface NodeHandlerOptions {
  /**
   * A request body that receives no byte for this long is answered 408 `REQUEST_TIMEOUT`, ms (default 30,000; 0:
   * never). A slow but moving upload is never cut.
   */
  bodyIdleMs?: number;
  /** A response the client reads nothing of for this long is cut, ms (default 60,000; 0: never). */
  sendIdleMs?: number;
  /** Called with unexpected faults (the router's own 5xx are reported by its `onError`). */
  onError?: (error: unknown) => void;
}

/** A node:http request listener; Express and Fastify hosts call it with the raw request and response. */
export type NodeHandler = (req: IncomingMessage, res: ServerResponse) => Promise<void>;

/**
 * Creates a node:http listener for a depot router. Mount it where the router's `base`
 * is: the handler uses `req.originalUrl` when present (Express), so `app.use("/depot", h)`
 * and `app.all("/depot/{*rest}", h)` both work.
 *
 * @example
 * const depot = createPackageRouter(createFsStore("/var/lib/depot"), { base: "/depot" });
 * const handler = createNodeHandler(depot);
 * http.createServer((req, res) => void handler(req, res)).listen(8080);
 */
export function createNodeHandler(router: NodeFetchHandler, options: NodeHandlerOptions = {}): NodeHandler {
  const bodyIdleMs = options.bodyIdleMs ?? 30_000;
  const sendIdleMs = options.sendIdleMs ?? 60_000;
  const onError = options.onError ?? ((error: unknown) => console.error("runner-depot: node handler error", error));
  return async (req, res) => {
    const body = hasBody(req) ? guardBody(req, bodyIdleMs) : undefined;
    let response: Response;
    try {
      response = FETCH_FORBIDDEN_METHODS.has((req.method ?? "").toUpperCase())
        ? await refuseMethod(router, req)
        : await router.fetch(toRequest(req, body, res));
    } catch (error) {
      response = problem(
        error instanceof RunnerDepotError
          ? error
          : new RunnerDepotError("INTERNAL", "internal error", { cause: error }),
      );
      if (!(error instanceof RunnerDepotError)) onError(error);
    } finally {
      body?.stop();
    }
    try {
      await writeResponse(req, res, response, sendIdleMs);
    } catch (error) {
      if (!res.destroyed) res.destroy();
      if (!isDisconnect(error)) onError(error);
    }
  };
}

function hasBody(req: IncomingMessage): boolean {
  if (req.method === "GET" || req.method === "HEAD") return false;
  if (req.headers["transfer-encoding"] !== undefined) return true;
  const length = req.headers["content-length"];
  return length !== undefined && length !== "0";
}

/** Methods Node's parser accepts but a fetch `Request` cannot carry (it throws TypeError). */
const FETCH_FORBIDDEN_METHODS = new Set(["TRACE", "TRACK"]);

/**
 * The answer to a method `Request` cannot carry: what the router says of the same path for
 * a method it serves nowhere (OPTIONS: 404, or 405 with Allow), in this method's words.
 * The depot serves no TRACE, so no request ever needs the real method.
 */
async function refuseMethod(router: NodeFetchHandler, req: IncomingMessage): Promise<Response> {
  const probe = await router.fetch(toRequest({ ...pick(req), method: "OPTIONS" } as IncomingMessage, undefined));
  if (probe.status !== 405) return probe;
  await probe.body?.cancel();
  const allow = probe.headers.get("allow") ?? "";
  const response = problem(
    new RunnerDepotError(
      "METHOD_NOT_ALLOWED",
      `${(req.method ?? "").slice(0, 20)} is not allowed here; allowed: ${allow}`,
      { details: { allow } },
    ),
  );
  response.headers.set("Allow", allow);
  return response;
}

/** The parts of a request toRequest reads. */
function pick(
  req: IncomingMessage,
): Pick<IncomingMessage, "url" | "headers" | "rawHeaders" | "method"> & { originalUrl?: string } {
  return {
    url: req.url,
    headers: req.headers,
    rawHeaders: req.rawHeaders,
    method: req.method,
    originalUrl: (req as IncomingMessage & { originalUrl?: string }).originalUrl,
  };
}

/** The origin requests are resolved against when the Host header is not a usable authority. */
const FALLBACK_ORIGIN = "http://localhost";

/**
 * The Request the router sees.
 * Why: docs/decisions/depot-server.md, "node-handler.ts: toRequest".
 */
function toRequest(req: IncomingMessage, body: GuardedBody | undefined, res?: ServerResponse): Request {
  const url = requestUrl(
    (req as IncomingMessage & { originalUrl?: string }).originalUrl ?? req.url ?? "/",
    req.headers.host,
  );
  const headers = new Headers();
  const raw = req.rawHeaders;
  for (let i = 0; i + 1 < raw.length; i += 2) {
    // Node's parser already refused malformed fields; ':'-prefixed ones come from HTTP/2.
    if (!raw[i]!.startsWith(":")) headers.append(raw[i]!, raw[i + 1]!);
  }
  const init: RequestInit & { duplex?: "half" } = { method: req.method, headers };
  if (body) {
    init.body = lazyWebStream(() => body.chunks);
    init.duplex = "half";
  }
  const request = new Request(url, init);
  if (body) setNativeRequestBody(request, body.chunks);
  if (res) setRequestClient(request, res);
  return request;
}

/**
 * The request's URL. An origin-form target is appended to the origin as a string, never
 * resolved against it: `//catalog` is the path `//catalog`, not the host `catalog`. An
 * absolute-form target (a proxy's) is taken whole; anything else (`*`) is refused.
 */
function requestUrl(target: string, host: string | undefined): URL {
  if (target.startsWith("/")) {
    try {
      return new URL(`http://${host ?? "localhost"}${target}`);
    } catch {
      // A Host that is no authority (Node passes any text): the path still stands.
      return new URL(`${FALLBACK_ORIGIN}${target}`);
    }
  }
  if (/^https?:\/\//i.test(target) && URL.canParse(target)) return new URL(target);
  throw new RunnerDepotError("BAD_REQUEST", "The request target must be a path (origin form) or an absolute http URL");
}

interface GuardedBody {
  chunks: AsyncIterable<Uint8Array>;
  /** Stops the watchdog (the router answered). */
  stop(): void;
}

/**
 * The request's bytes, failing with 408 REQUEST_TIMEOUT once no byte has arrived for
 * `idleMs` while the server was ready for more (a body waiting on a slow store is the
 * server's doing, not the client's, and never times out).
 */
function guardBody(req: IncomingMessage, idleMs: number): GuardedBody {
  let expired: RunnerDepotError | undefined;
  let wake: ((error: RunnerDepotError) => void) | undefined;
  let lastBytes = req.socket.bytesRead;
  let lastProgress = Date.now();
  const timer =
    idleMs > 0
      ? setInterval(
          () => {
            if (req.complete || req.destroyed) return stop();
            const bytes = req.socket.bytesRead;
            const serverBusy = req.readableLength >= req.readableHighWaterMark;
            if (bytes !== lastBytes || serverBusy) {
              lastBytes = bytes;
              lastProgress = Date.now();
              return;
            }
            if (Date.now() - lastProgress < idleMs) return;
            expired = new RunnerDepotError("REQUEST_TIMEOUT", `The request body made no progress for ${idleMs} ms`);
            wake?.(expired);
            stop();
          },
          Math.max(10, Math.min(1000, idleMs / 4)),
        )
      : undefined;
  timer?.unref();
  function stop(): void {
    if (timer) clearInterval(timer);
  }
  async function* chunks(): AsyncGenerator<Uint8Array> {
    const iterator = req[Symbol.asyncIterator]() as AsyncIterator<Buffer>;
    try {
      for (;;) {
        if (expired) throw expired;
        const next = await new Promise<IteratorResult<Buffer>>((resolve, reject) => {
          wake = reject;
          iterator.next().then(resolve, reject);
        });
        wake = undefined;
        if (next.done) return;
        yield next.value;
      }
    } finally {
      wake = undefined;
      // A body left unread (error, timeout) is not drained: the response closes the connection.
      if (!req.complete) req.pause();
    }
  }
  return { chunks: chunks(), stop };
}

async function writeResponse(
  req: IncomingMessage,
  res: ServerResponse,
  response: Response,
  sendIdleMs: number,
): Promise<void> {
  const headers: Record<string, string | string[]> = {};
  response.headers.forEach((value, name) => {
    if (name !== "set-cookie") headers[name] = value;
  });
  const cookies = response.headers.getSetCookie();
  if (cookies.length > 0) headers["set-cookie"] = cookies;
  // A body the router did not read to its end (an error, a timeout) cannot be followed by
  // another request on this connection without draining it: close instead.
  if (hasBody(req) && !req.complete) headers.connection = "close";
  res.writeHead(response.status, response.statusText || undefined, headers);
  const native = nativeResponseBody(response);
  if (req.method === "HEAD" || response.body === null) {
    res.end();
    return;
  }
  const source: AsyncIterable<Uint8Array> = native ? native() : webChunks(response.body, res);
  for await (const chunk of source) {
    if (res.destroyed) break;
    // A borrowed chunk's buffer is refilled once the next chunk is asked for: wait until
    // the socket no longer holds it (the next chunk is being read meanwhile).
    if (isBorrowed(chunk)) await written(res, chunk, sendIdleMs);
    else if (!res.write(chunk)) await drained(res, sendIdleMs);
  }
  if (!res.destroyed) res.end();
  else if (!native) await response.body.cancel().catch(() => undefined);
}

/**
 * Writes `chunk` and waits until the socket has handed it to the kernel (its write callback), so the buffer may
 * be reused.
 * Why: docs/decisions/depot-server.md, "node-handler.ts: written".
 */
function written(res: ServerResponse, chunk: Uint8Array, idleMs: number): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    let settled = false;
    const timer =
      idleMs > 0
        ? setTimeout(
            () => done(new RunnerDepotError("REQUEST_TIMEOUT", "The client stopped reading the response")),
            idleMs,
          )
        : undefined;
    const onClose = () => done(Object.assign(new Error("client went away"), { code: "ECONNRESET" }));
    function done(error?: Error | null): void {
      if (settled) return;
      settled = true;
      if (timer) clearTimeout(timer);
      res.off("close", onClose);
      if (error) {
        if (!res.destroyed) res.destroy();
        reject(error);
      } else resolve();
    }
    res.on("close", onClose);
    // node:http does not call back a write to a socket already destroyed: 'close' covers it.
    res.write(chunk, (error) => done(error));
  });
}

/** Waits for `drain`; a client that reads nothing for `idleMs` (or leaves) ends the response. */
function drained(res: ServerResponse, idleMs: number): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    const timer =
      idleMs > 0
        ? setTimeout(
            () => done(new RunnerDepotError("REQUEST_TIMEOUT", "The client stopped reading the response")),
            idleMs,
          )
        : undefined;
    const onDrain = () => done();
    const onClose = () => done(Object.assign(new Error("client went away"), { code: "ECONNRESET" }));
    function done(error?: Error): void {
      if (timer) clearTimeout(timer);
      res.off("drain", onDrain);
      res.off("close", onClose);
      if (error) reject(error);
      else resolve();
    }
    res.on("drain", onDrain);
    res.on("close", onClose);
  });
}

function problem(error: RunnerDepotError): Response {
  const { wwwAuthenticate: _w, allow: _a, ...body } = error.toProblem() as Record<string, unknown>;
  return new Response(JSON.stringify(body), {
    status: error.status,
    headers: { "Content-Type": "application/problem+json", "Cache-Control": "no-store" },
  });
}

function isDisconnect(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  return (
    code === "ECONNRESET" ||
    code === "EPIPE" ||
    code === "ERR_STREAM_DESTROYED" ||
    code === "ERR_STREAM_PREMATURE_CLOSE" ||
    code === "REQUEST_TIMEOUT"
  );
}
