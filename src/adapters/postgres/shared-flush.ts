/**
 * Flushes shared by concurrent callers: one runs at a time, and every caller that arrives while it runs
 * joins the one that starts when it ends (that one started after the caller arrived, so it covers what
 * the caller needs covered). Concurrent `syncRecords` calls of a process then cost one statement and one
 * WAL flush per round, not one each. Why: docs/decisions/depot-scale-out.md, "Pipelined statements".
 */

/**
 * Wraps `flush` so that callers share its runs (see the file's comment). O(1) per call.
 *
 * @example
 * const sync = sharedFlush(() => pool.query("UPDATE sync_points SET n = n + 1 WHERE slot = 0"));
 * await Promise.all([sync(), sync(), sync()]); // two runs at most
 */
export function sharedFlush(flush: () => Promise<unknown>): () => Promise<void> {
  let running: Promise<void> | null = null;
  /** The run that starts when `running` ends, joined by every caller meanwhile. */
  let queued: Promise<void> | null = null;

  function start(): Promise<void> {
    const run = flush().then(() => undefined);
    running = run;
    const clear = () => {
      if (running === run) running = null;
    };
    run.then(clear, clear);
    return run;
  }

  return () => {
    if (!running) return start();
    if (!queued) {
      const next = running.then(
        () => undefined,
        () => undefined,
      );
      queued = next.then(() => {
        queued = null;
        return start();
      });
    }
    return queued;
  };
}
