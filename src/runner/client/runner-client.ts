/**
 * The VM side of runner.v1: a gRPC client for `Runner/StreamLogs` that keeps every
 * unacknowledged item in a spool, cuts its stream into short client-streaming calls,
 * and replays from the server's `runner-committed` after any failure, so no line is
 * lost or duplicated.
 * Why: docs/decisions/runner-client.md, "runner-client.ts: why gRPC straight on node:http2".
 */
import http2 from "node:http2";
import { RunnerDepotError } from "../../errors.js";
import { createCallLoop } from "./reconnecting-calls.js";
import { createClientSessions, parseEndpoint } from "./session.js";
import { clearCallTimers, type ClientState } from "./state.js";
import type { RunnerClient, RunnerClientOptions } from "./types.js";
import { createLogItemEncoder, utf8Length } from "../protocol/encoder.js";
import { nowMs } from "../protocol/line-time.js";
import { DEFAULT_MAX_LINE_BYTES, splitUtf8 } from "../agent/line-splitter.js";
import { createSpool } from "./spool.js";
import { isRequestId } from "../protocol/request-id.js";

export type {
  RunnerClient,
  RunnerClientOptions,
  RunnerClientStats,
  RunnerClientTlsOptions,
  RunnerStop,
} from "./types.js";

const PATH = "/runner.v1.Runner/StreamLogs";
/**
 * Default `maxCallBytes`. Each call costs both sides a stream, headers, a token check and an
 * answer, and the agent sends nothing while a cut call waits for its answer: ~1 ms of CPU on
 * each side per call on the e2e bench's host (300k lines of 100 bytes: 42 calls at 1 MiB,
 * 11 at 4 MiB; docs/decisions/runner-throughput.md, session 9). It also bounds what a broken
 * connection makes the agent replay.
 */
const DEFAULT_MAX_CALL_BYTES = 4 * 1024 * 1024;

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
  const maxLineBytes = options.maxLineBytes ?? DEFAULT_MAX_LINE_BYTES;
  const highWater = options.highWaterMarkBytes ?? 64 * 1024 * 1024;
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

  const st: ClientState = {
    state: "open",
    committed: 0,
    sent: 0,
    endOffset: null,
    call: null,
    retryTimer: null,
    flushing: false,
    maxLineBytes,
    runs: false,
    mayRun: options.runs ?? true,
    runsBefore: 0,
    answered: false,
    waiters: [],
    drainWaiters: [],
    stopInfo: null,
    stopCallbacks: new Set(),
    stats: {
      lines: { stdout: 0, stderr: 0 },
      calls: 0,
      retries: 0,
      committed: 0,
      items: 0,
      spoolBytes: 0,
      linesInRuns: 0,
    },
  };
  const stats = st.stats;
  const sessions = createClientSessions(url, {
    tls: options.tls,
    connectTimeoutMs: options.connectTimeoutMs ?? 10_000,
    keepaliveMs: options.keepaliveMs ?? 20_000,
  });
  const loop = createCallLoop(
    {
      maxCallBytes: options.maxCallBytes ?? DEFAULT_MAX_CALL_BYTES,
      maxCallMs: options.maxCallMs ?? 20_000,
      deadlineMs: options.deadlineMs ?? 600_000,
      backoffInitial: options.backoff?.initialMs ?? 100,
      backoffMax: options.backoff?.maxMs ?? 10_000,
      highWater,
      responseTimeoutMs: options.responseTimeoutMs ?? 60_000,
      stallTimeoutMs: options.stallTimeoutMs ?? 60_000,
      baseHeaders,
      onRetry: options.onRetry,
    },
    st,
    spool,
    enc,
    sessions,
  );
  const { schedule, append, rejectAll } = loop;

  // The line being appended, for the two frame writers below: one function each for the
  // client's life instead of a closure per line (a line costs no allocation but its bytes).
  let wLine = "";
  let wBytes = 0;
  let wSrc: Uint8Array = Buffer.alloc(0);
  let wStart = 0;
  let wEnd = 0;
  let wStderr = false;
  let wTime = 0;
  const writeLine = (buf: Buffer, pos: number) => enc.writeLogFrame(buf, pos, wLine, wBytes, wStderr, wTime);
  const writeBytes = (buf: Buffer, pos: number) => enc.writeLogFrameBytes(buf, pos, wSrc, wStart, wEnd, wStderr, wTime);

  const client: RunnerClient = {
    log(line, stderr = false, time = nowMs()) {
      if (st.state === "ending" || st.state === "ended") {
        throw new RunnerDepotError("INVALID_ARGUMENT", "log() after end(): end is the last item of a job");
      }
      if (st.state !== "open") return true;
      if (stderr) stats.lines.stderr++;
      else stats.lines.stdout++;
      const bytes = utf8Length(line);
      if (bytes > st.maxLineBytes) {
        const pieces = splitUtf8(line, st.maxLineBytes);
        if (stderr) stats.lines.stderr += pieces.length - 1;
        else stats.lines.stdout += pieces.length - 1;
        for (const piece of pieces) append(piece, stderr, time);
      } else {
        wLine = line;
        wBytes = bytes;
        wStderr = stderr;
        wTime = time;
        spool.append(enc.logFrameSize(line, bytes, stderr, time), writeLine);
      }
      stats.items = spool.end;
      schedule();
      return spool.bytes < highWater;
    },
    logUtf8(src, start, end, stderr = false, time = nowMs()) {
      const bytes = end - start;
      // Over the (possibly lowered) line limit, or not open: the string path's rules.
      if (bytes > st.maxLineBytes || st.state !== "open")
        return client.log(
          Buffer.from(src.buffer, src.byteOffset, src.byteLength).toString("utf8", start, end),
          stderr,
          time,
        );
      if (stderr) stats.lines.stderr++;
      else stats.lines.stdout++;
      wSrc = src;
      wStart = start;
      wEnd = end;
      wStderr = stderr;
      wTime = time;
      spool.append(enc.logFrameSize("", bytes, stderr, time), writeBytes);
      stats.items = spool.end;
      schedule();
      return spool.bytes < highWater;
    },
    logLines(src, start, end, stderr = false, time = nowMs(), maxLineBytes = st.maxLineBytes) {
      // Not open: each line takes log()'s rules (an error after end(), nothing queued once stopped).
      if (st.state !== "open") return { next: start, accepted: true };
      const buf = Buffer.isBuffer(src) ? src : Buffer.from(src.buffer, src.byteOffset, src.byteLength);
      const from = spool.end;
      const maxLine = Math.min(maxLineBytes, st.maxLineBytes);
      const frames = enc.lineFramer(stderr, time);
      const next = st.runs
        ? spool.appendRuns(buf, start, end, maxLine, frames, st.maxLineBytes)
        : spool.appendLines(buf, start, end, maxLine, frames);
      if (stderr) stats.lines.stderr += spool.end - from;
      else stats.lines.stdout += spool.end - from;
      if (st.runs) stats.linesInRuns += spool.end - from;
      stats.items = spool.end;
      schedule();
      return { next, accepted: spool.bytes < highWater };
    },
    end(end) {
      if (st.state === "ending" || st.state === "ended") {
        return Promise.reject(new RunnerDepotError("INVALID_ARGUMENT", "end() called twice"));
      }
      if (st.state !== "open") {
        return Promise.reject(new RunnerDepotError("ABORTED", `the client is ${st.state}`));
      }
      if (!Number.isInteger(end.exitCode) || end.exitCode < -(2 ** 31) || end.exitCode >= 2 ** 31) {
        return Promise.reject(new RunnerDepotError("INVALID_ARGUMENT", `exitCode is not an int32: ${end.exitCode}`));
      }
      const frame = enc.endFrame(end);
      const endOffset = spool.append(frame.length, (buf, pos) => pos + frame.copy(buf, pos));
      st.endOffset = endOffset;
      stats.items = spool.end;
      st.state = "ending";
      const done = new Promise<void>((resolve, reject) => st.waiters.push({ to: endOffset + 1, resolve, reject }));
      schedule();
      return done;
    },
    flush() {
      if (st.state === "stopped" || st.state === "closed")
        return Promise.reject(new RunnerDepotError("ABORTED", `the client is ${st.state}`));
      const to = spool.end;
      if (st.committed >= to) return Promise.resolve();
      st.flushing = true;
      const p = new Promise<void>((resolve, reject) => st.waiters.push({ to, resolve, reject }));
      schedule();
      return p;
    },
    drained() {
      if (spool.bytes <= highWater / 2 || st.state === "stopped" || st.state === "closed") return Promise.resolve();
      const p = new Promise<void>((r) => st.drainWaiters.push(r));
      schedule();
      return p;
    },
    onStop(cb) {
      if (st.stopInfo !== null) {
        const info = st.stopInfo;
        queueMicrotask(() => cb(info));
        return () => {};
      }
      st.stopCallbacks.add(cb);
      return () => st.stopCallbacks.delete(cb);
    },
    stopped: loop.stopped,
    get stats() {
      return stats;
    },
    async close() {
      if (st.state === "closed") return;
      const wasDone = st.state === "ended" || st.state === "stopped";
      st.state = "closed";
      if (st.retryTimer !== null) clearTimeout(st.retryTimer);
      st.retryTimer = null;
      sessions.stopKeepalive();
      if (!wasDone) rejectAll(new RunnerDepotError("ABORTED", "the client was closed"));
      const c = st.call;
      st.call = null;
      if (c !== null) {
        clearCallTimers(c);
        c.req.close(http2.constants.NGHTTP2_CANCEL);
      }
      await sessions.close();
    },
  };
  return client;
}
