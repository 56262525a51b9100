/**
 * The depot on real backends: blobs on S3 (s3rver), records on PostgreSQL, joined by
 * composeStore. A representative publish / install / race / range / ETag set runs over
 * real HTTP, the full PackageStore suite runs on the composed store, and downloads are
 * served by a redirect to a presigned S3 URL.
 */
import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createPostgresRecords } from "../../src/adapters/postgres/index.js";
import { createS3BlobStore } from "../../src/adapters/s3/index.js";
import { composeStore } from "../../src/depot/store/compose.js";
import type { PackageStore } from "../../src/depot/ports.js";
import { describePackageStore, patternBytes } from "../../src/testing/index.js";
import { createTestSchema, needs, startS3 } from "../fixtures/backends.js";
import type { S3Fixture } from "../fixtures/backends.js";
import { httpDigest, openTransaction, parseTar, publish, startDepot, storeDigest } from "../fixtures/depot.js";
import type { LiveDepot } from "../fixtures/depot.js";

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

const prefixOf = new WeakMap<PackageStore, string>();
function composed(prefix = `depot-${randomUUID()}/`): PackageStore {
  const store = composeStore({
    blobs: createS3BlobStore({
      bucket: s3.bucket,
      prefix,
      clientConfig: s3.clientConfig,
      partSizeBytes: 5 * 1024 * 1024,
    }),
    records: createPostgresRecords({ pool: db.pool, schema: db.schema }),
  });
  prefixOf.set(store, prefix);
  return store;
}

describePackageStore("s3 blobs + postgres records (composeStore)", () => composed(), {
  signing: true,
  reopen: (store) => composed(prefixOf.get(store)),
});

describe("depot on S3 + PostgreSQL over HTTP", () => {
  let store: PackageStore;
  let depot: LiveDepot;
  beforeAll(async () => {
    if (!haveDatabase) return;
    store = composed();
    depot = await startDepot(store);
  });
  afterAll(async () => {
    await depot?.close();
    await store?.close?.();
  });

  it("publishes, and serves the archive by redirect to a presigned S3 URL", async () => {
    const big = patternBytes(11 * 1024 * 1024 + 5, 4);
    const commit = await publish(depot.url, "Tool@1.0.0", [
      { type: "file", path: "bin/tool", body: "#!/bin/sh\necho hi\n", mode: "0755" },
      { type: "file", path: "share/data.bin", body: big },
      { type: "dir", path: "share", mode: "0750" },
      { type: "link", path: "share/tool", target: "../bin/tool" },
      { type: "set", attrs: { description: "on S3" } },
      { type: "require", requires: ["libfoo@^1.2.0"] },
    ]);
    expect(commit.status).toBe(201);
    const committed = (await commit.json()) as { digest: string };

    const catalog = (await (await fetch(`${depot.url}/catalog`)).json()) as {
      packages: Record<string, { latest: string }>;
      count: number;
    };
    expect(catalog.packages.tool).toMatchObject({ latest: "1.0.0" });
    expect(await (await fetch(`${depot.url}/depend/tool`)).json()).toEqual({
      name: "tool",
      version: "1.0.0",
      requires: [{ name: "libfoo", range: "^1.2.0" }],
    });

    const redirect = await fetch(`${depot.url}/data/tool@1.0.0`, { redirect: "manual" });
    expect([302, 307]).toContain(redirect.status);
    const location = redirect.headers.get("location")!;
    expect(location.startsWith(`${s3.endpoint}/${s3.bucket}/`)).toBe(true);
    expect(location).toContain("X-Amz-Signature=");
    expect(redirect.headers.get("repr-digest")).toMatch(/^sha-256=:/);

    const download = await fetch(location);
    expect(download.status).toBe(200);
    const bytes = new Uint8Array(await download.arrayBuffer());
    expect(storeDigest(bytes)).toBe(committed.digest);
    expect(redirect.headers.get("repr-digest")).toBe(httpDigest(bytes));
    const entries = await parseTar(bytes);
    expect(entries.map((e) => e.name)).toEqual([
      ".pkg/manifest.json",
      "bin/tool",
      "share",
      "share/data.bin",
      "share/tool",
    ]);
    expect(Buffer.from(entries.find((e) => e.name === "share/data.bin")!.body).equals(big)).toBe(true);

    // A client that follows redirects gets the same bytes, and ranges work through it.
    const followed = new Uint8Array(await (await fetch(`${depot.url}/data/tool`)).arrayBuffer());
    expect(storeDigest(followed)).toBe(committed.digest);
    const part = await fetch(`${depot.url}/data/tool@1.0.0`, { headers: { Range: "bytes=100-611" } });
    expect(part.status).toBe(206);
    expect(Buffer.from(await part.arrayBuffer()).equals(Buffer.from(bytes.subarray(100, 612)))).toBe(true);
  });

  it("two transactions for one version: exactly one commit wins, the other gets 409", async () => {
    const ids = await Promise.all([0, 1, 2].map(() => openTransaction(depot.url, "raced@1.0.0")));
    for (const [i, id] of ids.entries()) {
      const r = await fetch(`${depot.url}/add/${id}/file`, {
        method: "POST",
        headers: { "Pkg-Path": "who" },
        body: `writer ${i}`,
      });
      expect(r.status).toBe(201);
    }
    const commits = await Promise.all(ids.map((id) => fetch(`${depot.url}/commit/${id}`, { method: "POST" })));
    const statuses = commits.map((c) => c.status).sort();
    expect(statuses).toEqual([201, 409, 409]);
    const version = (await (await fetch(`${depot.url}/version/raced`)).json()) as { versions: unknown[] };
    expect(version.versions).toHaveLength(1);
  });

  it("concurrent publishes of different packages all reach the catalog (CAS on PostgreSQL)", async () => {
    const names = Array.from({ length: 8 }, (_, i) => `pkg${i}`);
    const results = await Promise.all(
      names.map((n) => publish(depot.url, `${n}@1.0.0`, [{ type: "file", path: "a", body: n }])),
    );
    expect(results.map((r) => r.status)).toEqual(names.map(() => 201));
    const catalog = (await (await fetch(`${depot.url}/catalog`)).json()) as { packages: Record<string, unknown> };
    for (const n of names) expect(catalog.packages[n]).toBeDefined();
  });

  it("catalog ETag: 304 while unchanged, a new ETag after a publish", async () => {
    const etag = (await fetch(`${depot.url}/catalog`)).headers.get("etag")!;
    expect((await fetch(`${depot.url}/catalog`, { headers: { "If-None-Match": etag } })).status).toBe(304);
    expect((await publish(depot.url, "etagged@1.0.0", [{ type: "file", path: "a", body: "a" }])).status).toBe(201);
    const changed = await fetch(`${depot.url}/catalog`, { headers: { "If-None-Match": etag } });
    expect(changed.status).toBe(200);
    expect(changed.headers.get("etag")).not.toBe(etag);
  });

  it("a second depot replica on the same bucket prefix and schema serves the same versions", async () => {
    const replicaStore = composed(prefixOf.get(store));
    const replica = await startDepot(replicaStore);
    try {
      const a = await (await fetch(`${depot.url}/version/tool`)).json();
      const b = await (await fetch(`${replica.url}/version/tool`)).json();
      expect(b).toEqual(a);
      // A version committed on one replica is refused on the other.
      const r = await fetch(`${replica.url}/trans/tool@1.0.0`, { method: "POST" });
      expect(r.status).toBe(409);
      const bytes = new Uint8Array(await (await fetch(`${replica.url}/data/tool@1.0.0`)).arrayBuffer());
      expect(storeDigest(bytes)).toBe((a as { versions: Array<{ digest: string }> }).versions[0]!.digest);
    } finally {
      await replica.close();
      await replicaStore.close?.();
    }
  });
});
