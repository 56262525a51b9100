/**
 * The runner client's call loop: the spool's frames written into short client-streaming
 * `StreamLogs` calls, each cut by size or age, the spool dropped up to each call's
 * `runner-committed`, and every failure retried from there with jittered back-off until
 * the job's end is acknowledged, the orchestrator stops the job, or retrying cannot help.
 */
import http2 from "node:http2";
import { Code } from "@connectrpc/connect";
import { RunnerDepotError } from "../../errors.js";
import { GRPC_OK, MAX_ANSWER_BYTES, networkError, readOutcome } from "./outcome.js";
import type { ClientSessions } from "./session.js";
import { appendLine, framesALine, resplitFrom } from "./spool-items.js";
import { clearCallTimers, type Call, type CallSettings, type ClientState } from "./state.js";
import type { RunnerStop } from "./types.js";
import type { LogItemEncoder } from "../protocol/encoder.js";
import type { Spool } from "./spool.js";

/** Codes after which retrying cannot help (docs/runner-protocol.md, §9 "Status codes"). */
const GIVE_UP = new Set<Code>([
  Code.InvalidArgument,
  Code.Unauthenticated,
  Code.PermissionDenied,
  Code.NotFound,
  Code.Unimplemented,
]);
/**
 * How long a call runs before it is cut: `maxCallMs` less up to a quarter of it, at random. Never longer than
 * `maxCallMs`, so it stays below the server's idle limit.
 * Why: docs/decisions/runner-client.md, "reconnecting-calls.ts: callLength".
 */
function callLength(maxCallMs: number): number {
  return maxCallMs - Math.floor(Math.random() * (maxCallMs / 4));
}

/**
 * Most bytes of a call sent before any server has answered one (when runs may be sent): about 420 lines of 100 bytes,
 * so the answer that says whether the server takes runs comes within a few ms of a job's start.
 */
const FIRST_CALL_BYTES = 64 * 1024;

/** Smallest line limit RESOURCE_EXHAUSTED may push the client down to. */
const MIN_SPLIT_BYTES = 1024;

/** What the client's API drives the loop with. */
interface CallLoop {
  /** Writes soon (after the current burst of log() calls): into the open call, or a new one. */
  schedule(): void;
  /** Appends one log line (within the line limit) to the spool. */
  append(line: string, stderr: boolean, time: number): void;
  /** Rejects every waiter with `err` and releases every drained() waiter. */
  rejectAll(err: unknown): void;
  /** Resolves if the client stops. */
  readonly stopped: Promise<RunnerStop>;
}

/**
 * The call loop of one client.
 *
 * @example
 * const loop = createCallLoop(settings, st, createSpool(), createLogItemEncoder(requestId), sessions);
 * loop.append("hello", false, Date.now());
 * loop.schedule();
 */
export function createCallLoop(
  settings: CallSettings,
  st: ClientState,
  spool: Spool,
  enc: LogItemEncoder,
  sessions: ClientSessions,
): CallLoop {
  const {
    maxCallBytes,
    maxCallMs,
    deadlineMs,
    backoffInitial,
    backoffMax,
    highWater,
    responseTimeoutMs,
    stallTimeoutMs,
    baseHeaders,
  } = settings;
  const stats = st.stats;
  let scheduled = false;
  let attempts = 0;
  /**
   * When the current run of failures began (null while calls succeed): the last moment the
   * first failed call made progress, so time spent stalled counts towards the deadline.
   */
  let failingSince: number | null = null;
  /** The error of the last failed call, which a call cut by the deadline ends with. */
  let lastError: RunnerDepotError | null = null;
  let stopResolve!: (s: RunnerStop) => void;
  const stopped = new Promise<RunnerStop>((r) => (stopResolve = r));

  function schedule(): void {
    if (scheduled) return;
    scheduled = true;
    // Let a burst of log() calls (one pipe read holds many lines) land before writing.
    setImmediate(() => {
      scheduled = false;
      if (st.call !== null) pump();
      else kick();
    });
  }

  function kick(): void {
    if ((st.state !== "open" && st.state !== "ending") || st.call !== null || st.retryTimer !== null) return;
    if (st.committed < spool.end) startCall();
  }

  function startCall(): void {
    let s: http2.ClientHttp2Session;
    let req: http2.ClientHttp2Stream;
    let from = st.committed;
    try {
      s = sessions.get();
      // A frame goes whole: a call resumes at the first line of the run that holds the next item to store. A call
      // without runs turns that run into frames a line and starts at the item itself.
      from = st.runs ? spool.frameStart(st.committed) : st.committed;
      req = s.request({ ...baseHeaders, "runner-offset": String(from) });
    } catch (e) {
      sessions.discard();
      retry(networkError(e), Date.now());
      return;
    }
    stats.calls++;
    s.ref();
    const c: Call = {
      req,
      session: s,
      from,
      sentTo: from,
      runs: st.runs,
      // Until a server has answered, a call is short: its answer says whether runs may be sent, and lines the agent
      // reads meanwhile are framed a line each. One more call a job (~1 ms of CPU each side).
      maxBytes: st.mayRun && !st.answered ? Math.min(maxCallBytes, FIRST_CALL_BYTES) : maxCallBytes,
      bytes: 0,
      ending: false,
      waitingDrain: false,
      cut: false,
      progressAt: Date.now(),
      answerBytes: 0,
      data: [],
    };
    st.call = c;
    c.timer = setTimeout(() => {
      c.cut = true;
      pump();
    }, callLength(maxCallMs));
    // While calls keep failing, none may outlive the deadline (a server that stalls every call).
    if (failingSince !== null) {
      c.deadlineTimer = setTimeout(
        () => {
          c.pastDeadline = true;
          abandon(c, Code.DeadlineExceeded, `no progress for the deadline (${deadlineMs} ms)`);
        },
        failingSince + deadlineMs - Date.now(),
      );
    }
    req.on("response", (h) => (c.headers = h));
    req.on("data", (d: Buffer) => {
      // An Ack is 7 bytes; a server streaming more would hold the agent's memory (issue 31 item 2).
      c.answerBytes += d.length;
      if (c.answerBytes <= MAX_ANSWER_BYTES) c.data.push(d);
      else abandon(c, Code.Internal, `the answer is over ${MAX_ANSWER_BYTES} bytes: not a runner.v1 Ack`);
    });
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
    sessions.startKeepalive(s, () => st.call !== null);
    pump();
  }

  function pump(): void {
    const c = st.call;
    if (c === null || c.ending || c.waitingDrain) return;
    // A cut call writes nothing more, so its length stays bounded even while writes are slow.
    const callBytes = c.maxBytes;
    while (!c.cut && c.sentTo < spool.end && c.bytes < callBytes) {
      const split = !c.runs && c.sentTo < st.runsBefore;
      // Runs turned into frames a line grow up to ~25×: a smaller slice keeps what is written at once bounded.
      const start = split ? spool.frameStart(c.sentTo) : c.sentTo;
      const slice = spool.slice(start, Math.min(callBytes - c.bytes, split ? 16 * 1024 : 256 * 1024));
      if (slice.to <= c.sentTo) break;
      const out = split ? framesALine(slice.buffers, start, c.sentTo, enc) : slice;
      let ok = true;
      for (const b of out.buffers) ok = c.req.write(b);
      c.bytes += out.bytes;
      c.sentTo = slice.to;
      if (c.sentTo > st.sent) st.sent = c.sentTo;
      if (!ok) {
        c.waitingDrain = true;
        // A server that stops reading (its window stays shut) while it answers PINGs would hold the call forever.
        const stallMs = Math.min(stallTimeoutMs, deadlineMs);
        c.stallTimer = setTimeout(
          () => abandon(c, Code.DeadlineExceeded, `no write progress for ${stallMs} ms: the server stopped reading`),
          stallMs,
        );
        c.req.once("drain", () => {
          clearTimeout(c.stallTimer);
          c.progressAt = Date.now();
          c.waitingDrain = false;
          pump();
        });
        return;
      }
    }
    const endSent = st.endOffset !== null && c.sentTo > st.endOffset;
    const allSent = c.sentTo >= spool.end;
    // Over the high-water mark only an Ack frees the spool: end the call now rather than at maxCallMs.
    const pressure = st.drainWaiters.length > 0 || spool.bytes >= highWater;
    if (endSent || c.bytes >= callBytes || c.cut || (allSent && (st.flushing || pressure))) endCall(c);
  }

  function endCall(c: Call): void {
    c.ending = true;
    clearTimeout(c.timer);
    c.req.end(() => (c.progressAt = Date.now()));
    c.timer = setTimeout(() => abandon(c, Code.DeadlineExceeded, "no response in time"), responseTimeoutMs);
  }

  /** Cancels a call the client gives up on itself; it then closes with `failure` as its outcome. */
  function abandon(c: Call, code: Code, message: string): void {
    c.failure ??= { code, message };
    c.req.close(http2.constants.NGHTTP2_CANCEL);
  }

  function onCallClosed(c: Call): void {
    if (st.call !== c) return;
    st.call = null;
    clearCallTimers(c);
    sessions.stopKeepalive();
    // An idle connection must not keep the agent's process alive.
    if (!c.session.destroyed) c.session.unref();
    if (st.state === "closed") return;
    const outcome = readOutcome(c, st.sent);
    if (outcome.answered === true) st.answered = true;
    if (outcome.acceptsRuns === true && st.mayRun) st.runs = true;
    const M = outcome.committed;
    if (M !== undefined && M >= spool.start) {
      st.committed = Math.min(M, spool.end);
      stats.committed = st.committed;
      spool.drop(st.committed);
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
        lastError = null;
        if (st.endOffset !== null && st.committed > st.endOffset) {
          st.state = "ended";
          settleWaiters();
          return;
        }
        kick();
        return;
      }
    }
    const error = outcome.error ?? new RunnerDepotError("INTERNAL", "call ended without a status");
    // Cut by the deadline: give up with what made the calls fail, not with the cut itself.
    if (c.pastDeadline === true) {
      fail(lastError ?? error);
      return;
    }
    if (outcome.permanent === true) {
      fail(error);
      return;
    }
    if (outcome.code === Code.FailedPrecondition) {
      if (M !== undefined && spool.has(M)) {
        retry(error, c.progressAt, attempts === 0);
        return;
      }
      fail(error);
      return;
    }
    if (outcome.code === Code.InvalidArgument && c.runs && st.runs) {
      // Runs were refused: an older server took this call (replicas of two versions behind one endpoint). Lines go a
      // frame each from now on, those not yet stored too.
      st.runs = false;
      st.mayRun = false;
      st.runsBefore = spool.end;
      retry(error, c.progressAt, true);
      return;
    }
    if (outcome.code === Code.ResourceExhausted) {
      if (resplit()) {
        retry(error, c.progressAt, true);
        return;
      }
      fail(error);
      return;
    }
    if (outcome.code !== undefined && GIVE_UP.has(outcome.code)) {
      fail(error);
      return;
    }
    retry(error, c.progressAt);
  }

  /** Retries after `error` unless calls have failed for the deadline; `since`: the failed call's last progress. */
  function retry(error: RunnerDepotError, since: number, immediate = false): void {
    const now = Date.now();
    failingSince ??= since;
    lastError = error;
    if (now - failingSince >= deadlineMs) {
      fail(error);
      return;
    }
    stats.retries++;
    const cap = Math.min(backoffMax, backoffInitial * 2 ** Math.min(attempts, 30));
    attempts++;
    // Full jitter, so a fleet of agents does not reconnect in lockstep after an outage.
    const delay = immediate ? 0 : Math.round(Math.random() * cap);
    settings.onRetry?.(error, delay);
    st.retryTimer = setTimeout(() => {
      st.retryTimer = null;
      kick();
    }, delay);
  }

  /** RESOURCE_EXHAUSTED: halve the line limit and re-encode what the server has not stored. */
  function resplit(): boolean {
    if (st.maxLineBytes <= MIN_SPLIT_BYTES) return false;
    resplitAt(Math.max(MIN_SPLIT_BYTES, Math.floor(st.maxLineBytes / 2)));
    return true;
  }

  /** Re-encodes what the server has not stored, a frame a line of at most `maxLineBytes`. O(bytes held). */
  function resplitAt(maxLineBytes: number): void {
    st.maxLineBytes = maxLineBytes;
    const waited = st.waiters.map((w) => w.to);
    // Runs stay runs: sent as such, or split as sent (st.runsBefore), never a frame a line in the spool (~25× larger).
    const keepRuns = st.runs || st.runsBefore > st.committed;
    const { endOffset, boundary } = resplitFrom(spool, enc, st.committed, st.maxLineBytes, waited, keepRuns);
    if (!st.runs && keepRuns) st.runsBefore = spool.end;
    st.endOffset = endOffset;
    // end() and flush() keep waiting for the same items, now at their new offsets.
    for (const w of st.waiters) if (w.to > st.committed) w.to = boundary.get(w.to) ?? spool.end;
    stats.items = spool.end;
    stats.spoolBytes = spool.bytes;
  }

  function settleWaiters(): void {
    if (st.waiters.length > 0) {
      const due = st.waiters.filter((w) => w.to <= st.committed);
      if (due.length > 0) {
        st.waiters = st.waiters.filter((w) => w.to > st.committed);
        for (const w of due) w.resolve();
      }
    }
    if (st.waiters.length === 0) st.flushing = false;
    if (st.drainWaiters.length > 0 && spool.bytes <= highWater / 2) {
      const ws = st.drainWaiters;
      st.drainWaiters = [];
      for (const w of ws) w();
    }
    stats.spoolBytes = spool.bytes;
  }

  function stop(s: RunnerStop): void {
    if (st.state === "stopped" || st.state === "closed" || st.state === "ended") return;
    st.state = "stopped";
    if (st.retryTimer !== null) clearTimeout(st.retryTimer);
    st.retryTimer = null;
    const err =
      s.error ??
      new RunnerDepotError("ABORTED", `the orchestrator stopped the job (${s.reason})`, {
        details: { reason: s.reason },
      });
    rejectAll(err);
    st.stopInfo = s;
    stopResolve(s);
    for (const cb of st.stopCallbacks) cb(s);
    st.stopCallbacks.clear();
    sessions.closeCurrent();
  }

  function fail(error: RunnerDepotError): void {
    stop({ reason: "failed", error });
  }

  function rejectAll(err: unknown): void {
    const ws = st.waiters;
    st.waiters = [];
    for (const w of ws) w.reject(err);
    const ds = st.drainWaiters;
    st.drainWaiters = [];
    for (const d of ds) d();
  }

  return { schedule, append: (line, stderr, time) => appendLine(spool, enc, line, stderr, time), rejectAll, stopped };
}
