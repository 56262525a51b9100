/**
 * Pull-through on PostgreSQL records + S3 blobs (s3rver) at both ends: the upstream's archives
 * answer by 302 to signed S3 URLs, so the ranges a pull reads come from the object store. A miss is
 * pulled and held; with the upstream closed, the held version is still served; a version published
 * upstream after a remembered miss is found once the miss TTL has passed.
 */
import { createHash } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startPostgresS3Stores, type PostgresS3Stores } from "../../fixtures/postgres-s3-stores.js";
import { publish, startDepot, type LiveDepot } from "../../fixtures/depot.js";

const sha = (bytes: ArrayBuffer) => createHash("sha256").update(Buffer.from(bytes)).digest("hex");

describe("pull-through (PostgreSQL records + S3 blobs at both ends)", () => {
  let backends: PostgresS3Stores;
  const depots: LiveDepot[] = [];
  beforeAll(async () => {
    backends = await startPostgresS3Stores(2);
  });
  afterAll(async () => {
    for (const depot of depots) await depot.close().catch(() => undefined);
    await backends?.close();
  });

  const openStore = (index: number) => backends.open(index, "pull");

  it("pulls a miss through signed URLs, holds it while the upstream is down, and has no stuck 404", async () => {
    const up = await startDepot(await openStore(0));
    depots.push(up);
    const body = "s3 pulled ".repeat(3000);
    expect((await publish(up.url, "tool@1.0.0", [{ type: "file", path: "bin", body }])).status).toBe(201);
    expect((await fetch(`${up.url}/data/tool@1.0.0`, { redirect: "manual" })).status).toBe(302);
    const whole = sha(await (await fetch(`${up.url}/data/tool@1.0.0`)).arrayBuffer());

    let clock = Date.parse("2026-11-29T10:00:00Z");
    const local = await startDepot(await openStore(1), {
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
