/**
 * PostgreSQL adapters (need the optional peer dependency `pg`): depot records with
 * compare-and-swap (pair them with S3 blobs through `composeStore`), and a job log store
 * that several orchestrator replicas can share. {@link migrate} creates or upgrades the
 * tables.
 *
 * @example
 * ```ts
 * import pg from "pg";
 * import { createPostgresLogStore, migrate } from "runner-depot/adapters/postgres";
 * import { createRunnerService } from "runner-depot/runner";
 * import { createMemoryQueue } from "runner-depot/adapters/memory";
 *
 * const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL });
 * await migrate(pool);
 * const runner = createRunnerService(createMemoryQueue(), { logs: createPostgresLogStore({ pool }) });
 * ```
 *
 * @module runner-depot/adapters/postgres
 */
// First: throws on an unsupported Node before the rest loads (node-support.ts).
import "../../node-check.js";
export { createPostgresRecords } from "./records.js";
export type { PostgresRecordsOptions } from "./records.js";
export { createPostgresLogStore } from "./log-store.js";
export type { PostgresLogStoreOptions } from "./log-store.js";
export type { PostgresLogExtrasOptions } from "./log-store-notify-archive.js";
export { migrate, POSTGRES_TIMEOUTS } from "./schema.js";
export type { PostgresOptions } from "./schema.js";
