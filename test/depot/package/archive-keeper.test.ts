/**
 * The archive copy a store serving by redirect (S3) gets after the commit, not in it
 * (depot/package/archive-keeper.ts): over real HTTP, S3 (s3rver in its own process) and
 * PostgreSQL records, with a second router on the same bucket and schema standing for a
 * replica whose process never saw the commit (or one that died before its copy landed).
 */
import { randomUUID } from "node:crypto";
import { ListObjectsV2Command } from "@aws-sdk/client-s3";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createPostgresRecords } from "../../../src/adapters/postgres/index.js";
import { createS3BlobStore } from "../../../src/adapters/s3/index.js";
import { composeStore } from "../../../src/depot/store/compose.js";
import type { PackageStore } from "../../../src/depot/ports.js";
import { patternBytes } from "../../../src/testing/index.js";
import { createTestSchema, needs, startS3 } from "../../fixtures/backends.js";
import type { S3Fixture } from "../../fixtures/backends.js";
import { publish, startDepot, storeDigest } from "../../fixtures/depot.js";

let s3: S3Fixture;
let db: Awaited<ReturnType<typeof createTestSchema>>;
const haveDatabase = needs("postgres");

beforeAll(async () => {
  if (!haveDatabase) return;
  s3 = await startS3();
  db = await createTestSchema();
});
afterAll(async () => {
  await db?.drop();
  await s3?.close();
});

function composed(prefix: string): PackageStore {
  return composeStore({
    blobs: createS3BlobStore({
      bucket: s3.bucket,
      prefix,
      clientConfig: s3.clientConfig,
      partSizeBytes: 5 * 1024 * 1024,
      // s3rver checks no payload hash (docs/decisions/s3-servers.md).
      serverVerifiesPayload: false,
    }),
    records: createPostgresRecords({ pool: db.pool, schema: db.schema }),
  });
}

describe("archives on S3 are stored after the commit", () => {
  it("a replica that finds no archive serves it from the items, stores it, then redirects to it", async () => {
    const prefix = `keep-${randomUUID()}/`;
    const first = composed(prefix);
    const depot = await startDepot(first);
    const big = patternBytes(7 * 1024 * 1024 + 3, 12);
    const commit = await publish(depot.url, "kept@1.0.0", [{ type: "file", path: "data.bin", body: big }]);
    expect(commit.status).toBe(201);
    const { digest } = (await commit.json()) as { digest: string };

    // The commit's own process redirects once its copy landed (it waits for a copy in flight).
    const redirect = await fetch(`${depot.url}/data/kept@1.0.0`, { redirect: "manual" });
    expect(redirect.status).toBe(302);
    expect(storeDigest(new Uint8Array(await (await fetch(redirect.headers.get("location")!)).arrayBuffer()))).toBe(
      digest,
    );
    // Straight to its content address: nothing under tmp/ (no temporary key, no copy).
    const listed = await s3.client.send(new ListObjectsV2Command({ Bucket: s3.bucket, Prefix: prefix }));
    expect((listed.Contents ?? []).map((o) => o.Key).filter((k) => !k!.startsWith(`${prefix}sha256/`))).toEqual([]);
    await depot.close();

    // The archive lost (as if its process died before the copy landed): another replica.
    await first.deleteBlob(digest);
    await first.close?.();
    const second = composed(prefix);
    const replica = await startDepot(second);
    try {
      const served = await fetch(`${replica.url}/data/kept@1.0.0`, { redirect: "manual" });
      expect(served.status).toBe(200);
      expect(storeDigest(new Uint8Array(await served.arrayBuffer()))).toBe(digest);
      // That download asked for the copy; the next one waits for it and redirects.
      const again = await fetch(`${replica.url}/data/kept@1.0.0`, { redirect: "manual" });
      expect(again.status).toBe(302);
      expect(await second.statBlob(digest)).not.toBeNull();
    } finally {
      await replica.close();
      await second.close?.();
    }
  });
});
