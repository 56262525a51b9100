/**
 * The public contract of the runner service: the options a host passes to
 * createRunnerService, the limits of docs/runner-protocol.md, the trailers the service
 * sets, and the RunnerService interface itself. Types and constants only.
 */
import type { FollowOptions } from "./fanout.js";
import type { ServiceImpl } from "@connectrpc/connect";
import type { Runner } from "../../gen/runner/v1/runner_pb.js";
import type { JobInfo, JobLogStore, JobResult, JobState, LogSectionEvent, StoredLine } from "../ports.js";
import type { JobTokenSecret } from "../protocol/token.js";
import type { JobPage, ListJobsOptions } from "./job-list.js";
import type { TelemetryOptions } from "../../telemetry.js";

/** Trailer (and error metadata) with the job's durably stored item count. */
export const COMMITTED_HEADER = "runner-committed";
/** Trailer saying why an Ack is `ok = false`. */
export const REASON_HEADER = "runner-reason";
/** Request metadata: the job offset of the call's first item. */
export const OFFSET_HEADER = "runner-offset";
/**
 * Trailer (in the headers of a trailers-only answer) of every StreamLogs answer, Ack or error: the protocol
 * features the server takes beyond the seed's, comma-separated; today only `runs` (runs of lines,
 * docs/runner-protocol.md §2). Not sent when `acceptRuns` is false.
 */
export const ACCEPTS_HEADER = "runner-accepts";

/** Why the orchestrator no longer wants a job (`runner-reason`). */
export type EndedReason = "cancelled" | "lost" | "ended";

/** The limits of docs/runner-protocol.md (§7); all enforced. */
export interface RunnerLimits {
  /** Largest request message in bytes (`readMaxBytes`): larger ones end RESOURCE_EXHAUSTED. */
  messageBytes: number;
  /** Longest stored line in UTF-8 bytes; longer lines are cut and followed by a marker line. */
  lineBytes: number;
  /**
   * Stored output bytes per job. Past the head's share of it the log is cut: one marker counting the lines and
   * bytes dropped, then a rolling tail of the newest `tailBytes` (docs/decisions/log-tail.md). With `tailBytes: 0`
   * lines past it are counted, not stored (the behaviour before the tail was kept).
   */
  jobLogBytes: number;
  /**
   * Bytes (as the cap counts them) of the rolling tail kept once the head's share is full; default a quarter of
   * `jobLogBytes`; 0 keeps no tail. The tail is kept in 8 segments dropped whole, so it holds between 7/8 of it and
   * all of it.
   */
  tailBytes?: number;
  /**
   * Share of `jobLogBytes` kept as the head before the log is cut, in (0, 1]; default `1 − tailBytes / jobLogBytes`
   * (three quarters). `headShare × jobLogBytes + tailBytes` must not pass `jobLogBytes`.
   */
  headShare?: number;
  /** A call with no item for this long ends DEADLINE_EXCEEDED. */
  idleMs: number;
  /**
   * Bytes of log entries queued for the store and not yet stored, across all calls (each
   * entry counts its bytes + 64): past it the server reads no more of any authenticated
   * call (HTTP/2 flow control holds the agents back) until the store has drained to three
   * quarters of it (runner/service/store-backlog.ts).
   */
  queuedBytes: number;
  /**
   * Bytes of the forms of values that `::add-mask::` lines register in the service, across every job it holds (each
   * job at most 8 MiB of its own): past it, a `::add-mask::` line is still masked and its value not registered by the
   * service (the agent has masked it already; docs/runner-protocol.md §14). A job's share is given back when its
   * result is recorded. Declared secrets (`expectJob`) do not count.
   */
  addMaskFormBytes: number;
}

/** The defaults of docs/runner-protocol.md (§7). */
export const DEFAULT_RUNNER_LIMITS: Readonly<RunnerLimits> = Object.freeze({
  messageBytes: 1024 * 1024,
  lineBytes: 64 * 1024,
  jobLogBytes: 256 * 1024 * 1024,
  idleMs: 60_000,
  queuedBytes: 32 * 1024 * 1024,
  addMaskFormBytes: 256 * 1024 * 1024,
});

/**
 * Largest `JobEnd.repo_url` and `JobEnd.commit_sha` in UTF-8 bytes (docs/runner-protocol.md,
 * §7): they are copied into the job's state, its result message and every job listing.
 * Larger ones end INVALID_ARGUMENT. Fixed, not settings.
 */
export const JOB_END_FIELD_BYTES = Object.freeze({ repoUrl: 2048, commitSha: 128 });

/** What an `authorize` hook sees of a call (after its first item arrived). */
export interface RunnerAuthorizeContext {
  /** Lower-case request ID of the call's items. */
  requestId: string;
  /** Request metadata as received. */
  headers: Headers;
  /** The bearer token, or null when the call carries none (or a malformed one). */
  token: string | null;
  /** The call's `runner-offset` (0 when absent, NaN when malformed). */
  offset: number;
  /** "grpc", "grpc_web" or "connect". */
  protocol: string;
  /** Aborted when the call ends. */
  signal: AbortSignal;
}

/** Bounded retry of a job-result publish made inside a call. */
export interface PublishRetryOptions {
  /** Give up (UNAVAILABLE) once this much time has been spent; default 10 000. */
  maxMs: number;
  /** First back-off delay; default 100. */
  initialDelayMs: number;
  /** Largest back-off delay; default 2 000. */
  maxDelayMs: number;
  /**
   * One queue publish that has neither resolved nor rejected after this long is given up on
   * (reported through onError) and may be replaced by a new attempt; default 30 000. Keep it
   * above the queue adapter's own timeout (the RabbitMQ adapter's `publishTimeoutMs`, 8 000).
   */
  attemptTimeoutMs: number;
}

/**
 * Options of {@link createRunnerService}. `logger` (pino-compatible, silent by default),
 * `meterProvider` and `tracerProvider` (default the global ones) come from TelemetryOptions;
 * the log events, metrics and spans are listed in docs/decisions/operations.md.
 */
export interface RunnerServiceOptions extends TelemetryOptions {
  /** Where logs and job state live; default createMemoryLogStore(). */
  logs?: JobLogStore;
  /**
   * Per-job token key (several: any of them, for key rotation). Without it and without `authorize`, anyone may call.
   */
  secret?: JobTokenSecret | readonly JobTokenSecret[];
  /** Replaces the token check: return to allow, throw (RunnerDepotError or ConnectError) to refuse. */
  authorize?: (ctx: RunnerAuthorizeContext) => void | Promise<void>;
  /** Only jobs registered with `expectJob` may stream; others get NOT_FOUND. */
  requireKnownJobs?: boolean;
  /** A job silent this long is declared lost; default 600 000. */
  lostAfterMs?: number;
  /** How often stale jobs are looked for; default min(lostAfterMs / 4, 30 000). */
  sweepIntervalMs?: number;
  /**
   * Ended jobs are forgotten this long after their end (at least lostAfterMs); false keeps them; default 86 400 000.
   */
  retentionMs?: number | false;
  /** Limits; unset members keep the contract's defaults. */
  limits?: Partial<RunnerLimits>;
  /**
   * Take runs of lines (`LogRun`, docs/runner-protocol.md §2) and say so in `runner-accepts: runs` on every
   * StreamLogs answer; default true. false behaves as a server built from the seed's proto: no `runner-accepts`,
   * and a run item ends the call INVALID_ARGUMENT ("an item must carry a log line or the job end"), the items
   * before it stored. For tests that play an older server, and to turn runs off.
   */
  acceptRuns?: boolean;
  /** Bounded publish retry inside a call; unset members keep their defaults. */
  publishRetry?: Partial<PublishRetryOptions>;
  /**
   * Bounds of `follow()`: lines kept per followed job for the followers at its live end
   * (`bufferLines`, default 4 096; `bufferBytes`, default 1 MiB; lines every follower has
   * passed are dropped sooner) and how often a followed
   * job's state is polled when no event came (`pollMs`: 1 000, or 5 000 when the log store
   * has `watch`, e.g. PostgreSQL's LISTEN/NOTIFY) — the bound on how late a line another
   * replica stored reaches a follower here if its event is lost — and how often the store's
   * events may wake a followed job's followers (`eventIntervalMs`, default 100: a storm of
   * forged notifications costs a bounded number of store reads per job).
   */
  follow?: Partial<FollowOptions>;
  /** Called after lines are stored (markers included). */
  onLog?: (event: { requestId: string; lines: StoredLine[]; committed: number }) => void;
  /** Called once per job after its result was accepted by the queue and recorded. */
  onEnd?: (result: JobResult) => void;
  /** Called with failures nobody else sees (a hook that threw, a background publish that failed). */
  onError?: (error: unknown) => void;
  /**
   * `close()` waits at most this long for background publishes (unfinished ones are reported through onError); default
   * 5 000.
   */
  closeTimeoutMs?: number;
}

/**
 * Options of one job registration. `secrets`: values masked in every line of the job the
 * service stores (docs/runner-protocol.md §14), each at least 4 bytes (else INVALID_ARGUMENT);
 * kept in this process's memory only, never stored or published.
 */
export type ExpectJobInfo = JobInfo & { secrets?: readonly string[] };

/** The runner service: a `Runner` ServiceImpl plus the host's controls. */
export interface RunnerService extends ServiceImpl<typeof Runner> {
  /** Registers a job the host launched (`requireKnownJobs`, lost detection, result info). */
  expectJob(requestId: string, info?: ExpectJobInfo): Promise<JobState>;
  /**
   * Cancels a job: its result is published at once with outcome `cancelled`; resolves with it (null when it had already
   * ended).
   */
  cancelJob(requestId: string, reason?: string): Promise<JobResult | null>;
  /**
   * Stored lines of a job: the ones so far, then new ones until the job ends. A job the
   * store does not know yet gets `lostAfterMs` to appear, else the iteration ends (empty);
   * a job forgotten (retention) while followed ends it too. Lines are shared by the job's
   * followers in this process and frozen. A consumer that is slow only falls behind: it
   * catches up from the store by position, nothing is buffered for it.
   */
  follow(
    requestId: string,
    options?: { from?: number; signal?: AbortSignal; sections?: false },
  ): AsyncIterable<StoredLine>;
  /**
   * The same, with a {@link LogSectionEvent} right after each section marker's line (docs/decisions/log-sections.md):
   * tell them from lines by their `section` field. The events agree with `JobLogStore.sections`.
   */
  follow(
    requestId: string,
    options: { from?: number; signal?: AbortSignal; sections: true },
  ): AsyncIterable<StoredLine | LogSectionEvent>;
  /**
   * Recent jobs, newest first, optionally of some states, a page at a time (`next` is
   * the cursor of the following page). FAILED_PRECONDITION when the log store has no
   * `list`; INVALID_ARGUMENT for a bad limit, status or cursor.
   */
  listJobs(options?: ListJobsOptions): Promise<JobPage>;
  /**
   * Stops the lost-job timer and waits for background publishes, at most `closeTimeoutMs` (unfinished ones go to
   * onError).
   */
  close(): Promise<void>;
  /** True when the service has neither a secret nor an authorize hook. */
  readonly acceptsAnyCaller: boolean;
  /** The limits in force. */
  readonly limits: Readonly<RunnerLimits>;
  /** The log store in use. */
  readonly logs: JobLogStore;
  /** Calls in progress. */
  readonly activeCalls: number;
}
