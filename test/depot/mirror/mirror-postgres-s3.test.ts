/**
 * The mirror on PostgreSQL records + S3 blobs (s3rver) at both ends: the upstream's archives answer
 * by 302 to signed S3 URLs, so every range the mirror reads is served by the object store. The
 * upstream's server is closed in the middle of a mirror and served again on the same port.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { mirrorDepot, mirrorKey } from "../../../src/depot/mirror/mirror.js";
import { createPackageRouter } from "../../../src/depot/server/router.js";
import { servePackageRouter, type PackageServer } from "../../../src/depot/server/serve.js";
import { isRunnerDepotError } from "../../../src/errors.js";
import { startPostgresS3Stores, type PostgresS3Stores } from "../../fixtures/postgres-s3-stores.js";
import { publish, startDepot } from "../../fixtures/depot.js";

describe("mirror (PostgreSQL records + S3 blobs at both ends)", () => {
  let backends: PostgresS3Stores;
  const servers: PackageServer[] = [];
  beforeAll(async () => {
    backends = await startPostgresS3Stores(2);
  });
  afterAll(async () => {
    for (const server of servers) await server.close();
    await backends?.close();
  });

  const openStore = (index: number) => backends.open(index, "mirror");

  it("copies through signed URLs, survives the upstream closing mid-mirror, and serves the same archives", async () => {
    const upStore = await openStore(0);
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

    const local = await openStore(1);
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
