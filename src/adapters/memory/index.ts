/** runner-depot/adapters/memory: in-memory adapters for unit tests and embedding. */
export { createMemoryQueue } from "./queue.js";
export type { MemoryQueue } from "./queue.js";
export { createMemoryLogStore } from "./log-store.js";
export { createMemoryStore } from "./store.js";
export type { MemoryStoreOptions } from "./store.js";
