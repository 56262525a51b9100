/**
 * The runner service's shared state: per-job slots and locks, the jobs being ended by
 * the host, the publishes in flight, followers to wake, and background work. Every
 * concern of the service (calls, publishing, follow, the sweep) works on one RunnerCore.
 */
import { JobMaskers } from "./job-maskers.js";
import { RunnerDepotError } from "../../errors.js";
import type { JobLogStore, JobResult, JobResultQueue, JobState, LogEntry } from "../ports.js";
import { LogFanout } from "./fanout.js";
import type { RunnerServiceOptions } from "./contract.js";
import type { RunnerConfig } from "./config.js";
import type { Context } from "@opentelemetry/api";
import { RunnerTelemetry } from "./telemetry.js";
import { IdleSweep, type IdleCall } from "./idle-sweep.js";
import { StoreBacklog } from "./store-backlog.js";

/** A job's slot: its active call and the chain that serialises its store operations. */
export interface Slot {
  active: { stop(error: RunnerDepotError): void } | null;
  chain: Promise<unknown>;
  refs: number;
}

/**
 * One publish of a job's result. While it is in flight it is the job's only one: a
 * replayed end, a cancel or the lost sweep wait for it instead of publishing again.
 */
export interface PublishAttempt {
  readonly result: JobResult;
  /** Item position of the runner's end (finished results); undefined for cancelled and lost. */
  readonly at: number | undefined;
  /** True once the queue accepted; false when it refused or the attempt was given up on (never rejects). */
  settled: Promise<boolean>;
  /** Why the attempt failed. */
  error: unknown;
  /** True when the attempt was given up on after `attemptTimeoutMs` (the queue had not answered). */
  timedOut: boolean;
  /** The store's answer once the accepted result is recorded. */
  recorded: Promise<{ state: JobState; first: boolean }> | null;
}

/** What publishing and ending need of a call (CallRun implements it). */
export interface CallHandle {
  readonly id: string;
  state: JobState | null;
  readonly stopError: RunnerDepotError | null;
  /** The trace context of the call's span (parent of its publish spans). */
  readonly traceContext: Context | undefined;
  /** Waits for `p` unless the call is stopped first. */
  guard<T>(p: Promise<T>): Promise<T>;
}

/** The shared state and the primitives every concern of the service uses. */
export interface RunnerCore {
  readonly queue: JobResultQueue;
  readonly logs: JobLogStore;
  readonly options: RunnerServiceOptions;
  readonly config: RunnerConfig;
  /** Logger, metrics and spans. */
  readonly telemetry: RunnerTelemetry;
  readonly slots: Map<string, Slot>;
  /** Jobs the host cancelled or the sweep declared lost, until the store records it. */
  readonly ending: Map<string, "cancelled" | "lost">;
  /** Followers' shared tails (runner/service/fanout.ts). */
  readonly fanout: LogFanout;
  /**
   * Each job's secrets (declared with `expectJob`, or registered by `::add-mask::` lines), in this process only,
   * never in the store; dropped when the job's result is recorded.
   */
  readonly maskers: JobMaskers;
  /** Work that outlives the call or host action that started it → the job it is about. */
  readonly background: Map<Promise<unknown>, string>;
  /** The publish of each job's result in flight: at most one per job (see PublishAttempt). */
  readonly inFlight: Map<string, PublishAttempt>;
  /**
   * A job's first publish that failed (refused, or given up on after `attemptTimeoutMs`): it may
   * still reach the queue (a refusal does not prove nothing was sent: RabbitMQ's publish timeout
   * leaves the message on its channel), so from then on the job's result is that one: a cancel,
   * the lost sweep or a replayed end publishes that same result, never another. Cleared once a
   * result of the job is recorded. At most one per open job.
   */
  readonly maybePublished: Map<string, PublishAttempt>;
  /** Calls in progress. */
  readonly calls: Set<IdleCall>;
  /** The idle limit of the calls in progress, on one timer (runner/service/idle-sweep.ts). */
  readonly idle: IdleSweep;
  /** Entries queued for the store across all calls, within `limits.queuedBytes` (runner/service/store-backlog.ts). */
  readonly backlog: StoreBacklog;
  /** Set by close(): no new call, no new publish retry. */
  closed: boolean;
  /** Aborted by close(). */
  readonly closeController: AbortController;
  /** Hands a failure nobody else sees to onError (a broken hook never breaks the service). */
  report(error: unknown): void;
  /** Runs a host hook; what it throws goes to report. */
  safe(fn: () => void): void;
  slotOf(id: string): Slot;
  release(id: string, slot: Slot): void;
  /** Runs `fn` after every earlier store operation of the job (one writer per job). */
  locked<T>(id: string, fn: () => Promise<T>): Promise<T>;
  /**
   * Wakes the job's followers: after an append with the store's state and the batch stored
   * (its lines reach this process's followers without a read), else after any other change.
   */
  notify(id: string, stored?: { state: JobState; batch: readonly LogEntry[] }): void;
  /** Keeps background work for close() to wait for; its failure goes to report. */
  track(id: string, p: Promise<unknown>): void;
}

/** A RunnerDepotError with a code and a message. */
export function uErr(code: ConstructorParameters<typeof RunnerDepotError>[0], message: string): RunnerDepotError {
  return new RunnerDepotError(code, message);
}

/** Creates the service's shared state. */
export function createRunnerCore(
  queue: JobResultQueue,
  logs: JobLogStore,
  options: RunnerServiceOptions,
  config: RunnerConfig,
): RunnerCore {
  const calls = new Set<IdleCall>();
  const backlog = new StoreBacklog(config.limits.queuedBytes);
  const core: RunnerCore = {
    queue,
    logs,
    options,
    config,
    telemetry: new RunnerTelemetry(options),
    slots: new Map(),
    ending: new Map(),
    fanout: new LogFanout(logs, options.follow ?? {}, (error) => core.report(error)),
    maskers: new JobMaskers(config.limits.addMaskFormBytes),
    background: new Map(),
    inFlight: new Map(),
    maybePublished: new Map(),
    calls,
    idle: new IdleSweep(calls, config.limits.idleMs),
    backlog,
    closed: false,
    closeController: new AbortController(),
    report(error) {
      try {
        options.onError?.(error);
      } catch {
        // A broken error hook must not break the service.
      }
    },
    safe(fn) {
      try {
        fn();
      } catch (error) {
        core.report(error);
      }
    },
    slotOf(id) {
      let slot = core.slots.get(id);
      if (!slot) {
        slot = { active: null, chain: Promise.resolve(), refs: 0 };
        core.slots.set(id, slot);
      }
      return slot;
    },
    release(id, slot) {
      if (--slot.refs === 0 && slot.active === null && core.slots.get(id) === slot) core.slots.delete(id);
    },
    locked(id, fn) {
      const slot = core.slotOf(id);
      slot.refs++;
      const run = slot.chain.then(fn);
      slot.chain = run.catch(() => undefined);
      return run.finally(() => core.release(id, slot));
    },
    notify(id, stored) {
      if (stored) core.fanout.stored(id, stored.state, stored.batch);
      else core.fanout.changed(id);
    },
    track(id, p) {
      core.background.set(p, id);
      p.catch(core.report).finally(() => core.background.delete(p));
    },
  };
  return core;
}
