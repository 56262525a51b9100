/**
 * The S3 store's local copies of its own uploads (src/adapters/s3/upload-spool.ts): a blob
 * this process uploaded is read from its copy (S3 asked only whether it is there), a commit
 * therefore reads no item bytes back from S3, and the copy never outlives or contradicts
 * the blob on S3. Watched through the requests the store sends, on s3rver in its own
 * process or the server RUNNER_DEPOT_TEST_S3 names (radosgw).
 */
import { randomUUID } from "node:crypto";
import { readdir } from "node:fs/promises";
import { DeleteObjectCommand, PutObjectCommand, S3Client } from "@aws-sdk/client-s3";
import type { S3ClientConfig } from "@aws-sdk/client-s3";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createMemoryStore } from "../../../src/adapters/memory/store.js";
import { createS3BlobStore } from "../../../src/adapters/s3/index.js";
import { composeStore } from "../../../src/depot/store/compose.js";
import { chunked, collectBytes, patternBytes, sha256Digest } from "../../../src/testing/index.js";
import { startS3 } from "../../fixtures/backends.js";
import type { S3Fixture } from "../../fixtures/backends.js";
import { publish, startDepot, storeDigest, tempDir } from "../../fixtures/depot.js";

const MiB = 1024 * 1024;
let s3: S3Fixture;
let spoolParent: Awaited<ReturnType<typeof tempDir>>;

beforeAll(async () => {
  s3 = await startS3();
  spoolParent = await tempDir("s3-spool-test-");
});
afterAll(async () => {
  await spoolParent?.cleanup();
  await s3?.close();
});

/** A client recording the name of every command it sends (and in `keys`, with its object key). */
function recordingClient(config: S3ClientConfig): { client: S3Client; sent: string[]; keys: string[] } {
  const client = new S3Client(config);
  const sent: string[] = [];
  const keys: string[] = [];
  client.middlewareStack.add(
    (next, context) => async (args) => {
      sent.push(context.commandName ?? "?");
      keys.push(`${context.commandName} ${(args.input as { Key?: string }).Key ?? ""}`);
      return next(args);
    },
    { step: "initialize", name: "recordCommands" },
  );
  return { client, sent, keys };
}

function spooledStore(options: { spoolBytes?: number } = {}) {
  const prefix = `spool-${randomUUID()}/`;
  const { client, sent, keys } = recordingClient(s3.clientConfig!);
  const blobs = createS3BlobStore({
    bucket: s3.bucket,
    prefix,
    client,
    spoolDir: spoolParent.dir,
    // s3rver checks no payload hash; with it false a declared body is hashed here too.
    serverVerifiesPayload: false,
    ...options,
  });
  return { blobs, client, sent, keys, key: (digest: string) => `${prefix}sha256/${digest.slice(7)}` };
}

const spoolDirs = async () => (await readdir(spoolParent.dir)).filter((n) => n.startsWith("runner-depot-s3-spool-"));

describe("S3 store: local copies of its uploads", () => {
  it("reads a blob it uploaded from its copy, asking S3 only whether it is there; without copies from S3", async () => {
    const bytes = patternBytes(3 * MiB + 17, 3);
    const digest = sha256Digest(bytes);
    for (const spoolBytes of [undefined, 0]) {
      const { blobs, client, sent } = spooledStore({ spoolBytes });
      try {
        expect((await blobs.putBlob(chunked(bytes, 64 * 1024), { size: bytes.length })).digest).toBe(digest);
        sent.length = 0;
        expect(Buffer.compare(await collectBytes((await blobs.getBlob(digest))!), bytes)).toBe(0);
        const range = await collectBytes((await blobs.getBlob(digest, { start: MiB - 5, end: 2 * MiB + 5 }))!);
        expect(Buffer.compare(range, bytes.subarray(MiB - 5, 2 * MiB + 6))).toBe(0);
        expect(sent).toEqual(
          spoolBytes === 0 ? ["GetObjectCommand", "GetObjectCommand"] : ["HeadObjectCommand", "HeadObjectCommand"],
        );
      } finally {
        await blobs.close!();
        client.destroy();
      }
    }
  });

  it("any range of a kept copy reads as the same range of the blob", async () => {
    const bytes = patternBytes(2 * MiB + 3, 5);
    const digest = sha256Digest(bytes);
    const { blobs, client } = spooledStore();
    try {
      await blobs.putBlob(chunked(bytes, 100_000), { size: bytes.length });
      await fc.assert(
        fc.asyncProperty(fc.nat(bytes.length - 1), fc.nat(bytes.length - 1), async (a, b) => {
          const [start, end] = a <= b ? [a, b] : [b, a];
          const read = await collectBytes((await blobs.getBlob(digest, { start, end }))!);
          expect(Buffer.compare(read, bytes.subarray(start, end + 1))).toBe(0);
        }),
        { numRuns: 25 },
      );
    } finally {
      await blobs.close!();
      client.destroy();
    }
  });

  it("openBlob opens only a kept copy, for reads into the caller's buffer; null for others and once gone from S3", async () => {
    const bytes = patternBytes(2 * MiB + 9, 6);
    const digest = sha256Digest(bytes);
    const small = patternBytes(1000, 6);
    const { blobs, client, key, sent } = spooledStore();
    try {
      await blobs.putBlob(chunked(bytes, 64 * 1024), { size: bytes.length });
      await blobs.putBlob(chunked(small, 100), { size: small.length });
      sent.length = 0;
      const reader = await blobs.openBlob!(digest);
      expect(reader).not.toBeNull();
      expect(sent).toEqual(["HeadObjectCommand"]);
      try {
        expect(reader!.size).toBe(bytes.length);
        const buffer = Buffer.alloc(MiB + 20, 0xee);
        for (const [position, length] of [
          [0, 1],
          [MiB - 3, MiB + 7],
          [bytes.length - 4, 4],
        ] as const) {
          let got = 0;
          while (got < length) got += await reader!.read(buffer, 7 + got, length - got, position + got);
          expect(buffer.subarray(7, 7 + length).equals(bytes.subarray(position, position + length))).toBe(true);
        }
        expect(await reader!.read(buffer, 0, 10, bytes.length)).toBe(0);
        // Deleted on S3 meanwhile: what is open stays readable (ports.ts), a new open declines.
        await client.send(new DeleteObjectCommand({ Bucket: s3.bucket, Key: key(digest) }));
        expect(await reader!.read(buffer, 0, 10, 100)).toBe(10);
        expect(buffer.subarray(0, 10).equals(bytes.subarray(100, 110))).toBe(true);
      } finally {
        await reader!.close();
      }
      expect(await blobs.openBlob!(digest)).toBeNull();
      // Under the copies' floor: no copy, so no open (the depot reads it with getBlob).
      expect(await blobs.openBlob!(sha256Digest(small))).toBeNull();
      expect(Buffer.compare(await collectBytes((await blobs.getBlob(sha256Digest(small)))!), small)).toBe(0);
    } finally {
      await blobs.close!();
      client.destroy();
    }
  });

  it("a blob gone from S3, or changed there, is not served from the copy", async () => {
    const bytes = patternBytes(2 * MiB, 7);
    const digest = sha256Digest(bytes);
    const { blobs, client, key } = spooledStore();
    try {
      await blobs.putBlob(chunked(bytes, 64 * 1024), { size: bytes.length });
      // Deleted behind this process's back (garbage collection on another replica).
      await client.send(new DeleteObjectCommand({ Bucket: s3.bucket, Key: key(digest) }));
      expect(await blobs.getBlob(digest)).toBeNull();

      await blobs.putBlob(chunked(bytes, 64 * 1024), { size: bytes.length });
      const other = patternBytes(1000, 8);
      await client.send(new PutObjectCommand({ Bucket: s3.bucket, Key: key(digest), Body: other }));
      expect(Buffer.compare(await collectBytes((await blobs.getBlob(digest))!), other)).toBe(0);

      // Deleted through the store: the copy goes with it.
      await blobs.putBlob(chunked(bytes, 64 * 1024), { size: bytes.length });
      await blobs.deleteBlob(digest);
      expect(await blobs.getBlob(digest)).toBeNull();
    } finally {
      await blobs.close!();
      client.destroy();
    }
  });

  it("keeps at most spoolBytes (the oldest copy dropped), nothing of a refused body, and no directory after close", async () => {
    const first = patternBytes(3 * MiB, 1);
    const second = patternBytes(3 * MiB, 2);
    const before = await spoolDirs();
    const { blobs, client, sent } = spooledStore({ spoolBytes: 4 * MiB });
    try {
      await blobs.putBlob(chunked(first, 64 * 1024), { size: first.length });
      await blobs.putBlob(chunked(second, 64 * 1024), { size: second.length });
      await expect(
        blobs.putBlob(chunked(second, 64 * 1024), { size: second.length, expectedDigest: sha256Digest(first) }),
      ).rejects.toMatchObject({ code: "DIGEST_MISMATCH" });
      sent.length = 0;
      expect(Buffer.compare(await collectBytes((await blobs.getBlob(sha256Digest(first)))!), first)).toBe(0);
      expect(Buffer.compare(await collectBytes((await blobs.getBlob(sha256Digest(second)))!), second)).toBe(0);
      expect(sent).toEqual(["GetObjectCommand", "HeadObjectCommand"]);
      const [dir] = (await spoolDirs()).filter((d) => !before.includes(d));
      // Only the second body's copy: the first was dropped, the refused one never kept.
      expect(await readdir(`${spoolParent.dir}/${dir}`)).toHaveLength(1);
    } finally {
      await blobs.close!();
      client.destroy();
    }
    expect(await spoolDirs()).toEqual(before);
  });

  it("a commit hashes its items from the copies: no item bytes read back from S3, the same archive", async () => {
    const { blobs, client, keys, key } = spooledStore();
    const store = composeStore({ blobs, records: createMemoryStore() });
    const depot = await startDepot(store);
    try {
      const big = patternBytes(5 * MiB + 11, 4);
      const id = `spooled@1.0.0`;
      keys.length = 0;
      const commit = await publish(depot.url, id, [
        { type: "file", path: "big.bin", body: big },
        { type: "file", path: "small.txt", body: "small" },
      ]);
      expect(commit.status).toBe(201);
      const { digest } = (await commit.json()) as { digest: string };
      // The big item is only asked for (HEAD); the small one (under the copies' 1 MiB floor) is read.
      expect(keys).not.toContain(`GetObjectCommand ${key(sha256Digest(big))}`);
      expect(keys).toContain(`HeadObjectCommand ${key(sha256Digest(big))}`);
      expect(keys).toContain(`GetObjectCommand ${key(sha256Digest("small"))}`);
      const served = await fetch(`${depot.url}/data/${id}`);
      expect(served.status).toBe(200);
      expect(storeDigest(new Uint8Array(await served.arrayBuffer()))).toBe(digest);
    } finally {
      await depot.close();
      await store.close?.();
      client.destroy();
    }
  });
});
