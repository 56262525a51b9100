/**
 * The runner client's public types: its options, its counters, why it stops, and the
 * {@link RunnerClient} interface. Apart from the code so the agent and the credentials
 * probe can name them without loading the client.
 */
import type { RunnerDepotError } from "../../errors.js";
import type { JobEndFields } from "../protocol/encoder.js";

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
  /**
   * Cut a call after about this many bytes of frames (what a broken connection can make the agent replay). Default 4
   * MiB.
   */
  maxCallBytes?: number;
  /**
   * Cut a call at most this long after it started: at a random point of its last quarter, so agents that
   * started together do not cut in step. Default 20 000 ms. Keep it below the server's idle limit
   * (`limits.idleMs`, 60 s): a silent job's call is cut by this timer.
   * Why: docs/decisions/runner-client.md, "types.ts: RunnerClientOptions.maxCallMs".
   */
  maxCallMs?: number;
  /** Longer lines are split at a UTF-8 boundary. Default 64 KiB (the contract's limit). */
  maxLineBytes?: number;
  /**
   * Give up when calls have kept failing for this long (since the last progress of the first
   * call that failed after a success); a call started while failing is cancelled at it. Default 10 minutes.
   */
  deadlineMs?: number;
  /** Jittered exponential back-off between retries. Default 100 ms doubling to 10 s. */
  backoff?: { initialMs?: number; maxMs?: number };
  /** `log()` returns false while the spool holds more than this. Default 64 MiB. */
  highWaterMarkBytes?: number;
  /** A call whose response takes longer after the request ended is cancelled and retried. Default 60 s. */
  responseTimeoutMs?: number;
  /**
   * A call that cannot write for this long (the server stopped reading: its flow-control
   * window stays shut) is cancelled and retried; at most `deadlineMs`. Default 60 s.
   */
  stallTimeoutMs?: number;
  /** Connecting longer than this counts as a network error. Default 10 s. */
  connectTimeoutMs?: number;
  /** HTTP/2 PING interval while a call is open; an unanswered ping drops the connection. Default 20 s. */
  keepaliveMs?: number;
  /** Told about every failed call that will be retried (for logging). */
  onRetry?: (error: RunnerDepotError, delayMs: number) => void;
  /**
   * Send the lines `logLines()` takes in runs (one `LogRun` item a pipe read's lines, docs/runner-protocol.md §2) once
   * a server's answer says it takes them (`runner-accepts: runs`). Default true; false sends a frame a line always.
   */
  runs?: boolean;
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
  /** Lines framed in runs (`LogRun` items, once the server said it takes them); the rest went a frame each. */
  linesInRuns: number;
}

/** What {@link createRunnerClient} returns. */
export interface RunnerClient {
  /**
   * Queues one output line; false when the spool is over its high-water mark (wait for `drained()`). `time` is when
   * the line happened, in ms since the Unix epoch (kept to the µs; e.g. `Date.now()`); default: now. It travels as
   * `time_unix_nano` and survives the spool's replays unchanged.
   */
  log(line: string, stderr?: boolean, time?: number): boolean;
  /**
   * Queues one output line given as its bytes `src[start, end)`, which must be valid UTF-8
   * without the newline (the caller checked it, as the line splitter's `onBytes` does);
   * the same as `log(text)` without decoding it. The bytes are copied before it returns.
   * Optional so that other implementations of this interface need not have it.
   */
  logUtf8?(src: Uint8Array, start: number, end: number, stderr?: boolean, time?: number): boolean;
  /**
   * Queues the lines of `src[start, end)`, each ended by `\n` (left out) and all valid UTF-8 (the caller checked it),
   * in one pass: the same as `logUtf8` on each line in turn, without a call a line. Stops before a line longer than
   * `maxLineBytes` (default and at most the client's own limit) and takes nothing when the client is not open: it
   * returns where it stopped (`next`, `end` when it took every line), and the lines from there are the caller's to
   * queue one by one. `accepted` is false when the spool is over its high-water mark (wait for `drained()`). The
   * bytes are copied before it returns. Optional, as `logUtf8` is.
   */
  logLines?(
    src: Uint8Array,
    start: number,
    end: number,
    stderr?: boolean,
    time?: number,
    maxLineBytes?: number,
  ): { next: number; accepted: boolean };
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
