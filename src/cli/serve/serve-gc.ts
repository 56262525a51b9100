/**
 * `serve --gc-interval`: the depot's garbage collection on a timer. Runs never overlap:
 * the next one is scheduled when the previous one has finished, so a run that takes
 * longer than the interval delays the next instead of stacking up behind it.
 */

/** A running schedule: `stop()` cancels the next run and waits for one in progress. */
interface GarbageSchedule {
  stop(): Promise<void>;
}

/**
 * Calls `collect` every `intervalMs` after the previous call settled; the first call one
 * interval after the start. `collect` reports its own outcome (the router logs `garbage
 * collected` or `garbage collection failed`); a failure never stops the schedule.
 *
 * @example
 * const gc = scheduleGarbageCollection(() => depot.collectGarbage(), 3_600_000);
 * // on shutdown, before the store closes:
 * await gc.stop();
 */
export function scheduleGarbageCollection(collect: () => Promise<unknown>, intervalMs: number): GarbageSchedule {
  let timer: NodeJS.Timeout | undefined;
  let running: Promise<void> | null = null;
  let stopped = false;
  const next = () => {
    if (stopped) return;
    timer = setTimeout(() => {
      running = collect()
        .then(
          () => undefined,
          () => undefined,
        )
        .finally(() => {
          running = null;
          next();
        });
    }, intervalMs);
  };
  next();
  return {
    async stop() {
      stopped = true;
      clearTimeout(timer);
      await running;
    },
  };
}
