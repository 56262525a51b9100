/**
 * The mirror on PostgreSQL records + S3 blobs (s3rver) at both ends: the upstream's archives answer
 * by 302 to signed S3 URLs, so every range the mirror reads is served by the object store. The
 * upstream's server is closed in the middle of a mirror and served again on the same port.
 */
import { randomUUID } from "node:crypto";
import { PutObjectCommand } from "@aws-sdk/client-s3";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createPostgresRecords } from "../../../src/adapters/postgres/index.js";
import { createS3BlobStore } from "../../../src/adapters/s3/index.js";
import { mirrorDepot, mirrorKey } from "../../../src/depot/mirror/mirror.js";
import type { PackageStore } from "../../../src/depot/ports.js";
import { createPackageRouter } from "../../../src/depot/server/router.js";
import { servePackageRouter, type PackageServer } from "../../../src/depot/server/serve.js";
import { composeStore } from "../../../src/depot/store/compose.js";
import { isRunnerDepotError } from "../../../src/errors.js";
import { createTestSchema, startS3, type S3Fixture } from "../../fixtures/backends.js";
import { publish, startDepot } from "../../fixtures/depot.js";

describe("mirror (PostgreSQL records + S3 blobs at both ends)", () => {
  let s3: S3Fixture;
  let dbs: Array<Awaited<ReturnType<typeof createTestSchema>>> = [];
  const stores: PackageStore[] = [];
  const servers: PackageServer[] = [];
  beforeAll(async () => {
    s3 = await startS3();
    dbs = [await createTestSchema(), await createTestSchema()];
  });
  afterAll(async () => {
    for (const server of servers) await server.close();
    for (const store of stores) await store.close?.();
    for (const db of dbs) await db.drop();
    await s3?.close();
  });

  async function openStore(db: Awaited<ReturnType<typeof createTestSchema>>): Promise<PackageStore> {
    const prefix = `mirror-${randomUUID()}/`;
    // A resident object keeps s3rver's tmp/ directory alive (see feed-on-postgres-s3.test.ts).
    await s3.client.send(new PutObjectCommand({ Bucket: s3.bucket, Key: `${prefix}tmp/.keep`, Body: "" }));
    const store = composeStore({
      blobs: createS3BlobStore({ bucket: s3.bucket, prefix, clientConfig: s3.clientConfig }),
      records: createPostgresRecords({ pool: db.pool, schema: db.schema }),
    });
    stores.push(store);
    return store;
  }

  it("copies through signed URLs, survives the upstream closing mid-mirror, and serves the same archives", async () => {
    const upStore = await openStore(dbs[0]!);
    const serve = async (port = 0) => {
      const server = await servePackageRouter(createPackageRouter(upStore, { onError: () => undefined }), { port });
      servers.push(server);
      return server;
    };
    let up = await serve();
    const port = Number(new URL(up.url).port);
    const shared = "s3 shared ".repeat(3000);
    for (let i = 0; i < 6; i++) {
      const additions = [
        { type: "file" as const, path: "big", body: shared },
        { type: "file" as const, path: "own", body: `own ${i}` },
      ];
      expect((await publish(up.url, `s${i % 2}@1.0.${i}`, additions)).status).toBe(201);
    }
    expect((await fetch(`${up.url}/yank/s0@1.0.2`, { method: "POST", headers: { "Pkg-Reason": "nope" } })).status).toBe(
      200,
    );
    const signed = await fetch(`${up.url}/data/s1@1.0.1`, { redirect: "manual" });
    expect(signed.status).toBe(302);

    const local = await openStore(dbs[1]!);
    let applied = 0;
    const cut = await mirrorDepot(local, {
      upstream: up.url,
      onChange: () => {
        if (++applied === 3) void up.close();
      },
    }).then(
      () => null,
      (e: unknown) => e,
    );
    expect(isRunnerDepotError(cut) && cut.code).toBe("UNAVAILABLE");
    const saved = (await local.getRecord<{ position: number }>(mirrorKey(up.url)))!.value.position;
    expect(saved).toBeGreaterThanOrEqual(3);

    up = await serve(port);
    const rest = await mirrorDepot(local, { upstream: up.url });
    expect(rest.position).toBe(7);
    expect(rest.copied + rest.present + rest.yanks).toBe(7 - saved);

    const copy = await startDepot(local);
    servers.push(copy.server);
    for (const name of ["s0", "s1"]) {
      const [a, b] = await Promise.all([fetch(`${copy.url}/version/${name}`), fetch(`${up.url}/version/${name}`)]);
      expect(await a.json()).toEqual(await b.json());
    }
    const [mine, theirs] = await Promise.all([fetch(`${copy.url}/data/s0@1.0.4`), fetch(`${up.url}/data/s0@1.0.4`)]);
    expect(Buffer.from(await mine.arrayBuffer()).equals(Buffer.from(await theirs.arrayBuffer()))).toBe(true);
  }, 120_000);
});
