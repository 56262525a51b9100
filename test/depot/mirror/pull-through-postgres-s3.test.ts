/**
 * Pull-through on PostgreSQL records + S3 blobs (s3rver) at both ends: the upstream's archives
 * answer by 302 to signed S3 URLs, so the ranges a pull reads come from the object store. A miss is
 * pulled and held; with the upstream closed, the held version is still served; a version published
 * upstream after a remembered miss is found once the miss TTL has passed.
 */
import { createHash, randomUUID } from "node:crypto";
import { PutObjectCommand } from "@aws-sdk/client-s3";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createPostgresRecords } from "../../../src/adapters/postgres/index.js";
import { createS3BlobStore } from "../../../src/adapters/s3/index.js";
import type { PackageStore } from "../../../src/depot/ports.js";
import { composeStore } from "../../../src/depot/store/compose.js";
import { createTestSchema, startS3, type S3Fixture } from "../../fixtures/backends.js";
import { publish, startDepot, type LiveDepot } from "../../fixtures/depot.js";

const sha = (bytes: ArrayBuffer) => createHash("sha256").update(Buffer.from(bytes)).digest("hex");

describe("pull-through (PostgreSQL records + S3 blobs at both ends)", () => {
  let s3: S3Fixture;
  let dbs: Array<Awaited<ReturnType<typeof createTestSchema>>> = [];
  const stores: PackageStore[] = [];
  const depots: LiveDepot[] = [];
  beforeAll(async () => {
    s3 = await startS3();
    dbs = [await createTestSchema(), await createTestSchema()];
  });
  afterAll(async () => {
    for (const depot of depots) await depot.close().catch(() => undefined);
    for (const store of stores) await store.close?.();
    for (const db of dbs) await db.drop();
    await s3?.close();
  });

  async function openStore(db: Awaited<ReturnType<typeof createTestSchema>>): Promise<PackageStore> {
    const prefix = `pull-${randomUUID()}/`;
    // A resident object keeps s3rver's tmp/ directory alive (see feed-on-postgres-s3.test.ts).
    await s3.client.send(new PutObjectCommand({ Bucket: s3.bucket, Key: `${prefix}tmp/.keep`, Body: "" }));
    const store = composeStore({
      blobs: createS3BlobStore({ bucket: s3.bucket, prefix, clientConfig: s3.clientConfig }),
      records: createPostgresRecords({ pool: db.pool, schema: db.schema }),
    });
    stores.push(store);
    return store;
  }

  it("pulls a miss through signed URLs, holds it while the upstream is down, and has no stuck 404", async () => {
    const up = await startDepot(await openStore(dbs[0]!));
    depots.push(up);
    const body = "s3 pulled ".repeat(3000);
    expect((await publish(up.url, "tool@1.0.0", [{ type: "file", path: "bin", body }])).status).toBe(201);
    expect((await fetch(`${up.url}/data/tool@1.0.0`, { redirect: "manual" })).status).toBe(302);
    const whole = sha(await (await fetch(`${up.url}/data/tool@1.0.0`)).arrayBuffer());

    let clock = Date.parse("2026-11-29T10:00:00Z");
    const local = await startDepot(await openStore(dbs[1]!), {
      upstream: { url: up.url, allowAnonymous: true, missTtlMs: 30_000 },
      now: () => new Date(clock),
    });
    depots.push(local);
    const first = await fetch(`${local.url}/data/tool@1.0.0`);
    expect(first.status).toBe(200);
    expect(sha(await first.arrayBuffer())).toBe(whole);

    expect((await fetch(`${local.url}/data/late@1.0.0`)).status).toBe(404);
    expect((await publish(up.url, "late@1.0.0", [{ type: "file", path: "f", body: "late" }])).status).toBe(201);
    expect((await fetch(`${local.url}/data/late@1.0.0`)).status).toBe(404);
    clock += 30_001;
    expect((await fetch(`${local.url}/data/late@1.0.0`)).status).toBe(200);

    await up.close();
    const held = await fetch(`${local.url}/data/tool@1.0.0`);
    expect(held.status).toBe(200);
    expect(sha(await held.arrayBuffer())).toBe(whole);
    const listed = (await (await fetch(`${local.url}/version/tool`)).json()) as {
      versions: Array<{ version: string; pulled?: boolean }>;
    };
    expect(listed.versions).toEqual([expect.objectContaining({ version: "1.0.0", pulled: true })]);
  });
});
