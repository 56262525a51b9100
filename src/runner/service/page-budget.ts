/**
 * The byte bound of one `JobLogStore.read` (`LogReadOptions.maxBytes`), shared by every store so they end a page at
 * the same line: a page takes lines while the bytes of those taken stay within the bound, and always its first.
 */
import type { LogReadOptions } from "../ports.js";

/**
 * What a page has taken so far. Stores ask {@link PageBudget.take} with a line's bytes before they build its
 * string, so a page never holds more than `maxBytes` plus one line. O(1) a line.
 *
 * @example
 * const budget = new PageBudget(options?.maxBytes);
 * for (const line of candidates) if (!budget.take(line.bytes)) break;
 */
export class PageBudget {
  private spent = 0;
  private taken = 0;

  constructor(private readonly max: number = Number.POSITIVE_INFINITY) {}

  /** Whether a line of `bytes` joins the page; counted when it does. The first line always does. */
  take(bytes: number): boolean {
    if (this.taken > 0 && this.spent + bytes > this.max) return false;
    this.spent += bytes;
    this.taken++;
    return true;
  }

  /** Whether a line of any size would be refused now (the bound is reached). */
  get full(): boolean {
    return this.taken > 0 && this.spent >= this.max;
  }
}

/**
 * `options.maxBytes` as every store reads it: undefined (no bound) when absent or not a finite number, else a whole
 * number of at least 1, so a bound of 0, a negative one or a fraction means the same in SQL as in memory. O(1).
 */
export function maxBytesOf(options?: LogReadOptions): number | undefined {
  const max = options?.maxBytes;
  if (max === undefined || !Number.isFinite(max)) return undefined;
  return Math.max(1, Math.floor(max));
}

/** The budget of a read called with `options`: unbounded without `maxBytes` ({@link maxBytesOf}). O(1). */
export function pageBudget(options?: LogReadOptions): PageBudget {
  return new PageBudget(maxBytesOf(options));
}
