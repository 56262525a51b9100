/** In-memory JobResultQueue for tests and embedding: keeps results, can be made to fail. */
import { RunnerDepotError } from "../../errors.js";
import type { JobResult, JobResultQueue } from "../../runner/ports.js";

/** A JobResultQueue that keeps every accepted result in memory. */
export interface MemoryQueue extends JobResultQueue {
  /** Every accepted result, in publish order. */
  readonly results: JobResult[];
  /** The next result not yet returned by an earlier `next()`, waiting for it if needed. */
  next(): Promise<JobResult>;
  /** While true, every publish is refused (the queue is "down"). */
  down: boolean;
  /** Refuses the next `count` publishes, then accepts again. */
  failNext(count?: number): void;
  /** Publish attempts, accepted or refused. */
  readonly attempts: number;
}

/**
 * Creates an in-memory job-result queue.
 *
 * @example
 * const queue = createMemoryQueue();
 * const runner = createRunnerService(queue);
 * const result = await queue.next();
 */
export function createMemoryQueue(): MemoryQueue {
  const results: JobResult[] = [];
  const waiters: Array<(result: JobResult) => void> = [];
  let cursor = 0;
  let failures = 0;
  let attempts = 0;
  let closed = false;

  const queue: MemoryQueue = {
    results,
    down: false,
    get attempts() {
      return attempts;
    },
    async publishJobResult(result) {
      attempts++;
      if (closed) throw new RunnerDepotError("UNAVAILABLE", "queue is closed");
      if (queue.down) throw new RunnerDepotError("UNAVAILABLE", "queue is down");
      if (failures > 0) {
        failures--;
        throw new RunnerDepotError("UNAVAILABLE", "queue refused the publish");
      }
      results.push(structuredClone(result));
      const waiter = waiters.shift();
      if (waiter) waiter(results[cursor++]!);
    },
    next() {
      if (cursor < results.length) return Promise.resolve(results[cursor++]!);
      return new Promise((resolve) => waiters.push(resolve));
    },
    failNext(count = 1) {
      failures += count;
    },
    async close() {
      closed = true;
    },
  };
  return queue;
}
