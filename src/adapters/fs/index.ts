/**
 * Filesystem adapters, the embedded defaults of `runner-depot serve`: a job log store
 * (append-only log per job, fsync per append) and a package store (content-addressed
 * blobs and records with compare-and-swap). One process owns a directory; several
 * replicas share PostgreSQL and S3 instead. The log store keeps the log files of the
 * jobs it last appended to open, at most 64 per directory (count them against the
 * process's file-descriptor limit with the server's connections).
 *
 * @example
 * ```ts
 * import { createFsLogStore, createFsStore } from "runner-depot/adapters/fs";
 * import { createRunnerService } from "runner-depot/runner";
 * import { createPackageRouter } from "runner-depot/depot";
 * import { createMemoryQueue } from "runner-depot/adapters/memory";
 *
 * const runner = createRunnerService(createMemoryQueue(), { logs: createFsLogStore("/var/lib/ci/logs") });
 * const depot = createPackageRouter(createFsStore("/var/lib/ci/depot"));
 * ```
 *
 * @module runner-depot/adapters/fs
 */
// First: throws on an unsupported Node before the rest loads (node-support.ts).
import "../../node-check.js";
export { createFsLogStore } from "./log-store.js";
export type { FsLogStoreOptions } from "./log-store.js";
export { createFsLogArchive } from "./log-archive.js";
export type { FsLogArchiveOptions } from "./log-archive.js";
export { createFsStore } from "./store.js";
export type { FsStoreOptions } from "./store.js";
