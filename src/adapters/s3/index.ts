/**
 * Depot blobs on S3 or an S3-compatible store (needs the optional peer dependencies
 * `@aws-sdk/client-s3`, `@aws-sdk/lib-storage` and `@aws-sdk/s3-request-presigner`):
 * content-addressed objects, multipart uploads, ranged reads, and presigned URLs so
 * downloads go straight to the object store. Pair it with PostgreSQL records through
 * `composeStore` from `runner-depot/depot`.
 *
 * @example
 * ```ts
 * import { createS3BlobStore } from "runner-depot/adapters/s3";
 * import { createPostgresRecords } from "runner-depot/adapters/postgres";
 * import { composeStore, createPackageRouter } from "runner-depot/depot";
 *
 * const store = composeStore({
 *   blobs: createS3BlobStore({ bucket: "ci-depot", clientConfig: { region: "eu-west-1" } }),
 *   records: createPostgresRecords({ connectionString: process.env.DATABASE_URL! }),
 * });
 * const depot = createPackageRouter(store);
 * ```
 *
 * @module runner-depot/adapters/s3
 */
// First: throws on an unsupported Node before the rest loads (node-support.ts).
import "../../node-check.js";
export { createS3BlobStore } from "./blob-store.js";
export type { S3BlobStoreOptions } from "./blob-store.js";
export { createS3LogArchive } from "./log-archive.js";
export type { S3LogArchiveOptions } from "./log-archive.js";
