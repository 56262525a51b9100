/**
 * A list filled one item at a time and handed on whole as a batch, whose next array starts at the size the last batch
 * reached. An array grown by `push` from empty allocates about three times its final size on the way (V8 grows a
 * backing store by 1.5× + 16 and copies it), which was ~55 bytes a line of the ~300 the server allocated a line
 * (the fast path's queue of decoded items and a call's entries queued for the store).
 * Why: docs/decisions/ingest-limit.md, "batch-list.ts: BatchList".
 */

/** Largest array made ahead for the next batch (a call's back-pressure bound is 8,192 entries). */
const MAX_HINT = 8192;

/**
 * Items of the batch being filled; {@link BatchList.take} hands them on as an array of exactly them. `push` is O(1)
 * amortised, `take` O(1) plus the next array (O(last batch's size), made once instead of grown).
 *
 * @example
 * const ready = new BatchList<CallItem>();
 * ready.push(item);
 * if (ready.length > 0) consume(ready.take());
 */
export class BatchList<T> {
  private items: T[] = [];
  private count = 0;

  /** Items pushed since the last take or clear. */
  get length(): number {
    return this.count;
  }

  push(item: T): void {
    this.items[this.count++] = item;
  }

  /** The items pushed so far, in order, as an array the caller owns; the list starts empty again. */
  take(): T[] {
    const batch = this.items;
    const n = this.count;
    // Made at its final size: holes within [0, n) never remain, so readers see a plain array of n items.
    batch.length = n;
    this.items = n === 0 ? [] : new Array<T>(Math.min(n, MAX_HINT));
    this.count = 0;
    return batch;
  }

  /** Drops the items pushed so far (nothing else holds them). */
  clear(): void {
    this.items = [];
    this.count = 0;
  }
}
