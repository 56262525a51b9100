/** The in-memory adapters run every conformance suite they can. */
import { createMemoryLogStore, createMemoryQueue } from "../../../src/adapters/memory/index.js";
import type { MemoryQueue } from "../../../src/adapters/memory/index.js";
import { createMemoryStore } from "../../../src/adapters/memory/store.js";
import { describeJobLogStore, describePackageStore, describeQueueAdapter } from "../../../src/testing/index.js";

// The back door drains what the queue accepted since the last read.
const read = new WeakMap<MemoryQueue, number>();

describeQueueAdapter("memory", () => createMemoryQueue(), {
  consume: (q) => {
    const from = read.get(q) ?? 0;
    read.set(q, q.results.length);
    return q.results.slice(from).map((body) => ({ body }));
  },
  outage: {
    break: (q) => {
      q.down = true;
    },
    heal: (q) => {
      q.down = false;
    },
    // The memory queue refuses at once; the runner service does the retrying.
    retries: false,
  },
});

describeJobLogStore("memory", () => createMemoryLogStore());

describePackageStore("memory", () => createMemoryStore());
