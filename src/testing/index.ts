/** runner-depot/testing: conformance suites (vitest) every adapter runs, and test helpers. */
export { describeQueueAdapter } from "./queue-suite.js";
export type { QueueAdapterSuiteOptions, ConsumedMessage, BackendOutage } from "./queue-suite.js";
export { describeJobLogStore } from "./log-store-suite.js";
export type { JobLogStoreSuiteOptions } from "./log-store-suite.js";
export { describePackageStore } from "./package-store-suite.js";
export type { PackageStoreSuiteOptions } from "./package-store-suite.js";
export { sampleJobResult, logEntry, sha256Digest, patternBytes, chunked, brokenBody, collectBytes, collectAll } from "./helpers.js";
