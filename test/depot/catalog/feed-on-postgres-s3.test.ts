/**
 * The change feed on PostgreSQL records + S3 blobs (s3rver), joined by composeStore: the
 * sequence positions are decided by PostgreSQL's unique key on the records table.
 */
import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, it } from "vitest";
import { createPostgresRecords } from "../../../src/adapters/postgres/index.js";
import { createS3BlobStore } from "../../../src/adapters/s3/index.js";
import { composeStore } from "../../../src/depot/store/compose.js";
import type { PackageStore } from "../../../src/depot/ports.js";
import { PutObjectCommand } from "@aws-sdk/client-s3";
import { createTestSchema, startS3, type S3Fixture } from "../../fixtures/backends.js";
import { concurrentCommitsLandOnceInOrder, pagedWalkWhileCommitsLand } from "../../fixtures/catalog-feed.js";
import { startDepot, type LiveDepot } from "../../fixtures/depot.js";

describe("change sequence and paged catalog (PostgreSQL records + S3 blobs)", () => {
  let s3: S3Fixture;
  let db: Awaited<ReturnType<typeof createTestSchema>>;
  let store: PackageStore;
  let second: PackageStore;
  let depots: LiveDepot[] = [];
  beforeAll(async () => {
    s3 = await startS3();
    db = await createTestSchema();
    const prefix = `feed-${randomUUID()}/`;
    // s3rver removes a directory when its last object goes, racing uploads that are creating
    // a file in it (ENOENT, thrown outside any request). A resident object keeps tmp/ alive.
    await s3.client.send(new PutObjectCommand({ Bucket: s3.bucket, Key: `${prefix}tmp/.keep`, Body: "" }));
    const open = () =>
      composeStore({
        blobs: createS3BlobStore({ bucket: s3.bucket, prefix, clientConfig: s3.clientConfig }),
        records: createPostgresRecords({ pool: db.pool, schema: db.schema }),
      });
    store = open();
    // Two routers (two store instances) on the same database: positions are decided there.
    second = open();
    depots = [await startDepot(store), await startDepot(second)];
  });
  afterAll(async () => {
    for (const depot of depots) await depot.close();
    await store?.close?.();
    await second?.close?.();
    await db?.drop();
    await s3?.close();
  });

  it("commits of 50 different packages at concurrency 16 (spread over two routers) all land, each exactly once in the feed, in one order", async () => {
    await concurrentCommitsLandOnceInOrder(
      depots.map((d) => d.url),
      "pg",
      50,
      16,
    );
    // 15 s in CI (s3rver and PostgreSQL under load), a quarter of the default 60 s.
  }, 180_000);

  it("a paged walk of the catalog while commits land sees every package that existed at its start exactly once", async () => {
    await pagedWalkWhileCommitsLand(depots[1]!.url, "pg-walk", 12, 10);
  }, 180_000);
});
