/**
 * `createRunnerHandler`: the HTTP/2 request handler of a runner service (gRPC, gRPC-web
 * and Connect on one listener) — the gRPC fast path first, connect-node for the rest,
 * both reading request bodies within the same bounds (runner/server/request-reader.ts, runner/server/read-budget.ts),
 * and the shutdown of the calls in flight. startRunnerServer (runner/server/start-server.ts) uses it; hosts
 * with their own HTTP/2 server mount it directly.
 */
import { setMaxListeners } from "node:events";
import * as http2 from "node:http2";
import { createConnectPath } from "./connect-path.js";
import { createStreamLogsFastPath } from "./fast-path.js";
import { specGrpcMessages } from "../protocol/grpc-message.js";
import { createReadBudget, type RunnerReadLimits } from "./read-budget.js";
import { kCallJob, kMessageBytes, kShutdownSignal, type RunnerService } from "../service/runner-service.js";
import { CallValues, kCallPeer } from "./call-context.js";
import { createRunnerHealth, isHealthPath, type RunnerHealth } from "./health.js";
import { backlogOf } from "../service/store-backlog.js";
import { cancelIfNotDrained } from "./answer-drain.js";

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
  /**
   * Bounds on the request bytes held in memory (first message before authentication, per
   * connection, per server); unset members keep the defaults of RunnerReadLimits.
   */
  readLimits?: Partial<RunnerReadLimits>;
  /**
   * gRPC health checking (`grpc.health.v1.Health` Check, List and Watch) on the same
   * listener: a RunnerHealth of your own, or false to serve none; default a new one,
   * SERVING until `shutdown` starts (see {@link RunnerHandler.health}).
   */
  health?: RunnerHealth | false;
}

/** What a shutdown (or a server's drain) came to. */
export interface RunnerDrainReport {
  /** Calls in flight when the shutdown started. */
  inFlight: number;
  /** Calls still running at the end of the grace time, ended UNAVAILABLE (with `runner-committed`). */
  cut: number;
  /**
   * The request IDs (job ids) of the cut calls, in the order the calls started. A cut call
   * that had not passed authentication yet names no job: it counts in `cut` only.
   */
  cutRequestIds: string[];
}

/** A Node HTTP/2 request handler serving the runner service, and what its host needs to shut it down. */
export interface RunnerHandler {
  /** The request listener (`http2Server.on("request", handler)`); answers gRPC, gRPC-web and Connect. */
  handler: (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => void;
  /**
   * The same as a listener of the server's raw 'stream' event (`http2Server.on("stream",
   * stream)`, instead of `handler`, never beside it): a plain gRPC StreamLogs call is served
   * on the stream itself, without the compatibility layer's request and response (about
   * 6 KiB a call, and a second Readable every chunk goes through); any other request gets
   * them, made as Node's 'request' event would make them, and goes to `handler`.
   * startRunnerServer mounts this one.
   */
  stream: (
    stream: http2.ServerHttp2Stream,
    headers: http2.IncomingHttpHeaders,
    flags: number,
    rawHeaders: string[],
  ) => void;
  /**
   * Lets calls in flight run for `graceMs`, then ends them UNAVAILABLE (with
   * `runner-committed`) and resolves once their responses are out (or given up on).
   */
  shutdown(graceMs?: number): Promise<RunnerDrainReport>;
  /**
   * The health service served on this handler (null with `health: false`). `shutdown` sets
   * it NOT_SERVING when it starts and ends its Watch calls when it is done; set it
   * NOT_SERVING yourself earlier to take the host out of rotation before stopping.
   */
  readonly health: RunnerHealth | null;
  /** Requests in progress (health calls not counted). */
  readonly activeRequests: number;
  /** Bytes of request messages not yet fully arrived, held in memory right now (what RunnerReadLimits caps). */
  readonly heldBytes: number;
}

/**
 * Creates the HTTP/2 request handler of a runner service, for hosts with their own server.
 * Advertise a bounded header list there as startRunnerServer does (`settings: {
 * maxHeaderListSize: 16384 }`): the handler runs after the headers are decoded (HPACK amplification).
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
  // Calls in flight, by their key: the response, or the stream of a call served raw.
  const active = new Set<object>();
  // The job of each call in flight, once the service has authenticated it (kCallJob).
  const jobOf = new Map<object, string>();
  const idle = new Set<() => void>();
  const messageBytes = options.messageBytes ?? runner.limits.messageBytes;
  // One budget for every call of this handler: the per-connection and per-server caps.
  const budget = createReadBudget(options.readLimits);
  const contextValues = (call: object) =>
    new CallValues()
      .set(kShutdownSignal, shutdownController.signal)
      .set(kMessageBytes, options.messageBytes)
      .set(kCallJob, (requestId: string) => {
        if (active.has(call)) jobOf.set(call, requestId);
      })
      .set(kCallPeer, () => peerOf(call));
  const health = options.health === false ? null : (options.health ?? createRunnerHealth());
  // The service's store backlog, when it is runner-depot's own (runner/service/store-backlog.ts).
  const paths = {
    messageBytes,
    budget,
    requestPathPrefix: options.requestPathPrefix,
    contextValues,
    health,
    backlog: backlogOf(runner),
  };
  const connectPath = createConnectPath(runner, paths);
  // connect-node's per-message pipeline caps a stream at ~120k items/s; plain gRPC
  // StreamLogs calls skip it (same service, same response writer).
  const fastPath = options.fastPath === false ? null : createStreamLogsFastPath(runner, paths);

  const handler = (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => {
    // A health Watch lasts as long as its prober likes: it never holds a shutdown up.
    const counted = !isHealthPath(req.url, options.requestPathPrefix);
    if (counted) active.add(res);
    let done = false;
    const finished = () => {
      if (done) return;
      done = true;
      active.delete(res);
      jobOf.delete(res);
      // The response is out but the client may still be sending (the call ended early):
      // reset the stream with NO_ERROR, as gRPC servers do, so it never stays half open.
      const stream = req.stream;
      // The RST must follow the trailers: the response sends them on 'wantTrailers'
      // (its listener runs before ours), so reset right after, never before.
      if (stream && !stream.destroyed && !stream.closed) {
        // A client that never lets the answer out must not keep the stream (runner/server/answer-drain.ts).
        cancelIfNotDrained(stream);
        if (stream.sentTrailers) setImmediate(resetStream, stream, 0);
        else {
          stream.once("wantTrailers", () => setImmediate(resetStream, stream, 0));
          // A response without trailers: reset once its last frame is out.
          stream.once("finish", () => setTimeout(resetStream, 100, stream, 0).unref());
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
    // Comes once; on() keeps no once() wrapper per open call.
    res.on("close", finished);
    if (fastPath !== null && fastPath.request(req, res)) return;
    // grpc-message in the spec's percent-encoding (connect's reads as %3A in grpc-js); the
    // fast path writes its trailers in that form itself.
    specGrpcMessages(res);
    connectPath(req, res);
  };

  /**
   * A call served raw ends when its trailers are asked for or when its stream closes first.
   * Why: docs/decisions/runner-server.md, "handler.ts: inside createRunnerHandler".
   */
  function endRawCall(this: http2.ServerHttp2Stream): void {
    if (!active.delete(this)) return;
    jobOf.delete(this);
    if (!this.destroyed && !this.closed) process.nextTick(resetSoon, this);
    if (active.size === 0) for (const wake of idle) wake();
  }

  const streamHandler = (
    stream: http2.ServerHttp2Stream,
    headers: http2.IncomingHttpHeaders,
    _flags: number,
    rawHeaders: string[],
  ) => {
    // A request with an `expect` header goes the compatibility way, which answers it first
    // (100 Continue, or 417) as the 'request' entry does; the fast path would ignore it.
    if (fastPath !== null && headers.expect === undefined && fastPath.stream(stream, headers)) {
      active.add(stream);
      // Both come once: on(), no once() wrapper per open call.
      stream.on("wantTrailers", endRawCall);
      stream.on("close", endRawCall);
      return;
    }
    viaCompatibilityLayer(stream, headers, rawHeaders, handler);
  };

  return {
    handler,
    stream: streamHandler,
    health,
    get activeRequests() {
      return active.size;
    },
    get heldBytes() {
      return budget.serverHeld;
    },
    async shutdown(graceMs = 5000) {
      health?.setStatus("NOT_SERVING");
      const inFlight = active.size;
      if (active.size > 0 && graceMs > 0) await waitIdle(graceMs);
      const cut = active.size;
      // Named before the abort: each cut call leaves `active` as its answer goes out.
      const cutRequestIds: string[] = [];
      for (const res of active) {
        const id = jobOf.get(res);
        if (id !== undefined) cutRequestIds.push(id);
      }
      shutdownController.abort();
      // Calls end UNAVAILABLE now; give their responses a moment to be written.
      if (active.size > 0) await waitIdle(2000);
      health?.close();
      return { inFlight, cut, cutRequestIds };
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

/**
 * What Node's compatibility layer does for its 'request' event (onServerStream): the
 * request and response objects, CONNECT answered 405, an `expect` other than 100-continue
 * 417 (100 Continue sent for that one), then `handler`. O(headers).
 */
function viaCompatibilityLayer(
  stream: http2.ServerHttp2Stream,
  headers: http2.IncomingHttpHeaders,
  rawHeaders: string[],
  handler: (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => void,
): void {
  const req = new http2.Http2ServerRequest(stream, headers, {}, rawHeaders);
  const res = new http2.Http2ServerResponse(stream);
  if (headers[":method"] === "CONNECT") {
    res.statusCode = http2.constants.HTTP_STATUS_METHOD_NOT_ALLOWED;
    res.end();
    return;
  }
  if (headers.expect !== undefined) {
    if (headers.expect !== "100-continue") {
      res.statusCode = http2.constants.HTTP_STATUS_EXPECTATION_FAILED;
      res.end();
      return;
    }
    res.writeContinue();
  }
  handler(req, res);
}

/** {@link resetStream} from the next turn's immediates. */
function resetSoon(stream: http2.Http2Stream): void {
  setImmediate(resetStream, stream, 0);
}

/**
 * Resets a stream whose response is out with NO_ERROR, once its last frames have left the session: nghttp2 drops
 * frames still queued for a stream it resets.
 * Why: docs/decisions/runner-server.md, "handler.ts: resetStream".
 */
function resetStream(stream: http2.Http2Stream, tries: number): void {
  if (stream.destroyed || stream.closed) return;
  const queued = stream.session?.state.outboundQueueSize ?? 0;
  if (queued > 0 && tries < 400) {
    if (tries < 100) setImmediate(resetStream, stream, tries + 1);
    else setTimeout(resetStream, 5, stream, tries + 1).unref();
    return;
  }
  try {
    stream.close(http2.constants.NGHTTP2_NO_ERROR);
  } catch {
    // The stream went away meanwhile.
  }
}

/** The remote address of a call's connection (`call`: its response or its raw stream), if known. O(1). */
function peerOf(call: object): string | undefined {
  const stream = call instanceof http2.Http2ServerResponse ? call.stream : (call as http2.Http2Stream);
  return stream?.session?.socket?.remoteAddress;
}
