/**
 * The runner client's state and settings, shared by its call loop (runner/client/reconnecting-calls.ts) and
 * its API (client.ts): one mutable object per client, so both halves see the same job.
 */
import type http2 from "node:http2";
import type { RunnerDepotError } from "../../errors.js";
import type { CallResponse } from "./outcome.js";
import type { RunnerClientStats, RunnerStop } from "./types.js";

/** One `StreamLogs` call in flight. */
export interface Call extends CallResponse {
  req: http2.ClientHttp2Stream;
  session: http2.ClientHttp2Session;
  from: number;
  sentTo: number;
  /** The call was started while lines went in runs (it may carry run frames). */
  runs: boolean;
  /** Bytes after which the call ends (maxCallBytes, less for a job's first call). */
  maxBytes: number;
  bytes: number;
  ending: boolean;
  waitingDrain: boolean;
  cut: boolean;
  /** When the server last took bytes of this call (its start, a drain, the request's end flushed). */
  progressAt: number;
  /** Bytes of answer body received. */
  answerBytes: number;
  /** The cut timer, then the response timer once the request ended. */
  timer?: NodeJS.Timeout;
  /** Runs while a write waits for 'drain': no write progress for stallTimeoutMs abandons the call. */
  stallTimer?: NodeJS.Timeout;
  /** A call started while calls keep failing is abandoned when the retry deadline passes. */
  deadlineTimer?: NodeJS.Timeout;
  /** The deadline timer fired: the call ends the client with the last failed call's error. */
  pastDeadline?: boolean;
}

/** Clears every timer of a call (it closed, or the client did). */
export function clearCallTimers(c: Call): void {
  clearTimeout(c.timer);
  clearTimeout(c.stallTimer);
  clearTimeout(c.deadlineTimer);
}

/** A promise of end() or flush(), settled once everything before `to` is committed. */
interface Waiter {
  to: number;
  resolve: () => void;
  reject: (e: unknown) => void;
}

/** A client's state. */
export interface ClientState {
  state: "open" | "ending" | "ended" | "stopped" | "closed";
  /** Items before this offset are stored by the orchestrator. */
  committed: number;
  /** The highest offset any call has written up to: a `runner-committed` past it is a lie. */
  sent: number;
  /** The offset of the job-end item, once queued. */
  endOffset: number | null;
  call: Call | null;
  retryTimer: NodeJS.Timeout | null;
  /** A flush() is waiting: end calls as soon as everything is sent. */
  flushing: boolean;
  /** The line limit; halved on RESOURCE_EXHAUSTED. */
  maxLineBytes: number;
  /**
   * Lines go in runs (a frame a pipe read's lines): the server said it takes them (`runner-accepts: runs`) and the
   * client may send them. Turned off for good when a call carrying runs is refused INVALID_ARGUMENT (an older server
   * behind the same endpoint).
   */
  runs: boolean;
  /** Runs may be turned on (the `runs` option, and no server has refused one yet). */
  mayRun: boolean;
  /**
   * Items before this offset may be in runs that must go a frame a line, since a server refused runs (0: none). Calls
   * turn those runs into frames as they send them (spool-items.ts, framesALine); the spool keeps its runs.
   */
  runsBefore: number;
  /** A server has answered a call with a gRPC status: until then calls are short (FIRST_CALL_BYTES). */
  answered: boolean;
  waiters: Waiter[];
  drainWaiters: Array<() => void>;
  stopInfo: RunnerStop | null;
  readonly stopCallbacks: Set<(s: RunnerStop) => void>;
  readonly stats: RunnerClientStats;
}

/** The settings of the call loop, defaults applied (client.ts). */
export interface CallSettings {
  maxCallBytes: number;
  maxCallMs: number;
  deadlineMs: number;
  backoffInitial: number;
  backoffMax: number;
  highWater: number;
  responseTimeoutMs: number;
  stallTimeoutMs: number;
  baseHeaders: http2.OutgoingHttpHeaders;
  onRetry?: (error: RunnerDepotError, delayMs: number) => void;
}
