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
  bytes: number;
  ending: boolean;
  waitingDrain: boolean;
  cut: boolean;
  timer?: NodeJS.Timeout;
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
  /** The offset of the job-end item, once queued. */
  endOffset: number | null;
  call: Call | null;
  retryTimer: NodeJS.Timeout | null;
  /** A flush() is waiting: end calls as soon as everything is sent. */
  flushing: boolean;
  /** The line limit; halved on RESOURCE_EXHAUSTED. */
  maxLineBytes: number;
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
  baseHeaders: http2.OutgoingHttpHeaders;
  onRetry?: (error: RunnerDepotError, delayMs: number) => void;
}
