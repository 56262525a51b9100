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
 * amortised, `take` O(1); the first push after it makes the next array (O(last batch's size), made once instead of grown).
 *
 * @example
 * const ready = new BatchList<CallItem>();
 * ready.push(item);
 * if (ready.length > 0) consume(ready.take());
 */
export class BatchList<T> {
  private items: T[] = [];
  private count = 0;
  /** Size of the last batch taken: the next array is made at it on the first push, so an idle list holds none. */
  private hint = 0;

  /** Items pushed since the last take or clear. */
  get length(): number {
    return this.count;
  }

  push(item: T): void {
    if (this.count === 0 && this.hint > 0) this.items = new Array<T>(this.hint);
    this.items[this.count++] = item;
  }

  /** The items pushed so far, in order, as an array the caller owns; the list starts empty again. */
  take(): T[] {
    const batch = this.items;
    const n = this.count;
    // Made at its final size: holes within [0, n) never remain, so readers see a plain array of n items.
    batch.length = n;
    // An idle call keeps no array of the last batch's size (up to 64 KiB) until it is sent more.
    this.items = [];
    this.hint = Math.min(n, MAX_HINT);
    this.count = 0;
    return batch;
  }

  /** Drops the items pushed so far (nothing else holds them). */
  clear(): void {
    this.items = [];
    this.count = 0;
  }
}
