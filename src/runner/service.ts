/**
 * The orchestrator side of runner.v1: a connect-es ServiceImpl of `Runner` that stores
 * log items through a JobLogStore and hands each job's result to a JobResultQueue,
 * following runner-protocol.md rule by rule.
 */
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createContextKey, type HandlerContext, type ServiceImpl } from "@connectrpc/connect";
import { RunnerDepotError } from "../errors.js";
import { createMemoryLogStore } from "../adapters/memory/log-store.js";
import { AckSchema, type Ack, type JobEnd, type LogItem, type Runner } from "../gen/runner/v1/runner_pb.js";
import type { JobInfo, JobLogStore, JobResult, JobResultQueue, JobState, LogEntry, StoredLine } from "./ports.js";
import { verifyJobToken, type JobTokenSecret } from "./token.js";
import { normalizeRequestId } from "./uuid.js";
import { cutUtf8 } from "./line-splitter.js";

/** Trailer (and error metadata) with the job's durably stored item count. */
export const COMMITTED_HEADER = "runner-committed";
/** Trailer saying why an Ack is `ok = false`. */
export const REASON_HEADER = "runner-reason";
/** Request metadata: the job offset of the call's first item. */
export const OFFSET_HEADER = "runner-offset";

/** Why the orchestrator no longer wants a job (`runner-reason`). */
export type EndedReason = "cancelled" | "lost" | "ended";

/** The limits of runner-protocol.md; all enforced. */
export interface RunnerLimits {
  /** Largest request message in bytes (`readMaxBytes`): larger ones end RESOURCE_EXHAUSTED. */
  messageBytes: number;
  /** Longest stored line in UTF-8 bytes; longer lines are cut and followed by a marker line. */
  lineBytes: number;
  /** Stored output bytes per job; past it lines are counted, not stored. */
  jobLogBytes: number;
  /** A call with no item for this long ends DEADLINE_EXCEEDED. */
  idleMs: number;
}

/** The defaults of runner-protocol.md. */
export const DEFAULT_RUNNER_LIMITS: Readonly<RunnerLimits> = Object.freeze({
  messageBytes: 1024 * 1024,
  lineBytes: 64 * 1024,
  jobLogBytes: 256 * 1024 * 1024,
  idleMs: 60_000,
});

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

/** Options of {@link createRunnerService}. */
export interface RunnerServiceOptions {
  /** Where logs and job state live; default createMemoryLogStore(). */
  logs?: JobLogStore;
  /** Per-job token key (several: any of them, for key rotation). Without it and without `authorize`, anyone may call. */
  secret?: JobTokenSecret | readonly JobTokenSecret[];
  /** Replaces the token check: return to allow, throw (RunnerDepotError or ConnectError) to refuse. */
  authorize?: (ctx: RunnerAuthorizeContext) => void | Promise<void>;
  /** Only jobs registered with `expectJob` may stream; others get NOT_FOUND. */
  requireKnownJobs?: boolean;
  /** A job silent this long is declared lost; default 600 000. */
  lostAfterMs?: number;
  /** How often stale jobs are looked for; default min(lostAfterMs / 4, 30 000). */
  sweepIntervalMs?: number;
  /** Ended jobs are forgotten this long after their end (at least lostAfterMs); false keeps them; default 86 400 000. */
  retentionMs?: number | false;
  /** Limits; unset members keep the contract's defaults. */
  limits?: Partial<RunnerLimits>;
  /** Bounded publish retry inside a call; unset members keep their defaults. */
  publishRetry?: Partial<PublishRetryOptions>;
  /** Called after lines are stored (markers included). */
  onLog?: (event: { requestId: string; lines: StoredLine[]; committed: number }) => void;
  /** Called once per job after its result was accepted by the queue and recorded. */
  onEnd?: (result: JobResult) => void;
  /** Called with failures nobody else sees (a hook that threw, a background publish that failed). */
  onError?: (error: unknown) => void;
  /** `close()` waits at most this long for background publishes (unfinished ones are reported through onError); default 5 000. */
  closeTimeoutMs?: number;
}

/** Options of one job registration. */
export type ExpectJobInfo = JobInfo;

/** The runner service: a `Runner` ServiceImpl plus the host's controls. */
export interface RunnerService extends ServiceImpl<typeof Runner> {
  /** Registers a job the host launched (`requireKnownJobs`, lost detection, result info). */
  expectJob(requestId: string, info?: ExpectJobInfo): Promise<JobState>;
  /** Cancels a job: its result is published at once with outcome `cancelled`; resolves with it (null when it had already ended). */
  cancelJob(requestId: string, reason?: string): Promise<JobResult | null>;
  /**
   * Stored lines of a job: the ones so far, then new ones until the job ends. A job the
   * store does not know yet gets `lostAfterMs` to appear, else the iteration ends (empty);
   * a job forgotten (retention) while followed ends it too.
   */
  follow(requestId: string, options?: { from?: number; signal?: AbortSignal }): AsyncIterable<StoredLine>;
  /** Stops the lost-job timer and waits for background publishes, at most `closeTimeoutMs` (unfinished ones go to onError). */
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

/**
 * Context value a server sets so a call ends UNAVAILABLE (with `runner-committed`)
 * when the server shuts down; see startRunnerServer.
 */
export const kShutdownSignal = createContextKey<AbortSignal | undefined>(undefined, { description: "runner shutdown signal" });

/** Context value a server sets to use its own message limit instead of the service's. */
export const kMessageBytes = createContextKey<number | undefined>(undefined, { description: "runner message limit" });

/**
 * A request iterable may also offer its items in batches under this key (the gRPC fast
 * path of createRunnerHandler does): the service then awaits once per batch instead of
 * once per item. Every item still goes through the same rules, one by one.
 */
export const kItemBatches: unique symbol = Symbol.for("runner-depot.itemBatches");

/** A source of items in batches: resolves with the next non-empty batch, or null at the end. */
export interface ItemBatchSource {
  [kItemBatches](): () => Promise<readonly LogItem[] | null>;
}

/** Reads a call's items one at a time from batches (of one item for plain async iterables). */
interface ItemReader {
  batch: readonly LogItem[];
  pos: number;
  pull: () => Promise<readonly LogItem[] | null>;
}

function readerOf(requests: AsyncIterable<LogItem>): ItemReader {
  const batched = (requests as Partial<ItemBatchSource>)[kItemBatches];
  if (typeof batched === "function") return { batch: [], pos: 0, pull: batched.call(requests) };
  const it = requests[Symbol.asyncIterator]();
  return {
    batch: [],
    pos: 0,
    pull: async () => {
      const result = await it.next();
      return result.done ? null : [result.value];
    },
  };
}

/**
 * The wire limit to give connect (`readMaxBytes`) for a message limit: generous, since
 * connect drops every message of a read chunk when one is too large, while the service
 * refuses an oversized item exactly, after storing the items before it.
 */
export function wireLimitFor(messageBytes: number): number {
  return messageBytes * 2 + 64 * 1024;
}

const MARKER_PREFIX = "[runner-depot]";
const BACKPRESSURE_ITEMS = 8192;
const BACKPRESSURE_BYTES = 8 * 1024 * 1024;

/** A job's slot: its active call and the chain that serialises its store operations. */
interface Slot {
  active: { stop(error: RunnerDepotError): void } | null;
  chain: Promise<unknown>;
  refs: number;
}

/**
 * One publish of a job's result. While it is in flight it is the job's only one: a
 * replayed end, a cancel or the lost sweep wait for it instead of publishing again.
 */
interface PublishAttempt {
  readonly result: JobResult;
  /** Item position of the runner's end (finished results); undefined for cancelled and lost. */
  readonly at: number | undefined;
  /** True once the queue accepted; false when it refused or the attempt was given up on (never rejects). */
  settled: Promise<boolean>;
  /** Why the attempt failed. */
  error: unknown;
  /** The store's answer once the accepted result is recorded. */
  recorded: Promise<{ state: JobState; first: boolean }> | null;
}

const TIMED_OUT: unique symbol = Symbol("timed out");

/** `p`, or TIMED_OUT after `ms` (the timer is cleared when `p` settles first). */
function within<T>(p: Promise<T>, ms: number): Promise<T | typeof TIMED_OUT> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => resolve(TIMED_OUT), Math.max(ms, 0));
    p.then(
      (value) => {
        clearTimeout(timer);
        resolve(value);
      },
      (error: unknown) => {
        clearTimeout(timer);
        reject(error);
      },
    );
  });
}

/** Thrown inside a call to end it with ok=false. */
class EndedSignal {
  constructor(readonly reason: EndedReason) {}
}

function uErr(code: ConstructorParameters<typeof RunnerDepotError>[0], message: string): RunnerDepotError {
  return new RunnerDepotError(code, message);
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms).unref?.());

/**
 * Creates the orchestrator's runner service.
 *
 * @example
 * const queue = createMemoryQueue();
 * const runner = createRunnerService(queue, { secret: process.env.RUNNER_SECRET });
 * const server = await startRunnerServer(runner, { port: 50051 });
 * // or mount it yourself: connectNodeAdapter({ routes: (r) => r.service(Runner, runner) })
 */
export function createRunnerService(queue: JobResultQueue, options: RunnerServiceOptions = {}): RunnerService {
  const logs = options.logs ?? createMemoryLogStore();
  const limits: RunnerLimits = { ...DEFAULT_RUNNER_LIMITS, ...stripUndefined(options.limits ?? {}) };
  for (const [name, value] of Object.entries(limits)) {
    if (!(typeof value === "number" && value > 0)) throw new RangeError(`limits.${name} must be a positive number`);
  }
  const retry: PublishRetryOptions = {
    maxMs: 10_000,
    initialDelayMs: 100,
    maxDelayMs: 2_000,
    attemptTimeoutMs: 30_000,
    ...stripUndefined(options.publishRetry ?? {}),
  };
  const closeTimeoutMs = options.closeTimeoutMs ?? 5_000;
  const lostAfterMs = options.lostAfterMs ?? 600_000;
  const retentionMs = options.retentionMs === false ? false : Math.max(options.retentionMs ?? 86_400_000, lostAfterMs);
  const secrets = options.secret === undefined ? null : Array.isArray(options.secret) ? (options.secret as JobTokenSecret[]) : [options.secret as JobTokenSecret];
  if (secrets && secrets.length === 0) throw new RangeError("secret: give at least one key");
  const acceptsAnyCaller = !secrets && !options.authorize;

  const slots = new Map<string, Slot>();
  /** Jobs the host cancelled or the sweep declared lost, until the store records it. */
  const ending = new Map<string, "cancelled" | "lost">();
  const watchers = new Map<string, Set<() => void>>();
  /** Work that outlives the call or host action that started it → the job it is about. */
  const background = new Map<Promise<unknown>, string>();
  /** The publish of each job's result in flight: at most one per job (see PublishAttempt). */
  const inFlight = new Map<string, PublishAttempt>();
  let closing: Promise<void> | null = null;
  const calls = new Set<CallRun>();
  let closed = false;
  const closeController = new AbortController();

  const report = (error: unknown) => {
    try {
      options.onError?.(error);
    } catch {
      // A broken error hook must not break the service.
    }
  };

  function slotOf(id: string): Slot {
    let slot = slots.get(id);
    if (!slot) {
      slot = { active: null, chain: Promise.resolve(), refs: 0 };
      slots.set(id, slot);
    }
    return slot;
  }
  function release(id: string, slot: Slot) {
    if (--slot.refs === 0 && slot.active === null && slots.get(id) === slot) slots.delete(id);
  }
  /** Runs `fn` after every earlier store operation of the job (one writer per job). */
  function locked<T>(id: string, fn: () => Promise<T>): Promise<T> {
    const slot = slotOf(id);
    slot.refs++;
    const run = slot.chain.then(fn);
    slot.chain = run.catch(() => undefined);
    return run.finally(() => release(id, slot));
  }

  function notify(id: string) {
    const set = watchers.get(id);
    if (set) for (const wake of set) wake();
  }

  /**
   * Starts one queue publish of a job's result and makes it the job's publish in flight.
   * Whoever needs the job's result published (a replayed end, a cancel, the lost sweep)
   * waits for this attempt instead of starting another, so a slow queue never receives two
   * results for one job. An accepted result is recorded by whoever waits for it, or in the
   * background when nobody does (the call that started it may have answered UNAVAILABLE).
   */
  function startAttempt(id: string, result: JobResult, at: number | undefined): PublishAttempt {
    let timer: NodeJS.Timeout | undefined;
    let givenUp = false;
    const attempt: PublishAttempt = { result, at, settled: null as unknown as Promise<boolean>, error: undefined, recorded: null };
    const published = Promise.resolve().then(() => queue.publishJobResult(result));
    attempt.settled = new Promise<boolean>((resolve) => {
      timer = setTimeout(() => {
        givenUp = true;
        attempt.error = new RunnerDepotError("UNAVAILABLE", `the queue did not answer the publish of job ${id}'s result within ${retry.attemptTimeoutMs} ms; the attempt was given up on`);
        report(attempt.error);
        resolve(false);
      }, retry.attemptTimeoutMs);
      timer.unref?.();
      published.then(
        () => {
          clearTimeout(timer);
          // Past the attempt limit a new attempt may already have published: say so.
          if (givenUp) report(new RunnerDepotError("INTERNAL", `the queue accepted job ${id}'s result after the attempt was given up on; it may have been published twice`));
          resolve(true);
        },
        (error: unknown) => {
          clearTimeout(timer);
          attempt.error = error;
          resolve(false);
        },
      );
    });
    inFlight.set(id, attempt);
    track(
      id,
      attempt.settled.then((accepted) => {
        if (!accepted) {
          if (inFlight.get(id) === attempt) inFlight.delete(id);
          return undefined;
        }
        return locked(id, () => recordAccepted(id, attempt));
      }),
    );
    return attempt;
  }

  /** Records an accepted result once (call it under the job's lock); the job's publish is then over. */
  function recordAccepted(id: string, attempt: PublishAttempt): Promise<{ state: JobState; first: boolean }> {
    if (attempt.recorded) return attempt.recorded;
    const recording = (async () => {
      const finished = await logs.finish(id, attempt.result, attempt.at === undefined ? undefined : { at: attempt.at });
      if (inFlight.get(id) === attempt) inFlight.delete(id);
      notify(id);
      if (finished.first) safe(() => options.onEnd?.(attempt.result));
      return finished;
    })();
    attempt.recorded = recording;
    // A store that failed: whoever waits next records again (the result stays accepted).
    recording.catch(() => {
      if (attempt.recorded === recording) attempt.recorded = null;
    });
    return recording;
  }

  /** Publishes a cancelled or lost result until the queue accepts (never dropped while the service lives). */
  async function publishPersistent(id: string, result: JobResult): Promise<PublishAttempt> {
    let delay = retry.initialDelayMs;
    for (;;) {
      const attempt = startAttempt(id, result, undefined);
      if (await attempt.settled) return attempt;
      if (closed) throw new RunnerDepotError("UNAVAILABLE", `result of job ${id} not published before close`, { cause: attempt.error });
      await sleep(Math.min(delay, retry.maxDelayMs));
      delay *= 2;
    }
  }

  function resultFrom(state: JobState | null, id: string, outcome: "cancelled" | "lost", now: Date): JobResult {
    return {
      requestId: id,
      outcome,
      exitCode: -1,
      success: false,
      repoUrl: typeof state?.info.repoUrl === "string" ? state.info.repoUrl : "",
      commitSha: typeof state?.info.commitSha === "string" ? state.info.commitSha : "",
      lines: { stdout: state?.lines.stdout ?? 0, stderr: state?.lines.stderr ?? 0 },
      logTruncated: state?.logTruncated ?? false,
      startedAt: state?.startedAt ?? null,
      endedAt: now.toISOString(),
    };
  }

  /** Ends a job from the orchestrator's side (cancel or lost): publish, then record. */
  function endFromHost(id: string, outcome: "cancelled" | "lost", mustBeStale?: Date): Promise<JobResult | null> {
    let marked = false;
    const work = (async () => {
      try {
        return await locked(id, async () => {
          const state = await logs.get(id);
          if (state && state.status !== "open") return null;
          // A job that spoke since the sweep looked is not lost after all.
          if (mustBeStale && state && Date.parse(state.lastSeenAt) >= mustBeStale.getTime()) return null;
          if (mustBeStale && slots.get(id)?.active) return null;
          // The runner's end may still be on its way to the queue (the call that sent it
          // stopped waiting): that publish decides first, so the job yields one result.
          const pendingEnd = inFlight.get(id);
          let current = state;
          if (pendingEnd) {
            if (await pendingEnd.settled) {
              await recordAccepted(id, pendingEnd);
              return null;
            }
            current = await logs.get(id);
          }
          ending.set(id, outcome);
          marked = true;
          const result = resultFrom(current, id, outcome, new Date());
          const attempt = await publishPersistent(id, result);
          const finished = await recordAccepted(id, attempt);
          return finished.first ? result : null;
        });
      } finally {
        if (marked || outcome === "cancelled") ending.delete(id);
      }
    })();
    track(id, work);
    return work;
  }

  function track(id: string, p: Promise<unknown>) {
    background.set(p, id);
    p.catch(report).finally(() => background.delete(p));
  }

  function safe(fn: () => void) {
    try {
      fn();
    } catch (error) {
      report(error);
    }
  }

  // The lost-job sweep and retention.
  const sweepEvery = options.sweepIntervalMs ?? Math.min(Math.max(Math.floor(lostAfterMs / 4), 10), 30_000);
  let sweeping = false;
  const sweepTimer = setInterval(() => {
    if (sweeping || closed) return;
    sweeping = true;
    (async () => {
      const before = new Date(Date.now() - lostAfterMs);
      for (const state of await logs.stale(before)) {
        if (closed) break;
        // A job whose end is being published is not silent: that publish decides.
        if (ending.has(state.requestId) || inFlight.has(state.requestId) || slots.get(state.requestId)?.active) continue;
        void endFromHost(state.requestId, "lost", before);
      }
      if (retentionMs !== false && logs.prune) await logs.prune(new Date(Date.now() - retentionMs));
    })()
      .catch(report)
      .finally(() => {
        sweeping = false;
      });
  }, sweepEvery);
  sweepTimer.unref?.();

  /** One StreamLogs call. */
  class CallRun {
    readonly ctx: HandlerContext;
    /** The message limit of this call (the server's, else the service's). */
    readonly maxBytes: number;
    id = "";
    /** The first item's request_id as sent (before lower-casing). */
    rawId = "";
    slot: Slot | null = null;
    offset = 0;
    /** Items of this call seen so far. */
    index = 0;
    /** Last state the store returned for the job. */
    state: JobState | null = null;
    /** Position the next new item will take (store's committed + items queued). */
    nextPos = 0;
    storedBytes = 0;
    truncated = false;
    endSeen = false;
    pending: LogEntry[] = [];
    pendingAt = 0;
    pendingBytes = 0;
    flushing: Promise<void> | null = null;
    flushError: unknown = null;
    /** Set when the call must stop at once (newer call, shutdown, idle). */
    stopError: RunnerDepotError | null = null;
    /** Rejecters of the waits in progress; a stop rejects them all. */
    private readonly interrupters = new Set<(error: unknown) => void>();
    /** When the call started waiting for its next item (0: not waiting). */
    waitingSince = 0;
    private idleTimer: NodeJS.Timeout | null = null;

    constructor(ctx: HandlerContext) {
      this.ctx = ctx;
      this.maxBytes = ctx.values.get(kMessageBytes) ?? limits.messageBytes;
      this.armIdle(limits.idleMs);
    }

    // One timer per call, re-armed lazily: cheaper than a timer per item.
    private armIdle(ms: number) {
      this.idleTimer = setTimeout(() => {
        this.idleTimer = null;
        if (this.stopError) return;
        const left = this.waitingSince === 0 ? limits.idleMs : this.waitingSince + limits.idleMs - Date.now();
        if (left <= 0) this.stop(uErr("DEADLINE_EXCEEDED", `no item for ${limits.idleMs} ms; the call was ended`));
        else this.armIdle(left);
      }, ms);
    }

    stop(error: RunnerDepotError) {
      if (this.stopError) return;
      this.stopError = error;
      for (const interrupt of this.interrupters) interrupt(error);
      this.interrupters.clear();
    }

    dispose() {
      if (this.idleTimer) clearTimeout(this.idleTimer);
      this.idleTimer = null;
    }

    get committed(): number {
      return this.state?.committed ?? 0;
    }

    /** Queues a new entry; flushes in the background, batching whatever piles up meanwhile. */
    // Returns a promise only when the call must wait (back-pressure): most items need no await.
    enqueue(entry: LogEntry): Promise<void> | undefined {
      if (this.pending.length === 0) this.pendingAt = this.nextPos;
      this.pending.push(entry);
      this.pendingBytes += entry.bytes + 64;
      this.nextPos++;
      if (!this.flushing) {
        // Cleared only by the loop it belongs to, even when the loop ends at once.
        const loop: Promise<void> = this.flushLoop().finally(() => {
          if (this.flushing === loop) this.flushing = null;
        });
        this.flushing = loop;
      }
      if (this.pending.length >= BACKPRESSURE_ITEMS || this.pendingBytes >= BACKPRESSURE_BYTES) {
        return this.guard(this.flushing).then(() => {
          if (this.flushError) throw this.flushError;
        });
      }
      if (this.flushError) throw this.flushError;
      return undefined;
    }

    private async flushLoop(): Promise<void> {
      // Let the items already received in this turn join the first batch.
      await new Promise<void>((resolve) => setImmediate(resolve));
      {
        while (this.pending.length > 0 && !this.flushError) {
          const batch = this.pending;
          const at = this.pendingAt;
          this.pending = [];
          this.pendingBytes = 0;
          try {
            const state = await locked(this.id, async () => {
              // A newer call or a cancel took the job meanwhile: store nothing more.
              if (this.stopError?.code === "ABORTED") throw this.stopError;
              const reason = ending.get(this.id);
              if (reason) throw new EndedSignal(reason);
              const pendingEnd = inFlight.get(this.id);
              if (pendingEnd) await settlePendingPublish(this, pendingEnd);
              // The job exists in the store once its first item is stored.
              if (this.state === null) this.state = await logs.open(this.id);
              return logs.append(this.id, at, batch);
            });
            this.state = state;
            notify(this.id);
            if (options.onLog) {
              const lines: StoredLine[] = [];
              for (const entry of batch) for (const line of entry.stored) lines.push(line);
              if (lines.length > 0) safe(() => options.onLog!({ requestId: this.id, lines, committed: state.committed }));
            }
          } catch (error) {
            this.flushError = await explainRefusal(this.id, error);
            this.pending = [];
          }
        }
      }
    }

    /** Waits until every queued entry is stored; throws what storing threw. */
    async flush(): Promise<void> {
      while (this.flushing) await this.flushing;
      if (this.flushError) throw this.flushError;
    }

    /**
     * Waits for `p` unless the call is stopped first. (No Promise.race with a
     * long-lived promise: that would keep one reaction per item alive.)
     */
    guard<T>(p: Promise<T>): Promise<T> {
      if (this.stopError) return Promise.reject(this.stopError);
      return new Promise<T>((resolve, reject) => {
        this.interrupters.add(reject);
        p.then(
          (value) => {
            this.interrupters.delete(reject);
            resolve(value);
          },
          (error: unknown) => {
            this.interrupters.delete(reject);
            reject(error);
          },
        );
      });
    }

    /** Current state from the store, refreshed under the job's lock. */
    async refresh(): Promise<void> {
      if (!this.id) return;
      // A job being cancelled or declared lost stores nothing more, and its publish may
      // hold the lock for long: read it without the lock.
      this.state = ending.has(this.id) ? await logs.get(this.id) : await locked(this.id, () => logs.get(this.id));
    }
  }

  async function streamLogs(requests: AsyncIterable<LogItem>, ctx: HandlerContext): Promise<Ack> {
    const call = new CallRun(ctx);
    calls.add(call);
    const it = readerOf(requests);
    const shutdown = ctx.values.get(kShutdownSignal);
    const onShutdown = () => call.stop(uErr("UNAVAILABLE", "the server is shutting down; retry the call"));
    shutdown?.addEventListener("abort", onShutdown);
    if (shutdown?.aborted) onShutdown();
    const onClientGone = () => call.stop(uErr("UNAVAILABLE", "the call was cancelled by the client"));
    ctx.signal.addEventListener("abort", onClientGone);
    try {
      const ack = await runCall(call, it);
      // Success: the trailer says where the job stands (an accepted end included).
      if (call.id && !ctx.responseTrailer.has(COMMITTED_HEADER)) ctx.responseTrailer.set(COMMITTED_HEADER, String(call.committed));
      return ack;
    } catch (error) {
      throw await toResponseError(call, error);
    } finally {
      shutdown?.removeEventListener("abort", onShutdown);
      ctx.signal.removeEventListener("abort", onClientGone);
      calls.delete(call);
      call.dispose();
      if (call.slot) {
        if (call.slot.active === call) call.slot.active = null;
        release(call.id, call.slot);
      }
    }
  }

  /** Reads the next item, or null at the end of the request stream (waits only when the current batch is used up). */
  function nextItem(call: CallRun, it: ItemReader): LogItem | null | Promise<LogItem | null> {
    if (it.pos < it.batch.length) return it.batch[it.pos++]!;
    return nextBatch(call, it);
  }

  async function nextBatch(call: CallRun, it: ItemReader): Promise<LogItem | null> {
    const read = it.pull();
    // The read may settle after we gave up on it (stream reset); never leave it unhandled.
    read.catch(() => undefined);
    call.waitingSince = Date.now();
    try {
      const batch = await call.guard(read);
      if (batch === null || batch.length === 0) return null;
      it.batch = batch;
      it.pos = 1;
      return batch[0]!;
    } catch (error) {
      if (error instanceof ConnectError && error.code === Code.ResourceExhausted) {
        throw new RunnerDepotError("RESOURCE_EXHAUSTED", `a message is over the ${limits.messageBytes}-byte limit; split the line`, { cause: error });
      }
      throw error;
    } finally {
      call.waitingSince = 0;
    }
  }

  async function authenticate(call: CallRun, id: string): Promise<void> {
    const headers = call.ctx.requestHeader;
    const token = bearer(headers.get("authorization"));
    if (options.authorize) {
      try {
        await options.authorize({
          requestId: id,
          headers,
          token,
          offset: parseOffset(headers.get(OFFSET_HEADER)),
          protocol: call.ctx.protocolName,
          signal: call.ctx.signal,
        });
      } catch (error) {
        if (error instanceof RunnerDepotError || error instanceof ConnectError) throw error;
        throw new RunnerDepotError("PERMISSION_DENIED", error instanceof Error ? error.message : "not authorized", { cause: error });
      }
      return;
    }
    if (secrets && token !== null && !verifyJobToken(secrets, id, token)) {
      throw uErr("PERMISSION_DENIED", "the token is not valid for this job");
    }
  }

  async function runCall(call: CallRun, it: ItemReader): Promise<Ack> {
    const headers = call.ctx.requestHeader;
    // Token presence and form are checked before anything is read (first in the check order).
    if (secrets && !options.authorize && bearer(headers.get("authorization")) === null) {
      throw uErr("UNAUTHENTICATED", "missing or malformed authorization: expected `Bearer <token>`");
    }
    const offset = parseOffset(headers.get(OFFSET_HEADER));

    const first = await nextItem(call, it);
    if (first === null) {
      if (Number.isNaN(offset)) throw uErr("INVALID_ARGUMENT", `malformed ${OFFSET_HEADER}: expected a non-negative integer`);
      // A call with zero items is fine, and names no job: no runner-committed to give.
      return create(AckSchema, { ok: true });
    }
    const id = normalizeRequestId(first.requestId);
    if (id === null) throw uErr("INVALID_ARGUMENT", `request_id is not a UUID: ${JSON.stringify(first.requestId.slice(0, 64))}`);
    await authenticate(call, id);
    if (options.requireKnownJobs) {
      const known = await logs.get(id);
      if (!known?.expected) throw uErr("NOT_FOUND", `unknown job ${id}`);
    }

    // The newer call wins, and only now that it has passed auth.
    call.id = id;
    call.rawId = first.requestId;
    const slot = slotOf(id);
    slot.refs++;
    call.slot = slot;
    const older = slot.active;
    slot.active = call;
    older?.stop(uErr("ABORTED", "replaced by a newer call of the same job"));
    // The check order: a malformed offset and a bad first item come before ok = false.
    if (Number.isNaN(offset)) throw uErr("INVALID_ARGUMENT", `malformed ${OFFSET_HEADER}: expected a non-negative integer`);
    // A job being cancelled or declared lost answers at once, even while its result
    // is still being published (which holds the job's lock).
    const hostReason = ending.get(id);
    if (hostReason) {
      checkItemShape(call, first);
      return endedAck(call, hostReason);
    }
    await call.guard(call.refresh());
    call.offset = offset;

    try {
      let item: LogItem | null = first;
      while (item !== null) {
        // Most items are handled synchronously; only a wait (back-pressure, the end) awaits.
        const processing = processItem(call, item);
        if (processing !== undefined) await processing;
        if (call.stopError) throw call.stopError;
        const next = nextItem(call, it);
        item = next instanceof Promise ? await next : next;
      }
      await call.guard(call.flush());
      return create(AckSchema, { ok: true });
    } catch (error) {
      if (error instanceof EndedSignal) return endedAck(call, error.reason);
      throw error;
    }
  }

  /** A store refusal because the job ended meanwhile (cancel, lost, another replica) is an ok=false, not an error. */
  async function explainRefusal(id: string, error: unknown): Promise<unknown> {
    if (!(error instanceof RunnerDepotError) || error.code !== "FAILED_PRECONDITION") return error;
    const state = await logs.get(id).catch(() => null);
    if (!state || state.status === "open") return error;
    return new EndedSignal(state.status === "finished" ? "ended" : state.status);
  }

  async function endedAck(call: CallRun, reason: EndedReason): Promise<Ack> {
    // Queued entries of a job the orchestrator dropped are not stored.
    call.pending = [];
    try {
      await call.flush();
    } catch {
      // The flush was refused because the job ended; the state below says where it stands.
    }
    // Read without the job's lock: a cancel may hold it while it publishes.
    call.state = (await logs.get(call.id).catch(() => null)) ?? call.state;
    call.ctx.responseTrailer.set(COMMITTED_HEADER, String(call.committed));
    call.ctx.responseTrailer.set(REASON_HEADER, reason);
    return create(AckSchema, { ok: false });
  }

  function endedReasonOf(call: CallRun): EndedReason | null {
    const hostReason = ending.get(call.id);
    if (hostReason) return hostReason;
    const status = call.state?.status;
    if (status === "cancelled" || status === "lost") return status;
    return null;
  }

  /** The first item's own checks (size, an event present), for an answer given before processItem runs. */
  function checkItemShape(call: CallRun, item: LogItem): void {
    const event = item.event;
    const size = encodedSize(item, event.case === "log" ? Buffer.byteLength(event.value.line, "utf8") : 0);
    if (size > call.maxBytes) {
      throw new RunnerDepotError("RESOURCE_EXHAUSTED", `a message of ${size} bytes is over the ${call.maxBytes}-byte limit; split the line`);
    }
    if (event.case === undefined) throw uErr("INVALID_ARGUMENT", "an item must carry a log line or the job end");
  }

  /**
   * Applies the rules to one item. Throws (synchronously) on a bad item; returns a
   * promise only when the call has to wait (back-pressure or the end item).
   */
  function processItem(call: CallRun, item: LogItem): Promise<void> | undefined {
    const index = call.index++;
    const maxBytes = call.maxBytes;
    const event = item.event;
    // The line's UTF-8 size serves both the message limit and the line limit.
    const lineBytes = event.case === "log" ? Buffer.byteLength(event.value.line, "utf8") : 0;
    const size = encodedSize(item, lineBytes);
    if (size > maxBytes) {
      throw new RunnerDepotError("RESOURCE_EXHAUSTED", `a message of ${size} bytes is over the ${maxBytes}-byte limit; split the line`);
    }
    // The same text as the first item's needs no case folding.
    if (index > 0 && item.requestId !== call.rawId && item.requestId.toLowerCase() !== call.id) {
      throw uErr("INVALID_ARGUMENT", "all items of a call must carry the same request_id");
    }
    if (call.endSeen) throw uErr("INVALID_ARGUMENT", "no item may follow the end item");
    if (event.case === undefined) throw uErr("INVALID_ARGUMENT", "an item must carry a log line or the job end");

    const hostReason = endedReasonOf(call);
    if (hostReason) throw new EndedSignal(hostReason);
    const pos = call.offset + index;
    if (call.state?.status === "finished") {
      // Duplicates of a finished job are harmless; anything new is refused.
      if (pos < call.state.committed) {
        if (event.case === "end") call.endSeen = true;
        return undefined;
      }
      throw new EndedSignal("ended");
    }
    if (index === 0) {
      if (pos > call.committed) {
        throw new RunnerDepotError("FAILED_PRECONDITION", `offset ${pos} is past the ${call.committed} items stored; resend from ${call.committed}`);
      }
      call.nextPos = call.committed;
      call.storedBytes = call.state?.storedBytes ?? 0;
      call.truncated = call.state?.logTruncated ?? false;
    }
    if (pos < call.nextPos) {
      // A resend of a stored item: skipped, not compared.
      if (event.case === "end") call.endSeen = true;
      return undefined;
    }

    if (event.case === "log") return call.enqueue(entryFor(call, event.value.line, event.value.stderr, lineBytes));
    call.endSeen = true;
    return processEnd(call, event.value);
  }

  /** The end item: store what came before, publish, then record. */
  async function processEnd(call: CallRun, end: JobEnd): Promise<void> {
    await call.guard(call.flush());
    const at = call.nextPos;
    await call.guard(locked(call.id, () => publishEnd(call, end, at)));
    call.nextPos = at + 1;
  }

  /**
   * Publishes the runner's end within the retry bound, then records it (under the job's
   * lock). An earlier attempt still in flight (its call answered UNAVAILABLE) is awaited,
   * never doubled; a new attempt starts only once the earlier one has failed.
   */
  async function publishEnd(call: CallRun, end: JobEnd, at: number): Promise<void> {
    const start = Date.now();
    let delay = retry.initialDelayMs;
    let result: JobResult | null = null;
    for (;;) {
      if (call.stopError) throw call.stopError;
      const reason = ending.get(call.id);
      if (reason) throw new EndedSignal(reason);
      let attempt = inFlight.get(call.id);
      if (!attempt) {
        const state = (await logs.get(call.id)) ?? (await logs.open(call.id));
        call.state = state;
        if (state.status !== "open") throw new EndedSignal(state.status === "finished" ? "ended" : state.status);
        result ??= finishedResult(call.id, state, end);
        attempt = startAttempt(call.id, result, at);
      }
      const accepted = await call.guard(within(attempt.settled, retry.maxMs - (Date.now() - start)));
      if (accepted === true) {
        const finished = await recordAccepted(call.id, attempt);
        call.state = finished.state;
        if (finished.state.status !== "finished") throw new EndedSignal(finished.state.status === "open" ? "ended" : finished.state.status);
        return;
      }
      const wait = Math.min(delay, retry.maxDelayMs);
      if (accepted === TIMED_OUT || Date.now() - start + wait >= retry.maxMs || closeController.signal.aborted) {
        // A publish still in flight stays the job's: the replayed end waits for it.
        throw new RunnerDepotError("UNAVAILABLE", "the job-result queue is unavailable; retry the call later", { cause: attempt.error });
      }
      await call.guard(sleep(wait * (0.5 + Math.random() / 2)));
      delay *= 2;
    }
  }

  function finishedResult(id: string, state: JobState, end: JobEnd): JobResult {
    const now = new Date();
    return {
      requestId: id,
      outcome: "finished",
      exitCode: end.exitCode,
      success: end.success,
      repoUrl: end.repoUrl || (typeof state.info.repoUrl === "string" ? state.info.repoUrl : ""),
      commitSha: end.commitSha || (typeof state.info.commitSha === "string" ? state.info.commitSha : ""),
      lines: { ...state.lines },
      logTruncated: state.logTruncated,
      startedAt: state.startedAt ?? now.toISOString(),
      endedAt: now.toISOString(),
    };
  }

  /**
   * A result of this job is still being published (e.g. an end whose call stopped waiting):
   * it decides whether new items may be stored. Accepted: the job has ended (ok = false).
   * Refused: the job is still open, go on. Still in flight: UNAVAILABLE.
   */
  async function settlePendingPublish(call: CallRun, attempt: PublishAttempt): Promise<void> {
    const accepted = await call.guard(within(attempt.settled, retry.maxMs));
    if (accepted === TIMED_OUT) throw new RunnerDepotError("UNAVAILABLE", "the job's result is still being published; retry the call later");
    if (accepted) {
      const state = (await recordAccepted(call.id, attempt)).state;
      call.state = state;
      throw new EndedSignal(state.status === "cancelled" || state.status === "lost" ? state.status : "ended");
    }
  }

  function entryFor(call: CallRun, line: string, stderr: boolean, lineBytes: number): LogEntry {
    if (call.truncated) return { stored: [], stderr, bytes: 0 };
    let text = line;
    let bytes = lineBytes;
    const stored: StoredLine[] = [];
    let marker: StoredLine | null = null;
    if (bytes > limits.lineBytes) {
      const cut = cutUtf8(line, limits.lineBytes);
      marker = { line: `${MARKER_PREFIX} line truncated: ${bytes} bytes, kept ${cut.bytes}`, stderr, marker: true };
      text = cut.text;
      bytes = cut.bytes;
    }
    if (call.storedBytes + bytes > limits.jobLogBytes) {
      call.truncated = true;
      return {
        stored: [
          {
            line: `${MARKER_PREFIX} log truncated: the job log reached its ${limits.jobLogBytes}-byte limit; later lines are counted, not stored`,
            stderr,
            marker: true,
          },
        ],
        stderr,
        bytes: 0,
        capped: true,
      };
    }
    stored.push({ line: text, stderr });
    if (marker) stored.push(marker);
    call.storedBytes += bytes;
    return { stored, stderr, bytes };
  }

  /** Turns any failure into the ConnectError the runner sees, with `runner-committed` when the job is known. */
  async function toResponseError(call: CallRun, error: unknown): Promise<ConnectError> {
    const err = RunnerDepotError.from(error instanceof EndedSignal ? uErr("INTERNAL", "unexpected end signal") : error);
    if (err.code === "INTERNAL") report(error);
    if (!call.id || !call.slot) return err.toConnectError();
    // Items received before the failure stay stored, unless this call was replaced.
    if (err.code !== "ABORTED") {
      try {
        await call.flush();
      } catch (flushError) {
        if (!(flushError instanceof EndedSignal)) report(flushError);
      }
    }
    if (err.code !== "ABORTED" || call.state === null) await call.refresh().catch(() => undefined);
    // Both gRPC (trailers) and Connect (end-of-stream metadata) append the error's
    // metadata to the response trailers, so it goes there once and only there.
    call.ctx.responseTrailer.delete(COMMITTED_HEADER);
    return err.toConnectError(new Headers({ [COMMITTED_HEADER]: String(call.committed) }));
  }

  const service: RunnerService = {
    async streamLogs(requests, ctx) {
      if (closed) throw uErr("UNAVAILABLE", "the runner service is closed").toConnectError();
      return streamLogs(requests, ctx);
    },
    async expectJob(requestId, info = {}) {
      const id = normalizeRequestId(requestId);
      if (id === null) throw uErr("INVALID_ARGUMENT", `not a UUID: ${requestId}`);
      return locked(id, () => logs.open(id, { expect: true, info, now: new Date() }));
    },
    async cancelJob(requestId, _reason) {
      const id = normalizeRequestId(requestId);
      if (id === null) throw uErr("INVALID_ARGUMENT", `not a UUID: ${requestId}`);
      // Marked at once, so calls in flight stop storing at their next item.
      if (!ending.has(id)) {
        const known = await logs.get(id);
        if (known && known.status !== "open") return null;
        ending.set(id, "cancelled");
      }
      return endFromHost(id, "cancelled");
    },
    follow(requestId, followOptions = {}) {
      const id = normalizeRequestId(requestId);
      if (id === null) throw uErr("INVALID_ARGUMENT", `not a UUID: ${requestId}`);
      return followJob(id, followOptions.from ?? 0, followOptions.signal);
    },
    close() {
      closing ??= (async () => {
        closed = true;
        clearInterval(sweepTimer);
        closeController.abort();
        // Bounded: a queue that never answers must not hang the host's shutdown.
        const deadline = Date.now() + closeTimeoutMs;
        while (background.size > 0) {
          const left = deadline - Date.now();
          if (left <= 0) {
            const jobs = [...new Set(background.values())];
            report(
              new RunnerDepotError(
                "UNAVAILABLE",
                `runner service closed with ${background.size} background publish(es) unfinished after ${closeTimeoutMs} ms (jobs ${jobs.join(", ")})`,
                { details: { jobs } },
              ),
            );
            return;
          }
          await within(Promise.allSettled([...background.keys()]), left);
        }
      })();
      return closing;
    },
    get acceptsAnyCaller() {
      return acceptsAnyCaller;
    },
    get limits() {
      return limits;
    },
    get logs() {
      return logs;
    },
    get activeCalls() {
      return calls.size;
    },
  };

  async function* followJob(id: string, from: number, signal?: AbortSignal): AsyncGenerator<StoredLine> {
    let position = from;
    let wake: (() => void) | null = null;
    let dirty = false;
    // A job unknown at the start may still be on its way (a VM that has not spoken yet):
    // it gets the lost-job window to appear, like a job registered with expectJob.
    const appearBy = Date.now() + lostAfterMs;
    let known = false;
    const watcher = () => {
      dirty = true;
      wake?.();
    };
    let set = watchers.get(id);
    if (!set) watchers.set(id, (set = new Set()));
    set.add(watcher);
    const onAbort = () => wake?.();
    signal?.addEventListener("abort", onAbort);
    try {
      for (;;) {
        dirty = false;
        const lines = await logs.read(id, position, 1024);
        for (const line of lines) yield line;
        position += lines.length;
        if (lines.length === 1024) continue;
        const state = await logs.get(id);
        if (state) known = true;
        // Pruned while followed, or never appeared: nothing more will come.
        else if (known || Date.now() >= appearBy) return;
        if (state && state.status !== "open" && position >= state.storedLines) return;
        if (signal?.aborted || closed) return;
        if (dirty) continue;
        // Woken by this process's appends; polled for stores shared with other replicas.
        const pollMs = state ? 1000 : Math.min(1000, Math.max(1, appearBy - Date.now()));
        await new Promise<void>((resolve) => {
          wake = resolve;
          setTimeout(resolve, pollMs).unref?.();
        });
        wake = null;
      }
    } finally {
      set.delete(watcher);
      if (set.size === 0) watchers.delete(id);
      signal?.removeEventListener("abort", onAbort);
    }
  }

  return service;
}

function varintSize(value: number): number {
  if (value < 0) return 10;
  let size = 1;
  while (value >= 0x80) {
    value = Math.floor(value / 128);
    size++;
  }
  return size;
}

function stringField(value: string): number {
  if (value.length === 0) return 0;
  const len = Buffer.byteLength(value, "utf8");
  return 1 + varintSize(len) + len;
}

/** Bytes of an item in protobuf binary form (the message size the limit is about); `lineBytes`: UTF-8 size of a log item's line. */
function encodedSize(item: LogItem, lineBytes: number): number {
  let size = stringField(item.requestId);
  let inner = 0;
  if (item.event.case === "log") {
    inner = (lineBytes === 0 ? 0 : 1 + varintSize(lineBytes) + lineBytes) + (item.event.value.stderr ? 2 : 0);
  } else if (item.event.case === "end") {
    const end = item.event.value;
    inner = (end.exitCode !== 0 ? 1 + varintSize(end.exitCode) : 0) + (end.success ? 2 : 0) + stringField(end.repoUrl) + stringField(end.commitSha);
  } else {
    return size;
  }
  size += 1 + varintSize(inner) + inner;
  return size;
}

/** `Bearer <token>` → token; anything else → null. */
function bearer(value: string | null): string | null {
  if (value === null) return null;
  const match = /^Bearer ([A-Za-z0-9\-._~+/]+=*)$/i.exec(value.trim());
  return match ? match[1]! : null;
}

/** `runner-offset` → offset; absent → 0; malformed → NaN. */
function parseOffset(value: string | null): number {
  if (value === null) return 0;
  if (!/^[0-9]{1,15}$/.test(value.trim())) return Number.NaN;
  return Number(value.trim());
}

function stripUndefined<T extends object>(value: T): Partial<T> {
  return Object.fromEntries(Object.entries(value).filter(([, v]) => v !== undefined)) as Partial<T>;
}
