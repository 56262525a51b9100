/**
 * Group commit for the PostgreSQL log store: calls made while earlier statements are in
 * flight are gathered and answered by one statement. With a thousand jobs streaming, most
 * appends carry a line or two; one statement per append would cost PostgreSQL a commit (and
 * this process a round trip) per line, while one statement per group costs one per group,
 * and a group grows exactly as fast as the database falls behind. A call alone still goes out
 * at once (after the current event-loop turn, so calls made in the same turn share it).
 */

/** Options of {@link createGroupRunner}. */
interface GroupRunnerOptions<I> {
  /** Statements in flight at once; the calls made meanwhile wait for a slot and share it. */
  inFlight: number;
  /** Most calls in one group. */
  maxItems: number;
  /** Most total weight in one group (a group always takes at least one call). Default: no bound. */
  maxWeight?: number;
  /** An item's weight (e.g. its bytes). */
  weight?: (item: I) => number;
}

/**
 * Creates a runner that calls `run(items)` for groups of items and hands each caller its
 * own answer (`run` returns one answer per item, in order). A failed `run` rejects every call
 * of its group. O(1) per call besides `run`.
 *
 * @example
 * const get = createGroupRunner((ids: string[]) => selectMany(ids), { inFlight: 2, maxItems: 500 });
 * const state = await get("7f1c…");
 */
export function createGroupRunner<I, O>(
  run: (items: I[]) => Promise<O[]>,
  options: GroupRunnerOptions<I>,
): (item: I) => Promise<O> {
  interface Waiting {
    item: I;
    resolve: (out: O) => void;
    reject: (error: unknown) => void;
  }
  let queue: Waiting[] = [];
  let running = 0;
  let scheduled = false;

  /** How many queued calls the next group takes. O(group). */
  function groupSize(): number {
    const most = Math.min(queue.length, options.maxItems);
    if (options.maxWeight === undefined || !options.weight) return most;
    let total = 0;
    for (let i = 0; i < most; i++) {
      total += options.weight(queue[i]!.item);
      if (total > options.maxWeight) return Math.max(1, i);
    }
    return most;
  }

  function dispatch(): void {
    scheduled = false;
    while (running < options.inFlight && queue.length > 0) {
      const take = groupSize();
      const group = take === queue.length ? queue : queue.slice(0, take);
      queue = take === queue.length ? [] : queue.slice(take);
      running++;
      run(group.map((w) => w.item))
        .then(
          (outs) => {
            for (let i = 0; i < group.length; i++) group[i]!.resolve(outs[i]!);
          },
          (error: unknown) => {
            for (const w of group) w.reject(error);
          },
        )
        .finally(() => {
          running--;
          dispatch();
        });
    }
  }

  return (item) =>
    new Promise<O>((resolve, reject) => {
      queue.push({ item, resolve, reject });
      if (!scheduled && running < options.inFlight) {
        scheduled = true;
        setImmediate(dispatch);
      }
    });
}
