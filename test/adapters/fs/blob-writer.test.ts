/**
 * The fs store's upload pipeline (src/adapters/fs/blob-writer.ts): a synced store flushes
 * the file in the background while the body still arrives, never while unsynced, and
 * whatever the sizes and the chunking the stored blob and its digest are the body's.
 * Observed through the writer's diagnostics channel, never through timing.
 */
import { createHash, randomBytes } from "node:crypto";
import diagnostics_channel from "node:diagnostics_channel";
import http from "node:http";
import { mkdtemp, open, readdir, rm, type FileHandle } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import fc from "fast-check";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import type { BlobWriteEvent } from "../../../src/adapters/fs/blob-writer.js";
import { createFsStore } from "../../../src/adapters/fs/store.js";
import type { PackageStore } from "../../../src/depot/ports.js";
import { createPackageRouter } from "../../../src/depot/server/router.js";
import { servePackageRouter } from "../../../src/depot/server/serve.js";

const MiB = 2 ** 20;
const CHANNEL = "runner-depot:fs-blob-write";

let tmp: string;
let store: PackageStore;
let events: BlobWriteEvent[];
const listen = (message: unknown) => void events.push(message as BlobWriteEvent);

beforeEach(async () => {
  tmp = await mkdtemp(path.join(os.tmpdir(), "depot-upload-"));
  store = createFsStore(path.join(tmp, "store")); // fsync on: the default
  events = [];
  diagnostics_channel.subscribe(CHANNEL, listen);
});

afterEach(async () => {
  diagnostics_channel.unsubscribe(CHANNEL, listen);
  await store.close?.();
  await rm(tmp, { recursive: true, force: true });
});

/** `size` bytes, each MiB different: a random block with its index stamped in. O(size) to read, O(1 MiB) memory. */
function pattern(size: number): { chunk(from: number, to: number): Buffer; digest: string } {
  const block = randomBytes(MiB);
  const at = (offset: number) => {
    block.writeUInt32BE(Math.floor(offset / MiB), 0);
    return block;
  };
  const hash = createHash("sha256");
  for (let offset = 0; offset < size; offset += MiB) hash.update(at(offset).subarray(0, Math.min(MiB, size - offset)));
  return {
    /** A copy of bytes [from, to): from and to within one MiB block, or to at its end. */
    chunk: (from, to) => Buffer.from(at(from).subarray(from % MiB, (from % MiB) + (to - from))),
    digest: `sha256:${hash.digest("hex")}`,
  };
}

/** The body of `size` bytes in chunks of the sizes `next()` picks (cut at MiB boundaries); `sent()` counts what was handed out. */
function body(size: number, next: () => number) {
  const source = pattern(size);
  let sent = 0;
  async function* chunks(): AsyncGenerator<Uint8Array> {
    while (sent < size) {
      const end = Math.min(size, sent + next(), (Math.floor(sent / MiB) + 1) * MiB);
      const chunk = source.chunk(sent, end);
      sent = end;
      yield chunk;
    }
  }
  return { chunks: chunks(), digest: source.digest, sent: () => sent };
}

async function storedDigest(digest: string): Promise<string> {
  const hash = createHash("sha256");
  for await (const chunk of (await store.getBlob(digest))!) hash.update(chunk);
  return `sha256:${hash.digest("hex")}`;
}

describe("fs store uploads", () => {
  it("store every size around the write boundaries whole, with the body's digest, whatever the chunking", async () => {
    let seed = 7;
    const random = () => (seed = (seed * 1_103_515_245 + 12_345) % 2 ** 31) / 2 ** 31;
    const sizes = [0, 1, MiB - 1, MiB, MiB + 1, 9 * MiB + 12_345, 17 * MiB];
    for (const size of sizes) {
      for (const chunking of [
        () => 1 + Math.floor(random() * 200_000),
        () => MiB,
        () => 1 + Math.floor(random() * 3000),
      ]) {
        const upload = body(size, chunking);
        const info = await store.putBlob(upload.chunks);
        expect(info).toEqual({ digest: upload.digest, size });
        expect(await storedDigest(info.digest)).toBe(upload.digest);
      }
    }
    expect(await readdir(path.join(tmp, "store", "tmp"))).toEqual([]);
  }, 120_000);

  it("store any body whole with node:crypto's digest, whatever its chunking (property)", async () => {
    // Piece sizes spread up to 300 KB, so bodies cross the 1 MiB write boundary in chunks
    // of every shape (size "max": fast-check's default keeps arrays short).
    const pieces = fc.array(fc.integer({ min: 0, max: 300_000 }), { maxLength: 24, size: "max" });
    const unsynced = createFsStore(path.join(tmp, "property"), { unsafeNoSync: true });
    try {
      await fc.assert(
        fc.asyncProperty(pieces, async (sizes) => {
          const bytes = randomBytes(sizes.reduce((a, b) => a + b, 0));
          async function* chunks(): AsyncGenerator<Uint8Array> {
            let from = 0;
            for (const length of sizes) {
              yield Buffer.from(bytes.subarray(from, from + length));
              from += length;
            }
          }
          const digest = `sha256:${createHash("sha256").update(bytes).digest("hex")}`;
          expect(await unsynced.putBlob(chunks())).toEqual({ digest, size: bytes.byteLength });
          const stored: Buffer[] = [];
          for await (const chunk of (await unsynced.getBlob(digest))!) stored.push(Buffer.from(chunk));
          expect(Buffer.concat(stored).equals(bytes)).toBe(true);
        }),
        { numRuns: 40 },
      );
      expect(await readdir(path.join(tmp, "property", "tmp"))).toEqual([]);
    } finally {
      await unsynced.close?.();
    }
  }, 120_000);

  it("keep concurrent uploads apart", async () => {
    const uploads = Array.from({ length: 6 }, (_, i) => body(3 * MiB + i * 70_001, () => 40_000 + i * 9_000));
    const infos = await Promise.all(uploads.map((upload) => store.putBlob(upload.chunks)));
    for (const [i, info] of infos.entries()) {
      expect(info.digest).toBe(uploads[i]!.digest);
      expect(await storedDigest(info.digest)).toBe(uploads[i]!.digest);
    }
  });

  it("flush the file to disk in the background while the body still arrives", async () => {
    const size = 100 * MiB;
    const upload = body(size, () => MiB);
    const sentAtFlush: number[] = [];
    const flushes = (message: unknown) => {
      if ((message as BlobWriteEvent).type === "flush") sentAtFlush.push(upload.sent());
    };
    diagnostics_channel.subscribe(CHANNEL, flushes);
    try {
      const info = await store.putBlob(upload.chunks);
      expect(info.digest).toBe(upload.digest);
    } finally {
      diagnostics_channel.unsubscribe(CHANNEL, flushes);
    }
    // At least one fdatasync started with most of the body still to come (one every
    // 32 MiB written, never more than one at a time), each after 32 MiB or more.
    expect(sentAtFlush.length).toBeGreaterThanOrEqual(1);
    expect(sentAtFlush[0]).toBeLessThan(size / 2);
    const written = events.map((e) => e.written);
    expect(written[0]).toBeGreaterThanOrEqual(32 * MiB);
    for (let i = 1; i < written.length; i++) expect(written[i]! - written[i - 1]!).toBeGreaterThanOrEqual(32 * MiB);
  }, 120_000);

  it("never hold the body up while a background flush runs, and fail the upload when one fails", async () => {
    // Every file handle's fdatasync is held until released (the disk at its slowest), then fails.
    const probe = await open(path.join(tmp, "probe"), "w");
    const proto = Object.getPrototypeOf(probe) as FileHandle;
    await probe.close();
    const real = proto.datasync;
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    let started = 0;
    proto.datasync = function (this: FileHandle) {
      started++;
      return held.then(() => Promise.reject(Object.assign(new Error("EIO: i/o error, fdatasync"), { code: "EIO" })));
    };
    try {
      const size = 100 * MiB;
      const upload = body(size, () => MiB);
      const result = store.putBlob(upload.chunks).then(
        () => "stored",
        (error: unknown) => error,
      );
      // The whole body is taken while the first flush is still held: only one was started.
      for (let waited = 0; upload.sent() < size; waited += 20) {
        if (waited > 60_000)
          throw new Error(`the body stalled at ${upload.sent()} of ${size} bytes behind a held flush`);
        await new Promise((r) => setTimeout(r, 20));
      }
      expect(started).toBe(1);
      release();
      expect(await result).toMatchObject({ code: "EIO" });
      expect(await readdir(path.join(tmp, "store", "tmp"))).toEqual([]);
      expect(await store.statBlob(upload.digest)).toBeNull();
    } finally {
      proto.datasync = real;
    }
  }, 120_000);

  it("start no background flush without fsync (unsafeNoSync)", async () => {
    const unsynced = createFsStore(path.join(tmp, "nosync"), { unsafeNoSync: true });
    try {
      const upload = body(40 * MiB, () => MiB);
      expect((await unsynced.putBlob(upload.chunks)).digest).toBe(upload.digest);
      expect(events.filter((e) => e.type === "flush")).toEqual([]);
    } finally {
      await unsynced.close?.();
    }
  });

  it("keep nothing of a body that fails after some MiB, and answer the next upload rightly", async () => {
    async function* failing(): AsyncGenerator<Uint8Array> {
      for (let i = 0; i < 20; i++) yield randomBytes(MiB);
      throw new Error("client went away");
    }
    await expect(store.putBlob(failing())).rejects.toThrow("client went away");
    await expect(store.putBlob(body(12 * MiB, () => MiB).chunks, { maxBytes: 10 * MiB })).rejects.toMatchObject({
      code: "TOO_LARGE",
    });
    expect(await readdir(path.join(tmp, "store", "tmp"))).toEqual([]);
    const upload = body(3 * MiB + 5, () => 65_536);
    expect((await store.putBlob(upload.chunks)).digest).toBe(upload.digest);
  });

  it("take 256 MiB through the real server with the right digest, flushed while it arrived", async () => {
    const router = createPackageRouter(store);
    const server = await servePackageRouter(router, { host: "127.0.0.1", port: 0 });
    try {
      const opened = await fetch(`${server.url}/trans/big@1.0.0`, { method: "POST" });
      expect(opened.status).toBe(201);
      const { transaction } = (await opened.json()) as { transaction: string };
      const size = 256 * MiB;
      const upload = body(size, () => 256 * 1024);
      // Streamed with backpressure (node:http), so the events below happen during the upload.
      const answer = await new Promise<{ status: number; text: string }>((resolve, reject) => {
        const request = http.request(
          `${server.url}/add/${transaction}/file`,
          { method: "POST", headers: { "Pkg-Path": "big.bin", "Content-Length": String(size) } },
          (response) => {
            let text = "";
            response.setEncoding("utf8");
            response.on("data", (part: string) => (text += part));
            response.on("end", () => resolve({ status: response.statusCode ?? 0, text }));
          },
        );
        request.on("error", reject);
        void (async () => {
          for await (const chunk of upload.chunks)
            if (!request.write(chunk)) await new Promise((r) => request.once("drain", r));
          request.end();
        })().catch(reject);
      });
      expect(answer.status).toBe(201);
      expect(JSON.parse(answer.text)).toMatchObject({ path: "big.bin", size, digest: upload.digest });
      // Flushed while it arrived: a background fdatasync began with part of the file written.
      const flushed = events.map((e) => e.written);
      expect(flushed.length).toBeGreaterThanOrEqual(1);
      expect(flushed[0]).toBeLessThan(size);
      expect(await storedDigest(upload.digest)).toBe(upload.digest);
    } finally {
      await server.close();
    }
  }, 180_000);
});
