/**
 * In-memory adapters: a job-result queue, a job log store and a package store. Nothing
 * survives the process; they are meant for unit tests, examples and embedding where
 * persistence is someone else's concern.
 *
 * @example
 * ```ts
 * import { createMemoryQueue, createMemoryLogStore } from "runner-depot/adapters/memory";
 * import { createRunnerService } from "runner-depot/runner";
 *
 * const queue = createMemoryQueue();
 * const runner = createRunnerService(queue, { logs: createMemoryLogStore() });
 * // … after a job ended:
 * const result = await queue.next(); // { requestId, outcome: "finished", exitCode, … }
 * ```
 *
 * @module runner-depot/adapters/memory
 */
// First: throws on an unsupported Node before the rest loads (node-support.ts).
import "../../node-check.js";
export { createMemoryQueue } from "./queue.js";
export type { MemoryQueue } from "./queue.js";
export { createMemoryLogStore, type MemoryLogStoreOptions } from "./log-store.js";
export { createMemoryStore } from "./store.js";
export type { MemoryStoreOptions } from "./store.js";
