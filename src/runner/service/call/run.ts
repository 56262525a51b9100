/**
 * One StreamLogs call's state: its job, position and byte counts, the entries queued for
 * the store and the background flush that stores them in batches, and the waits a stop
 * (newer call, shutdown, idle, client gone) interrupts. Its idle limit is the service's
 * sweep (runner/service/idle-sweep.ts), which reads `waitingSince`.
 */
import type { HandlerContext } from "@connectrpc/connect";
import type { Context, Span } from "@opentelemetry/api";
import type { RunnerDepotError } from "../../../errors.js";
import type { JobState, LogEntry, StoredLine } from "../../ports.js";
import type { EndedReason } from "../contract.js";
import { secondsSince } from "../../../telemetry.js";
import { kCallHeldBack, kMessageBytes } from "../../server/call-context.js";
import type { CallHandle, RunnerCore, Slot } from "../job-table.js";
import { EndedSignal, explainRefusal } from "./ended-signal.js";
import { settlePendingPublish } from "./end-item.js";
import { entriesFor, pushPlain } from "../../protocol/received-line.js";
import { BatchList } from "../../protocol/batch-list.js";

/** Queued entries past which a call waits for the store (back-pressure). */
const BACKPRESSURE_ITEMS = 8192;
const BACKPRESSURE_BYTES = 8 * 1024 * 1024;

/** One StreamLogs call. */
export class CallRun implements CallHandle {
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
  /** True once the job's log is cut (its tail kept): every later line goes to the store's rolling tail. */
  cut = false;
  endSeen = false;
  /** Entries queued for the store, taken whole by each flush. */
  readonly pending = new BatchList<LogEntry>();
  pendingAt = 0;
  pendingBytes = 0;
  /** UTF-8 bytes of the queued lines as received (runner.bytes.ingested once stored). */
  pendingReceivedBytes = 0;
  /** The call's span and the caller's trace context it started under; set by stream-call. */
  span: Span | null = null;
  parentContext: Context | undefined = undefined;
  /** Why the call answered ok = false, once it did. */
  endedReason: EndedReason | null = null;
  /** Request ID of the first item, before the call passed auth (for log lines). */
  claimedId = "";
  /** The job whose token was checked before the first message was decompressed (kFirstItemCheck), if any. */
  checkedId: string | null = null;
  flushing: Promise<void> | null = null;
  flushError: unknown = null;
  /** Set when the call must stop at once (newer call, shutdown, idle). */
  stopError: RunnerDepotError | null = null;
  /** Rejecters of the waits in progress; a stop rejects them all. */
  private readonly interrupters = new Set<(error: unknown) => void>();
  /**
   * When the call started waiting for its next item (0: not waiting); the idle sweep (runner/service/idle-sweep.ts)
   * reads it.
   */
  waitingSince = 0;
  /** The last sweep (Date.now()) that saw this call held back by the server; 0 never (runner/service/idle-sweep.ts). */
  heldAt = 0;

  /** True while the server holds this call back (its reader paused behind the store backlog). O(1). */
  get heldBack(): boolean {
    return this.ctx.values.get(kCallHeldBack)?.() === true;
  }

  constructor(
    private readonly core: RunnerCore,
    ctx: HandlerContext,
  ) {
    this.ctx = ctx;
    this.maxBytes = ctx.values.get(kMessageBytes) ?? core.config.limits.messageBytes;
  }

  stop(error: RunnerDepotError) {
    if (this.stopError) return;
    this.stopError = error;
    for (const interrupt of this.interrupters) interrupt(error);
    this.interrupters.clear();
  }

  /** The context of the call's span (parent of the publish spans), made when asked. */
  get traceContext(): Context | undefined {
    return this.span && this.parentContext
      ? this.core.telemetry.childContext(this.parentContext, this.span)
      : undefined;
  }

  get committed(): number {
    return this.state?.committed ?? 0;
  }

  /** Queues a new entry; flushes in the background, batching whatever piles up meanwhile. */
  // Returns a promise only when the call must wait (back-pressure): most items need no await.
  enqueue(entry: LogEntry): Promise<void> | undefined {
    if (this.pending.length === 0) this.pendingAt = this.nextPos;
    this.pending.push(entry);
    // Counted until its batch is stored or dropped; after a store error nothing is flushed
    // any more, so nothing is counted either.
    if (this.flushError === null) {
      const bytes = entry.bytes + 64;
      this.pendingBytes += bytes;
      this.core.backlog.add(bytes);
    }
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
    while (this.pending.length > 0 && !this.flushError) {
      const batch = this.pending.take();
      const at = this.pendingAt;
      const receivedBytes = this.pendingReceivedBytes;
      const batchBytes = this.pendingBytes;
      this.pendingBytes = 0;
      this.pendingReceivedBytes = 0;
      try {
        const state = await this.core.locked(this.id, () => this.store(at, batch));
        this.state = state;
        this.core.notify(this.id, { state, batch });
        // Once per batch, not per line: the metrics cost nothing per line.
        this.core.telemetry.linesIngested.add(batch.length);
        this.core.telemetry.bytesIngested.add(receivedBytes);
        this.reportStored(batch, state.committed);
      } catch (error) {
        this.flushError = await explainRefusal(this.core.logs, this.id, error);
        // What was queued meanwhile is dropped with the batch: the call ends with the error.
        this.core.backlog.release(this.pendingBytes);
        this.pending.clear();
        this.pendingBytes = 0;
      } finally {
        this.core.backlog.release(batchBytes);
      }
    }
  }

  /** Appends one batch (under the job's lock) unless the job was taken or ended meanwhile. */
  private async store(at: number, batch: LogEntry[]): Promise<JobState> {
    const core = this.core;
    // A newer call or a cancel took the job meanwhile: store nothing more.
    if (this.stopError?.code === "ABORTED") throw this.stopError;
    const reason = core.ending.get(this.id);
    if (reason) throw new EndedSignal(reason);
    const pendingEnd = core.inFlight.get(this.id);
    if (pendingEnd) await settlePendingPublish(core, this, pendingEnd);
    // The job exists in the store once its first item is stored.
    if (this.state === null) this.state = await core.logs.open(this.id);
    const start = performance.now();
    const state = await core.logs.append(this.id, at, entriesFor(core.logs, batch));
    core.telemetry.appendDuration.record(secondsSince(start));
    return state;
  }

  /** Hands the stored lines (markers included) to the onLog hook. O(lines) when there is one. */
  private reportStored(batch: LogEntry[], committed: number): void {
    const onLog = this.core.options.onLog;
    if (!onLog) return;
    const lines: StoredLine[] = [];
    // Plain objects: a received line is a view of the request's buffer, not for the host to keep.
    for (const entry of batch) pushPlain(lines, entry);
    if (lines.length > 0) this.core.safe(() => onLog({ requestId: this.id, lines, committed }));
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

  /** Current state from the store, refreshed under the job's lock (without it when `unlocked`). */
  async refresh(unlocked = false): Promise<void> {
    if (!this.id) return;
    const core = this.core;
    // A job being cancelled or declared lost stores nothing more, and its publish may
    // hold the lock for long: read it without the lock.
    this.state =
      unlocked || core.ending.has(this.id)
        ? await core.logs.get(this.id)
        : await core.locked(this.id, () => core.logs.get(this.id));
  }
}
