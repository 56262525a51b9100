/**
 * The depot store a command opens from its flags: the fs store under `<data>/depot` by default, PostgreSQL records
 * with `--postgres`, S3 blobs with `--s3-bucket` (both, composed, when both are given). Shared by `serve` and
 * `mirror`, so a mirror writes where a server of the same flags serves.
 */
import path from "node:path";
import { createFsStore } from "../../adapters/fs/index.js";
import { composeStore } from "../../depot/index.js";
import type { PackageStore } from "../../depot/ports.js";
import { importAdapter } from "../args.js";

/** The flags, as node:util parseArgs options. */
export const packageStoreOptions = {
  postgres: { type: "string" },
  "postgres-schema": { type: "string" },
  "s3-bucket": { type: "string" },
  "s3-endpoint": { type: "string" },
  "s3-region": { type: "string" },
  "s3-no-payload-check": { type: "boolean" },
} as const;

/** The flags' usage lines. */
export const PACKAGE_STORE_USAGE = `  --postgres <url>        keep depot records in PostgreSQL
  --postgres-schema <s>   PostgreSQL schema (default runner_depot)
  --s3-bucket <name>      keep depot blobs in S3 (with --s3-endpoint, --s3-region)
  --s3-endpoint <url>     S3 endpoint (path-style), e.g. http://127.0.0.1:4568
  --s3-region <region>    S3 region (default us-east-1)
  --s3-no-payload-check   the S3 server does not check a request's signed payload hash
                          (s3rver does not; AWS S3, MinIO and radosgw do): a body with a
                          declared digest then goes by multipart upload, checked here`;

/** The PostgreSQL schema the flags name, or undefined for the default. */
export function postgresSchema(values: Record<string, unknown>): string | undefined {
  return typeof values["postgres-schema"] === "string" ? values["postgres-schema"] : undefined;
}

/**
 * Opens the depot store the flags name (the adapters load on demand and are named when missing).
 *
 * @example
 * const store = await openPackageStore({ postgres: "postgres://127.0.0.1/depot" }, ".runner-depot");
 */
export async function openPackageStore(values: Record<string, unknown>, dataDir: string): Promise<PackageStore> {
  const fsStore = createFsStore(path.join(dataDir, "depot"));
  if (typeof values.postgres !== "string" && typeof values["s3-bucket"] !== "string") return fsStore;
  let blobs: PackageStore | Awaited<ReturnType<(typeof import("../../adapters/s3/index.js"))["createS3BlobStore"]>> =
    fsStore;
  if (typeof values["s3-bucket"] === "string") {
    const { createS3BlobStore } = await importAdapter(
      () => import("../../adapters/s3/index.js"),
      "@aws-sdk/client-s3 @aws-sdk/lib-storage @aws-sdk/s3-request-presigner",
    );
    blobs = createS3BlobStore({
      bucket: values["s3-bucket"],
      clientConfig: {
        endpoint: typeof values["s3-endpoint"] === "string" ? values["s3-endpoint"] : undefined,
        region: typeof values["s3-region"] === "string" ? values["s3-region"] : "us-east-1",
        forcePathStyle: true,
      },
      // Off only when asked: a server that checks nothing must not get a declared body in one PutObject.
      serverVerifiesPayload: values["s3-no-payload-check"] !== true,
    });
  }
  let records: PackageStore | ReturnType<(typeof import("../../adapters/postgres/index.js"))["createPostgresRecords"]> =
    fsStore;
  if (typeof values.postgres === "string") {
    const { createPostgresRecords } = await importAdapter(() => import("../../adapters/postgres/index.js"), "pg");
    records = createPostgresRecords({ connectionString: values.postgres, schema: postgresSchema(values) });
  }
  return composeStore({ blobs, records });
}
