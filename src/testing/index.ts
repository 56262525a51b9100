/**
 * The conformance kit (vitest): the suites every shipped adapter runs, for your own
 * adapters of the three ports — {@link describeQueueAdapter} (job-result queue),
 * {@link describeJobLogStore} (job logs) and {@link describePackageStore} (depot blobs
 * and records) — and small helpers for tests that stream bytes.
 *
 * @example
 * ```ts
 * // my-store.test.ts
 * import { describePackageStore } from "runner-depot/testing";
 * import { createMyStore } from "./my-store.js";
 *
 * describePackageStore("my store", () => createMyStore({ fresh: true }));
 * ```
 *
 * @module runner-depot/testing
 */
// First: throws on an unsupported Node before the rest loads (node-support.ts).
import "../node-check.js";
export { describeQueueAdapter } from "./queue-suite.js";
export type { QueueAdapterSuiteOptions, ConsumedMessage, BackendOutage } from "./queue-suite.js";
export { describeJobLogStore } from "./log-store-suite.js";
export type { JobLogStoreSuiteOptions } from "./log-store-suite.js";
export { describePackageStore } from "./package-store-suite.js";
export type { PackageStoreSuiteOptions } from "./package-store-suite.js";
export {
  sampleJobResult,
  logEntry,
  sha256Digest,
  patternBytes,
  chunked,
  brokenBody,
  collectBytes,
  collectAll,
} from "./helpers.js";
