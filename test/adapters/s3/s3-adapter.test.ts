/** S3 blob store: the blob conformance suite against s3rver (in-process, path-style). */
import { randomUUID } from "node:crypto";
import { ListObjectsV2Command, PutObjectCommand } from "@aws-sdk/client-s3";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createS3BlobStore } from "../../../src/adapters/s3/index.js";
import { composeStore } from "../../../src/depot/store/compose.js";
import { createMemoryStore } from "../../../src/adapters/memory/store.js";
import {
  chunked,
  collectAll,
  collectBytes,
  describePackageStore,
  patternBytes,
  sha256Digest,
} from "../../../src/testing/index.js";
import { fixtureFor, startS3, startS3Child, startTcpProxy } from "../../fixtures/backends.js";
import type { S3Fixture, TcpProxy } from "../../fixtures/backends.js";
import { tempDir } from "../../fixtures/depot.js";

let s3: S3Fixture;
// The store's local copies of uploads go here, removed with it (stores of the suite are not all closed).
let spool: Awaited<ReturnType<typeof tempDir>>;
let proxy: TcpProxy;
let viaProxy: S3Fixture;

beforeAll(async () => {
  spool = await tempDir("s3-spool-");
  s3 = await startS3();
  proxy = await startTcpProxy("127.0.0.1", Number(new URL(s3.endpoint).port));
  viaProxy = fixtureFor(`http://127.0.0.1:${proxy.port}`, s3.bucket);
});
afterAll(async () => {
  await spool?.cleanup();
  await viaProxy?.close();
  await proxy?.close();
  await s3?.close();
});

// A fresh key prefix per store: stores in one bucket never see each other's blobs.
const prefixes = new WeakMap<object, string>();
function s3Store(prefix = `t-${randomUUID()}/`) {
  // Blobs through the proxy (so the outage case can cut S3 off); records are not S3's job.
  const blobs = createS3BlobStore({
    spoolDir: spool.dir,
    bucket: s3.bucket,
    prefix,
    clientConfig: viaProxy.clientConfig,
    partSizeBytes: 5 * 1024 * 1024,
  });
  const store = composeStore({ blobs, records: createMemoryStore() });
  prefixes.set(store, prefix);
  return store;
}

describePackageStore("s3 blobs", () => s3Store(), {
  only: "blobs",
  signing: true,
  reopen: (store) => s3Store(prefixes.get(store)),
  outage: { break: () => proxy.break(), heal: () => proxy.heal() },
});

describe("s3 blob store: extra cases", () => {
  it("stores blobs at <prefix>sha256/<hex> and leaves no temporary object behind", async () => {
    const prefix = `x-${randomUUID()}/`;
    const blobs = createS3BlobStore({ spoolDir: spool.dir, bucket: s3.bucket, prefix, client: s3.client });
    const bytes = patternBytes(6 * 1024 * 1024, 9);
    const { digest } = await blobs.putBlob(chunked(bytes));
    await expect(blobs.putBlob(chunked(Buffer.from("x")), { maxBytes: 0 })).rejects.toMatchObject({
      code: "TOO_LARGE",
    });
    const listed = await s3.client.send(new ListObjectsV2Command({ Bucket: s3.bucket, Prefix: prefix }));
    expect((listed.Contents ?? []).map((o) => o.Key)).toEqual([`${prefix}sha256/${digest.slice(7)}`]);
    await blobs.close?.();
    // A client the host gave is not destroyed by close.
    expect((await s3.client.send(new ListObjectsV2Command({ Bucket: s3.bucket, Prefix: prefix }))).KeyCount).toBe(1);
  });

  it("listBlobs pages through ListObjectsV2 and ignores foreign keys under the prefix", async () => {
    const prefix = `p-${randomUUID()}/`;
    // Its own s3rver: the in-process one cannot page ListObjectsV2 (see startS3Child).
    const s3 = await startS3Child();
    const blobs = createS3BlobStore({
      spoolDir: spool.dir,
      bucket: s3.bucket,
      prefix,
      client: s3.client,
      listPageSize: 7,
    });
    const digests = new Set<string>();
    // Several ListObjectsV2 pages of 7 keys, the last one partial.
    const puts = Array.from({ length: 38 }, (_, i) => Buffer.from(`blob ${i}`));
    for (let i = 0; i < puts.length; i += 50) {
      const infos = await Promise.all(
        puts.slice(i, i + 50).map(async (b) => {
          const hex = sha256Digest(b).slice(7);
          await s3.client.send(new PutObjectCommand({ Bucket: s3.bucket, Key: `${prefix}sha256/${hex}`, Body: b }));
          return `sha256:${hex}`;
        }),
      );
      for (const d of infos) digests.add(d);
    }
    await s3.client.send(new PutObjectCommand({ Bucket: s3.bucket, Key: `${prefix}sha256/not-a-digest`, Body: "x" }));
    const listed = await collectAll(blobs.listBlobs());
    expect(listed).toHaveLength(38);
    expect(new Set(listed)).toEqual(digests);
    expect((await collectBytes((await blobs.getBlob([...digests][0]!))!)).toString()).toMatch(/^blob /);
    await s3.close();
  });

  it("a malformed digest is simply absent (no key outside the content address is read)", async () => {
    const blobs = createS3BlobStore({ spoolDir: spool.dir, bucket: s3.bucket, client: s3.client });
    expect(await blobs.getBlob("sha256:../../etc/passwd")).toBeNull();
    expect(await blobs.statBlob("md5:abc")).toBeNull();
    await expect(blobs.putBlob(chunked(Buffer.from("x")), { expectedDigest: "sha256:nothex" })).rejects.toMatchObject({
      code: "DIGEST_MISMATCH",
    });
  });

  it("a signed URL carries the download file name", async () => {
    const blobs = createS3BlobStore({ spoolDir: spool.dir, bucket: s3.bucket, client: s3.client });
    const { digest } = await blobs.putBlob(chunked(Buffer.from("named")));
    const url = await blobs.signBlobUrl!(digest, { filename: "pkg-1.0.0.tar" });
    const res = await fetch(url!);
    expect(res.headers.get("content-disposition")).toBe('attachment; filename="pkg-1.0.0.tar"');
    expect(await res.text()).toBe("named");
  });

  it("an S3 outage surfaces as STORE_UNAVAILABLE", async () => {
    const blobs = createS3BlobStore({ spoolDir: spool.dir, bucket: s3.bucket, clientConfig: viaProxy.clientConfig });
    await proxy.break();
    try {
      await expect(blobs.statBlob(sha256Digest("x"))).rejects.toMatchObject({ code: "STORE_UNAVAILABLE" });
      await expect(blobs.putBlob(chunked(Buffer.from("y")))).rejects.toMatchObject({ code: "STORE_UNAVAILABLE" });
    } finally {
      await proxy.heal();
    }
    await blobs.close?.();
  });
});
