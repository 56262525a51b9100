/**
 * The depot-wide count of open transactions behind the `depot.transactions.open` gauge:
 * a cached count, so a scrape costs O(1) and never a walk of the store.
 * Why: docs/decisions/depot-server.md, "open-count.ts: how the open count is read".
 */

/** Default age past which a scrape refreshes the count from the store: 30 s. */
const OPEN_COUNT_MAX_AGE_MS = 30_000;

/** How long a scrape waits for a refresh before it answers the last count (or none). */
const REFRESH_WAIT_MS = 2_000;

/**
 * A count read from the store now and then, moved by local changes in between.
 *
 * @example
 * const open = new CachedOpenCount(() => transactions.countOpen());
 * open.add(1); // this process opened one
 * const value = await open.read(); // null until the store was read once
 */
export class CachedOpenCount {
  /** The store's count at the last refresh; null before the first. */
  private base: number | null = null;
  /** Local changes since the last refresh began. */
  private delta = 0;
  private readAt = -Infinity;
  private refreshing: Promise<void> | null = null;

  constructor(
    private readonly readStore: () => Promise<number>,
    private readonly maxAgeMs = OPEN_COUNT_MAX_AGE_MS,
    private readonly clock: () => number = () => performance.now(),
  ) {}

  /** A change this process made (+1 opened, -n finished). */
  add(delta: number): void {
    this.delta += delta;
  }

  /** The count for a scrape: refreshed first when stale (waiting at most 2 s); null while unknown. */
  async read(): Promise<number | null> {
    if (this.clock() - this.readAt >= this.maxAgeMs) {
      this.refreshing ??= this.refresh().finally(() => {
        this.refreshing = null;
      });
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([
        this.refreshing,
        new Promise<void>((resolve) => (timer = setTimeout(resolve, REFRESH_WAIT_MS))),
      ]);
      clearTimeout(timer);
    }
    return this.base === null ? null : Math.max(0, this.base + this.delta);
  }

  private async refresh(): Promise<void> {
    // Changes made while the store is read may or may not be in what it answers: keep
    // those that came after the read began (a change seen twice lasts until the next refresh).
    const before = this.delta;
    try {
      const count = await this.readStore();
      this.base = count;
      this.delta -= before;
      this.readAt = this.clock();
    } catch {
      // The store is unreachable: keep the last count (readiness reports the store).
    }
  }
}
