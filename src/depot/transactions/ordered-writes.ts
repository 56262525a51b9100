/**
 * The writes of one request, flushed once before it answers, on a store that can
 * (RecordStore.syncRecords: the fs store); on any other store each write is durable when it
 * resolves, as before.
 * Why: docs/decisions/depot-publish-durability.md, "ordered-writes.ts: why one flush per request is safe".
 */
import type { PackageStore, PutBlobOptions, WriteCondition } from "../ports.js";

/**
 * Conditions for the durable writes of one request, and the flush before its answer.
 *
 * @example
 * const writes = new OrderedWrites(store);
 * await store.putRecord(key, value, writes.record({ ifRevision: null }));
 * await writes.durable(); // before answering
 */
export class OrderedWrites {
  /** Whether the store flushes on request (syncRecords), so writes may wait for it. */
  private readonly defers: boolean;
  /** Deferred writes issued since the last flush. */
  private deferred = false;

  constructor(private readonly store: PackageStore) {
    this.defers = typeof store.syncRecords === "function";
  }

  /**
   * The condition for a durable record write of this request: `deferSync` on a store that
   * syncs on request (lazy writes stay as they are: a crash may lose them anyway). The
   * write must have resolved before {@link durable} is called.
   */
  record<C extends WriteCondition>(cond: C): C {
    if (!this.defers || cond.lazy === true) return cond;
    this.deferred = true;
    return { ...cond, deferSync: true };
  }

  /**
   * The options for a blob put of this request (see PutBlobOptions.deferSync: files stay durable when they resolve).
   */
  blob(options: PutBlobOptions = {}): PutBlobOptions {
    if (!this.defers) return options;
    this.deferred = true;
    return { ...options, deferSync: true };
  }

  /**
   * Resolves once every write made through this (and every other one visible now) is on
   * stable storage; rejects when the store cannot promise it (a failed flush). One flush
   * when writes were deferred since the last call, none otherwise.
   */
  async durable(): Promise<void> {
    if (!this.deferred) return;
    this.deferred = false;
    await this.store.syncRecords!();
  }
}

/** The condition for a durable write: through `writes` when the caller has them, as given otherwise. */
export function durableCondition<C extends WriteCondition>(writes: OrderedWrites | undefined, cond: C): C {
  return writes ? writes.record(cond) : cond;
}
