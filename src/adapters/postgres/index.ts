/** runner-depot/adapters/postgres: depot records and runner job logs on PostgreSQL (pg). */
export { createPostgresRecords } from "./records.js";
export type { PostgresRecordsOptions } from "./records.js";
export { createPostgresLogStore } from "./log-store.js";
export type { PostgresLogStoreOptions } from "./log-store.js";
export { migrate } from "./schema.js";
export type { PostgresOptions } from "./schema.js";
