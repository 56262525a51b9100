/**
 * The server-wide budget for log entries queued for the store and not yet stored (issue 13, fleet memory).
 * Each call queues what it received while its store append is in flight; a store that lags (PostgreSQL under
 * the heavy fleet mix) let every call hold its own backlog, up to the per-call cap (8,192 items / 8 MiB,
 * runner/service/call/run.ts), so memory grew with the number of busy calls.
 * Why: docs/decisions/runner-store-backlog.md, "store-backlog.ts: the server-wide store backlog budget".
 */

/** What waits for the backlog to drain (a paused request reader). */
export interface BacklogWaiter {
  /** The backlog fell below the resume mark; called once per registration. */
  drained(): void;
}

/**
 * Queued-bytes accounting shared by every call of a service. add/release O(1); the
 * release that drains it wakes every waiter, O(waiters).
 *
 * @example
 * const backlog = new StoreBacklog(32 * 1024 * 1024);
 * backlog.add(entryBytes);          // queued for the store
 * if (backlog.over) backlog.wait(reader);
 * backlog.release(entryBytes);      // stored (or dropped)
 */
export class StoreBacklog {
  /**
   * Bytes held now: entries queued for the store (each its bytes + 64) and complete
   * messages received and not yet taken by the service (their wire bytes).
   */
  held = 0;
  /** Most bytes held at once (for tests and metrics). */
  peak = 0;
  private waiters = new Set<BacklogWaiter>();
  private readonly resumeAt: number;

  constructor(readonly limit: number) {
    // Hysteresis: resuming at the limit itself would wake every paused call for each stored batch.
    this.resumeAt = Math.floor(limit * 0.75);
  }

  /** True while over the budget: authenticated calls must not be read further. */
  get over(): boolean {
    return this.held > this.limit;
  }

  /** Counts `bytes` more. */
  add(bytes: number): void {
    this.held += bytes;
    if (this.held > this.peak) this.peak = this.held;
  }

  /** Counts `bytes` fewer; wakes every waiter once at or below the resume mark. */
  release(bytes: number): void {
    this.held = Math.max(0, this.held - bytes);
    if (this.waiters.size > 0 && this.held <= this.resumeAt) {
      const waiters = this.waiters;
      this.waiters = new Set();
      for (const waiter of waiters) waiter.drained();
    }
  }

  /** Calls `waiter.drained()` once the backlog is below the resume mark (at once if it is already). */
  wait(waiter: BacklogWaiter): void {
    if (this.held <= this.resumeAt) waiter.drained();
    else this.waiters.add(waiter);
  }

  /** Forgets a waiter (its call ended). */
  forget(waiter: BacklogWaiter): void {
    this.waiters.delete(waiter);
  }

  /** Waiters registered now. */
  get waiting(): number {
    return this.waiters.size;
  }
}

/** Where a service keeps its backlog for the transport (runner/server/handler.ts) to find. */
export const kStoreBacklog: unique symbol = Symbol.for("runner-depot.storeBacklog");

/** The backlog of a service made by createRunnerService, or undefined for any other implementation. O(1). */
export function backlogOf(service: object): StoreBacklog | undefined {
  return (service as { [kStoreBacklog]?: StoreBacklog })[kStoreBacklog];
}
