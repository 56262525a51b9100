/** runner-depot/adapters/s3: depot blobs on S3 (@aws-sdk/client-s3). */
export { createS3BlobStore } from "./blob-store.js";
export type { S3BlobStoreOptions } from "./blob-store.js";
