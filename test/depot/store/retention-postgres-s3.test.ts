/**
 * Retention on PostgreSQL records + S3 blobs (s3rver in its own process) at both ends: the same scenario as the fs
 * test, where the store keeps each version's archive blob (signed-URL redirects), so the bytes a removal frees
 * include it.
 */
import { randomUUID } from "node:crypto";
import { PutObjectCommand } from "@aws-sdk/client-s3";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createPostgresRecords } from "../../../src/adapters/postgres/index.js";
import { createS3BlobStore } from "../../../src/adapters/s3/index.js";
import type { PackageStore } from "../../../src/depot/ports.js";
import { composeStore } from "../../../src/depot/store/compose.js";
import { createTestSchema, startS3, type S3Fixture } from "../../fixtures/backends.js";
import type { LiveDepot } from "../../fixtures/depot.js";
import { retentionScenario } from "../../fixtures/retention-scenario.js";

describe("retention (PostgreSQL records + S3 blobs at both ends)", () => {
  let s3: S3Fixture;
  let dbs: Array<Awaited<ReturnType<typeof createTestSchema>>> = [];
  const stores: PackageStore[] = [];
  const depots: LiveDepot[] = [];
  beforeAll(async () => {
    s3 = await startS3();
    dbs = [await createTestSchema(), await createTestSchema()];
  });
  afterAll(async () => {
    for (const depot of depots) await depot.close();
    for (const store of stores) await store.close?.();
    for (const db of dbs) await db.drop();
    await s3?.close();
  });

  async function openStore(db: Awaited<ReturnType<typeof createTestSchema>>): Promise<PackageStore> {
    const prefix = `retention-${randomUUID()}/`;
    // A resident object keeps s3rver's tmp/ directory alive (see feed-on-postgres-s3.test.ts).
    await s3.client.send(new PutObjectCommand({ Bucket: s3.bucket, Key: `${prefix}tmp/.keep`, Body: "" }));
    const store = composeStore({
      blobs: createS3BlobStore({ bucket: s3.bucket, prefix, clientConfig: s3.clientConfig }),
      records: createPostgresRecords({ pool: db.pool, schema: db.schema }),
    });
    stores.push(store);
    return store;
  }

  it("lists, removes, reclaims exactly (archive blobs included), and the mirror converges", async () => {
    const { dry, real, reclaimed } = await retentionScenario(await openStore(dbs[0]!), await openStore(dbs[1]!), (d) =>
      depots.push(d),
    );
    expect(dry.removed.map((o) => `${o.name}@${o.version}`)).toEqual([
      "lib@1.0.0",
      "lib@1.2.0",
      "lib@3.0.0-beta.1",
      "tool@1.0.0",
    ]);
    expect(real.removed).toEqual(dry.removed);
    expect(reclaimed).toBe(dry.bytes);
    // Each removed version's archive blob (over 3,000 bytes of its own file) is part of it.
    expect(dry.bytes).toBeGreaterThan(2 * 4 * 3000);
  });
});
