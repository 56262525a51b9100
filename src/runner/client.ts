/**
 * The VM side of runner.v1: a gRPC client for `Runner/StreamLogs` that keeps every
 * unacknowledged item in a spool, cuts its stream into short client-streaming calls,
 * and replays from the server's `runner-committed` after any failure, so no line is
 * lost or duplicated.
 *
 * It speaks gRPC over HTTP/2 directly on node:http2 instead of through a connect-es
 * transport: the transport serialises and writes one message at a time, which caps a
 * single stream at about 20–30k lines/s, while this client encodes each item once
 * into packed frames (see encoder.ts, spool.ts) and writes them in 64 KiB slices.
 */
import http2 from "node:http2";
import { gunzipSync, inflateSync } from "node:zlib";
import { fromBinary } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { RunnerDepotError } from "../errors.js";
import { AckSchema, LogItemSchema } from "../gen/runner/v1/runner_pb.js";
import { createLogItemEncoder, type JobEndFields, utf8Length } from "./encoder.js";
import { DEFAULT_MAX_LINE_BYTES, splitUtf8 } from "./line-splitter.js";
import { createSpool } from "./spool.js";
import { isRequestId } from "./uuid.js";

const PATH = "/runner.v1.Runner/StreamLogs";
/** grpc-status 0 (connect-es has no `Code.OK`: it never reports success as a code). */
const GRPC_OK = 0 as Code;
/** Codes after which retrying cannot help (runner-protocol.md, "Status codes"). */
const GIVE_UP = new Set<Code>([
  Code.InvalidArgument,
  Code.Unauthenticated,
  Code.PermissionDenied,
  Code.NotFound,
  Code.Unimplemented,
]);
/** Smallest line limit RESOURCE_EXHAUSTED may push the client down to. */
const MIN_SPLIT_BYTES = 1024;

/** TLS settings for an `https://` endpoint (passed to `http2.connect`). */
export interface RunnerClientTlsOptions {
  /** CA certificate(s) to trust (PEM), e.g. the orchestrator's private CA. */
  ca?: string | Buffer | Array<string | Buffer>;
  /** Client certificate (PEM) for mutual TLS. */
  cert?: string | Buffer;
  /** Client private key (PEM) for mutual TLS. */
  key?: string | Buffer;
  /** Server name to verify, when it differs from the endpoint's host. */
  servername?: string;
  /** Default true; false only for tests. */
  rejectUnauthorized?: boolean;
}

/** Options of {@link createRunnerClient}. */
export interface RunnerClientOptions {
  /** `http://host:port` (h2c) or `https://host:port` (TLS). */
  endpoint: string;
  /** The job's UUID; every item carries it (sent lower-case). */
  requestId: string;
  /** Per-job token, sent as `authorization: Bearer <token>`; omit for an open server. */
  token?: string;
  /** TLS settings for `https://` endpoints. */
  tls?: RunnerClientTlsOptions;
  /** Cut a call after about this many bytes of frames. Default 1 MiB. */
  maxCallBytes?: number;
  /** Cut a call this long after it started. Default 1000 ms. */
  maxCallMs?: number;
  /** Longer lines are split at a UTF-8 boundary. Default 64 KiB (the contract's limit). */
  maxLineBytes?: number;
  /** Give up when calls have kept failing for this long (since the first failure after a success). Default 10 minutes. */
  deadlineMs?: number;
  /** Jittered exponential back-off between retries. Default 100 ms doubling to 10 s. */
  backoff?: { initialMs?: number; maxMs?: number };
  /** `log()` returns false while the spool holds more than this. Default 64 MiB. */
  highWaterMarkBytes?: number;
  /** A call whose response takes longer after the request ended is cancelled and retried. Default 60 s. */
  responseTimeoutMs?: number;
  /** Connecting longer than this counts as a network error. Default 10 s. */
  connectTimeoutMs?: number;
  /** HTTP/2 PING interval while a call is open; an unanswered ping drops the connection. Default 20 s. */
  keepaliveMs?: number;
  /** Told about every failed call that will be retried (for logging). */
  onRetry?: (error: RunnerDepotError, delayMs: number) => void;
}

/** Why a client stopped before its end was acknowledged. */
export interface RunnerStop {
  /** `cancelled`, `lost` or `ended` (from `runner-reason` on an Ack with ok = false), or `failed`. */
  reason: string;
  /** Set when `reason` is `failed`: the error the client gave up on. */
  error?: RunnerDepotError;
}

/** Counters of a client, for logs and benchmarks. */
export interface RunnerClientStats {
  /** Lines logged, after splitting. */
  lines: { stdout: number; stderr: number };
  /** Calls started. */
  calls: number;
  /** Failed calls that were retried. */
  retries: number;
  /** Last `runner-committed` seen. */
  committed: number;
  /** Items handed to the client (the next item's offset). */
  items: number;
  /** Bytes the spool holds. */
  spoolBytes: number;
}

/** What {@link createRunnerClient} returns. */
export interface RunnerClient {
  /** Queues one output line; false when the spool is over its high-water mark (wait for `drained()`). */
  log(line: string, stderr?: boolean): boolean;
  /** Queues the job end and resolves once the orchestrator acknowledged it. */
  end(end: JobEndFields): Promise<void>;
  /** Resolves once everything queued so far is acknowledged (cuts the current call short). */
  flush(): Promise<void>;
  /** Resolves when the spool is back under half its high-water mark. */
  drained(): Promise<void>;
  /** Calls `cb` once if the client stops (Ack ok = false, or it gave up); returns an unsubscribe. */
  onStop(cb: (stop: RunnerStop) => void): () => void;
  /** Resolves if the client stops (never when the job ends normally). */
  readonly stopped: Promise<RunnerStop>;
  /** Counters. */
  readonly stats: RunnerClientStats;
  /** Cancels the call in flight and closes the connection; pending promises reject. */
  close(): Promise<void>;
}

interface Call {
  req: http2.ClientHttp2Stream;
  session: http2.ClientHttp2Session;
  from: number;
  sentTo: number;
  bytes: number;
  ending: boolean;
  waitingDrain: boolean;
  cut: boolean;
  headers?: http2.IncomingHttpHeaders;
  trailers?: http2.IncomingHttpHeaders;
  data: Buffer[];
  error?: Error;
  timedOut?: boolean;
  timer?: NodeJS.Timeout;
}

interface Waiter {
  to: number;
  resolve: () => void;
  reject: (e: unknown) => void;
}

/**
 * Creates a runner client for one job.
 *
 * @example
 * const client = createRunnerClient({ endpoint: "http://10.0.0.1:50051", requestId, token });
 * client.log("hello");
 * await client.end({ exitCode: 0, success: true, repoUrl, commitSha });
 * await client.close();
 */
export function createRunnerClient(options: RunnerClientOptions): RunnerClient {
  if (!isRequestId(options.requestId)) {
    throw new RunnerDepotError("INVALID_ARGUMENT", `requestId is not a UUID: ${JSON.stringify(options.requestId)}`);
  }
  const url = parseEndpoint(options.endpoint);
  const requestId = options.requestId.toLowerCase();
  const maxCallBytes = options.maxCallBytes ?? 1024 * 1024;
  const maxCallMs = options.maxCallMs ?? 1000;
  let maxLineBytes = options.maxLineBytes ?? DEFAULT_MAX_LINE_BYTES;
  const deadlineMs = options.deadlineMs ?? 600_000;
  const backoffInitial = options.backoff?.initialMs ?? 100;
  const backoffMax = options.backoff?.maxMs ?? 10_000;
  const highWater = options.highWaterMarkBytes ?? 64 * 1024 * 1024;
  const responseTimeoutMs = options.responseTimeoutMs ?? 60_000;
  const connectTimeoutMs = options.connectTimeoutMs ?? 10_000;
  const keepaliveMs = options.keepaliveMs ?? 20_000;
  if (maxLineBytes < 4) throw new RunnerDepotError("INVALID_ARGUMENT", "maxLineBytes must be at least 4");

  const enc = createLogItemEncoder(requestId);
  const spool = createSpool();
  const baseHeaders: http2.OutgoingHttpHeaders = {
    ":method": "POST",
    // A path in the endpoint is the prefix the host mounted the service under.
    ":path": `${url.pathname.replace(/\/+$/, "")}${PATH}`,
    "content-type": "application/grpc",
    te: "trailers",
    "user-agent": "runner-depot-agent",
  };
  if (options.token !== undefined && options.token !== "") baseHeaders.authorization = `Bearer ${options.token}`;

  let state: "open" | "ending" | "ended" | "stopped" | "closed" = "open";
  let committed = 0;
  let endOffset: number | null = null;
  let session: http2.ClientHttp2Session | null = null;
  let call: Call | null = null;
  let retryTimer: NodeJS.Timeout | null = null;
  let keepaliveTimer: NodeJS.Timeout | null = null;
  let scheduled = false;
  let flushing = false;
  let attempts = 0;
  /** When the current run of failures began (null while calls succeed). */
  let failingSince: number | null = null;
  let waiters: Waiter[] = [];
  let drainWaiters: Array<() => void> = [];
  const stopCallbacks = new Set<(s: RunnerStop) => void>();
  let stopInfo: RunnerStop | null = null;
  let stopResolve!: (s: RunnerStop) => void;
  const stopped = new Promise<RunnerStop>((r) => (stopResolve = r));
  const stats: RunnerClientStats = {
    lines: { stdout: 0, stderr: 0 },
    calls: 0,
    retries: 0,
    committed: 0,
    items: 0,
    spoolBytes: 0,
  };

  function getSession(): http2.ClientHttp2Session {
    if (session !== null && !session.closed && !session.destroyed) return session;
    const s = http2.connect(url.origin, {
      ...(url.protocol === "https:" ? options.tls : {}),
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

  function schedule(): void {
    if (scheduled) return;
    scheduled = true;
    // Let a burst of log() calls (one pipe read holds many lines) land before writing.
    setImmediate(() => {
      scheduled = false;
      if (call !== null) pump();
      else kick();
    });
  }

  function kick(): void {
    if ((state !== "open" && state !== "ending") || call !== null || retryTimer !== null) return;
    if (committed < spool.end) startCall();
  }

  function startCall(): void {
    let s: http2.ClientHttp2Session;
    let req: http2.ClientHttp2Stream;
    try {
      s = getSession();
      req = s.request({ ...baseHeaders, "runner-offset": String(committed) });
    } catch (e) {
      session?.destroy();
      session = null;
      retry(networkError(e));
      return;
    }
    stats.calls++;
    s.ref();
    const c: Call = {
      req,
      session: s,
      from: committed,
      sentTo: committed,
      bytes: 0,
      ending: false,
      waitingDrain: false,
      cut: false,
      data: [],
    };
    call = c;
    c.timer = setTimeout(() => {
      c.cut = true;
      pump();
    }, maxCallMs);
    req.on("response", (h) => (c.headers = h));
    req.on("data", (d: Buffer) => c.data.push(d));
    req.on("trailers", (t) => (c.trailers = t));
    req.on("error", (e) => (c.error ??= e));
    req.on("end", () => {
      // The server answered before we finished sending (an error): stop writing.
      if (!c.ending) {
        c.ending = true;
        req.close(http2.constants.NGHTTP2_CANCEL);
      }
    });
    req.on("close", () => onCallClosed(c));
    startKeepalive(s);
    pump();
  }

  function pump(): void {
    const c = call;
    if (c === null || c.ending || c.waitingDrain) return;
    while (c.sentTo < spool.end && c.bytes < maxCallBytes) {
      const slice = spool.slice(c.sentTo, Math.min(maxCallBytes - c.bytes, 256 * 1024));
      if (slice.to === c.sentTo) break;
      let ok = true;
      for (const b of slice.buffers) ok = c.req.write(b);
      c.bytes += slice.bytes;
      c.sentTo = slice.to;
      if (!ok) {
        c.waitingDrain = true;
        c.req.once("drain", () => {
          c.waitingDrain = false;
          pump();
        });
        return;
      }
    }
    const endSent = endOffset !== null && c.sentTo > endOffset;
    const allSent = c.sentTo >= spool.end;
    // Over the high-water mark only an Ack frees the spool: end the call now rather than at maxCallMs.
    const pressure = drainWaiters.length > 0 || spool.bytes >= highWater;
    if (endSent || c.bytes >= maxCallBytes || (allSent && (c.cut || flushing || pressure))) endCall(c);
  }

  function endCall(c: Call): void {
    c.ending = true;
    clearTimeout(c.timer);
    c.req.end();
    c.timer = setTimeout(() => {
      c.timedOut = true;
      c.req.close(http2.constants.NGHTTP2_CANCEL);
    }, responseTimeoutMs);
  }

  function startKeepalive(s: http2.ClientHttp2Session): void {
    if (keepaliveTimer !== null) return;
    keepaliveTimer = setInterval(() => {
      if (call === null || s.destroyed) return;
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

  function onCallClosed(c: Call): void {
    if (call !== c) return;
    call = null;
    clearTimeout(c.timer);
    if (keepaliveTimer !== null) {
      clearInterval(keepaliveTimer);
      keepaliveTimer = null;
    }
    // An idle connection must not keep the agent's process alive.
    if (!c.session.destroyed) c.session.unref();
    if (state === "closed") return;
    const outcome = readOutcome(c);
    const M = outcome.committed;
    if (M !== undefined && M >= spool.start) {
      committed = Math.min(M, spool.end);
      stats.committed = committed;
      spool.drop(committed);
      settleWaiters();
    }
    if (outcome.code === GRPC_OK) {
      if (outcome.ok === false) {
        stop({ reason: outcome.reason ?? "unknown" });
        return;
      }
      if (outcome.ok === true) {
        attempts = 0;
        failingSince = null;
        if (endOffset !== null && committed > endOffset) {
          state = "ended";
          settleWaiters();
          return;
        }
        kick();
        return;
      }
    }
    const error = outcome.error ?? new RunnerDepotError("INTERNAL", "call ended without a status");
    if (outcome.code === Code.FailedPrecondition) {
      if (M !== undefined && spool.has(M)) {
        retry(error, attempts === 0);
        return;
      }
      fail(error);
      return;
    }
    if (outcome.code === Code.ResourceExhausted) {
      if (resplit()) {
        retry(error, true);
        return;
      }
      fail(error);
      return;
    }
    if (outcome.code !== undefined && GIVE_UP.has(outcome.code)) {
      fail(error);
      return;
    }
    retry(error);
  }

  function readOutcome(c: Call): {
    code?: Code;
    ok?: boolean;
    committed?: number;
    reason?: string;
    error?: RunnerDepotError;
  } {
    const h = c.headers ?? {};
    const t = c.trailers ?? {};
    const status = header(t, "grpc-status") ?? header(h, "grpc-status");
    const committedText = header(t, "runner-committed") ?? header(h, "runner-committed");
    const committedNum = committedText !== undefined && /^\d+$/.test(committedText) ? Number(committedText) : undefined;
    const reason = header(t, "runner-reason") ?? header(h, "runner-reason");
    const base = { committed: committedNum, reason };
    if (status === undefined) {
      if (c.timedOut) return { ...base, code: Code.DeadlineExceeded, error: rpcError("no response in time", Code.DeadlineExceeded) };
      const httpStatus = Number(h[":status"] ?? 200);
      if (httpStatus !== 200) {
        const code = httpToCode(httpStatus);
        return { ...base, code, error: rpcError(`HTTP ${httpStatus}`, code) };
      }
      return { ...base, code: Code.Unavailable, error: networkError(c.error ?? new Error("stream closed without a status")) };
    }
    const code = Number(status) as Code;
    if (code !== GRPC_OK) {
      const message = decodeMessage(header(t, "grpc-message") ?? header(h, "grpc-message") ?? "");
      return { ...base, code, error: rpcError(message, code, committedNum) };
    }
    try {
      const ack = parseAck(Buffer.concat(c.data), header(h, "grpc-encoding"));
      return { ...base, code, ok: ack };
    } catch (e) {
      return { ...base, code: Code.Internal, error: new RunnerDepotError("INTERNAL", `bad Ack: ${String(e)}`, { cause: e }) };
    }
  }

  function retry(error: RunnerDepotError, immediate = false): void {
    const now = Date.now();
    failingSince ??= now;
    if (now - failingSince > deadlineMs) {
      fail(error);
      return;
    }
    stats.retries++;
    const cap = Math.min(backoffMax, backoffInitial * 2 ** Math.min(attempts, 30));
    attempts++;
    // Full jitter, so a fleet of agents does not reconnect in lockstep after an outage.
    const delay = immediate ? 0 : Math.round(Math.random() * cap);
    options.onRetry?.(error, delay);
    retryTimer = setTimeout(() => {
      retryTimer = null;
      kick();
    }, delay);
  }

  /** RESOURCE_EXHAUSTED: halve the line limit and re-encode what the server has not stored. */
  function resplit(): boolean {
    if (maxLineBytes <= MIN_SPLIT_BYTES) return false;
    maxLineBytes = Math.max(MIN_SPLIT_BYTES, Math.floor(maxLineBytes / 2));
    const frames = spool.frames(committed);
    spool.truncate(committed);
    endOffset = null;
    // Re-splitting renumbers every unacknowledged item: remember where each old item
    // boundary lands, so end() and flush() keep waiting for the same items.
    const boundary = new Map<number, number>([[committed, committed]]);
    let old = committed;
    for (const f of frames) {
      const item = fromBinary(LogItemSchema, f.subarray(5));
      if (item.event.case === "log") {
        for (const piece of splitUtf8(item.event.value.line, maxLineBytes)) append(piece, item.event.value.stderr);
      } else if (item.event.case === "end") {
        const frame = f;
        endOffset = spool.append(frame.length, (buf, pos) => pos + frame.copy(buf, pos));
      }
      boundary.set(++old, spool.end);
    }
    for (const w of waiters) if (w.to > committed) w.to = boundary.get(w.to) ?? spool.end;
    stats.items = spool.end;
    return true;
  }

  function append(line: string, stderr: boolean): void {
    const bytes = utf8Length(line);
    spool.append(enc.logFrameSize(line, bytes, stderr), (buf, pos) => enc.writeLogFrame(buf, pos, line, bytes, stderr));
  }

  function settleWaiters(): void {
    if (waiters.length > 0) {
      const due = waiters.filter((w) => w.to <= committed);
      if (due.length > 0) {
        waiters = waiters.filter((w) => w.to > committed);
        for (const w of due) w.resolve();
      }
    }
    if (waiters.length === 0) flushing = false;
    if (drainWaiters.length > 0 && spool.bytes <= highWater / 2) {
      const ws = drainWaiters;
      drainWaiters = [];
      for (const w of ws) w();
    }
    stats.spoolBytes = spool.bytes;
  }

  function stop(s: RunnerStop): void {
    if (state === "stopped" || state === "closed" || state === "ended") return;
    state = "stopped";
    if (retryTimer !== null) clearTimeout(retryTimer);
    retryTimer = null;
    const err =
      s.error ?? new RunnerDepotError("ABORTED", `the orchestrator stopped the job (${s.reason})`, { details: { reason: s.reason } });
    rejectAll(err);
    stopInfo = s;
    stopResolve(s);
    for (const cb of stopCallbacks) cb(s);
    stopCallbacks.clear();
    session?.close();
  }

  function fail(error: RunnerDepotError): void {
    stop({ reason: "failed", error });
  }

  function rejectAll(err: unknown): void {
    const ws = waiters;
    waiters = [];
    for (const w of ws) w.reject(err);
    const ds = drainWaiters;
    drainWaiters = [];
    for (const d of ds) d();
  }

  return {
    log(line, stderr = false) {
      if (state === "ending" || state === "ended") {
        throw new RunnerDepotError("INVALID_ARGUMENT", "log() after end(): end is the last item of a job");
      }
      if (state !== "open") return true;
      if (stderr) stats.lines.stderr++;
      else stats.lines.stdout++;
      const bytes = utf8Length(line);
      if (bytes > maxLineBytes) {
        const pieces = splitUtf8(line, maxLineBytes);
        if (stderr) stats.lines.stderr += pieces.length - 1;
        else stats.lines.stdout += pieces.length - 1;
        for (const piece of pieces) append(piece, stderr);
      } else {
        spool.append(enc.logFrameSize(line, bytes, stderr), (buf, pos) => enc.writeLogFrame(buf, pos, line, bytes, stderr));
      }
      stats.items = spool.end;
      schedule();
      return spool.bytes < highWater;
    },
    end(end) {
      if (state === "ending" || state === "ended") {
        return Promise.reject(new RunnerDepotError("INVALID_ARGUMENT", "end() called twice"));
      }
      if (state !== "open") {
        return Promise.reject(new RunnerDepotError("ABORTED", `the client is ${state}`));
      }
      if (!Number.isInteger(end.exitCode) || end.exitCode < -(2 ** 31) || end.exitCode >= 2 ** 31) {
        return Promise.reject(new RunnerDepotError("INVALID_ARGUMENT", `exitCode is not an int32: ${end.exitCode}`));
      }
      const frame = enc.endFrame(end);
      endOffset = spool.append(frame.length, (buf, pos) => pos + frame.copy(buf, pos));
      stats.items = spool.end;
      state = "ending";
      const done = new Promise<void>((resolve, reject) => waiters.push({ to: endOffset! + 1, resolve, reject }));
      schedule();
      return done;
    },
    flush() {
      if (state === "stopped" || state === "closed") return Promise.reject(new RunnerDepotError("ABORTED", `the client is ${state}`));
      const to = spool.end;
      if (committed >= to) return Promise.resolve();
      flushing = true;
      const p = new Promise<void>((resolve, reject) => waiters.push({ to, resolve, reject }));
      schedule();
      return p;
    },
    drained() {
      if (spool.bytes <= highWater / 2 || state === "stopped" || state === "closed") return Promise.resolve();
      const p = new Promise<void>((r) => drainWaiters.push(r));
      schedule();
      return p;
    },
    onStop(cb) {
      if (stopInfo !== null) {
        const info = stopInfo;
        queueMicrotask(() => cb(info));
        return () => {};
      }
      stopCallbacks.add(cb);
      return () => stopCallbacks.delete(cb);
    },
    stopped,
    get stats() {
      return stats;
    },
    async close() {
      if (state === "closed") return;
      const wasDone = state === "ended" || state === "stopped";
      state = "closed";
      if (retryTimer !== null) clearTimeout(retryTimer);
      retryTimer = null;
      if (keepaliveTimer !== null) clearInterval(keepaliveTimer);
      keepaliveTimer = null;
      if (!wasDone) rejectAll(new RunnerDepotError("ABORTED", "the client was closed"));
      const c = call;
      call = null;
      if (c !== null) {
        clearTimeout(c.timer);
        c.req.close(http2.constants.NGHTTP2_CANCEL);
      }
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
    },
  };
}

function parseEndpoint(endpoint: string): URL {
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

function header(h: http2.IncomingHttpHeaders, name: string): string | undefined {
  const v = h[name];
  return Array.isArray(v) ? v[0] : v;
}

function decodeMessage(m: string): string {
  try {
    return decodeURIComponent(m);
  } catch {
    return m;
  }
}

function rpcError(message: string, code: Code, committed?: number): RunnerDepotError {
  const err = RunnerDepotError.from(new ConnectError(message, code));
  if (committed !== undefined) err.details.committed = committed;
  err.details.grpcCode = code;
  return err;
}

function networkError(cause: unknown): RunnerDepotError {
  const message = cause instanceof Error ? cause.message : String(cause);
  return new RunnerDepotError("UNAVAILABLE", `network error: ${message}`, { cause, details: { grpcCode: Code.Unavailable } });
}

/** gRPC's HTTP-to-status mapping for responses that are not gRPC at all (proxies, wrong port). */
function httpToCode(status: number): Code {
  switch (status) {
    case 400:
      return Code.Internal;
    case 401:
      return Code.Unauthenticated;
    case 403:
      return Code.PermissionDenied;
    case 404:
      return Code.Unimplemented;
    case 429:
    case 502:
    case 503:
    case 504:
      return Code.Unavailable;
    default:
      return Code.Unknown;
  }
}

function parseAck(body: Buffer, encoding: string | undefined): boolean {
  if (body.length < 5) throw new Error("no response message");
  const len = body.readUInt32BE(1);
  if (body.length < 5 + len) throw new Error("truncated response message");
  let msg: Buffer = body.subarray(5, 5 + len);
  if ((body[0]! & 1) === 1) {
    if (encoding === "gzip") msg = gunzipSync(msg);
    else if (encoding === "deflate") msg = inflateSync(msg);
    else throw new Error(`unsupported grpc-encoding ${encoding}`);
  }
  return fromBinary(AckSchema, msg).ok;
}
