/**
 * Blobs of the fs store, content-addressed and immutable once stored: a body up to SMALL_BLOB_BYTES is a row
 * of records.db (small-blobs.ts), a larger one the file `blobs/sha256/<2 hex>/<64 hex>`.
 * Why: docs/decisions/depot-publish-durability.md, "blobs.ts: small blobs as rows, large ones as files".
 */
import { createHash } from "node:crypto";
import { renameSync, statSync } from "node:fs";
import { open, readdir, rm, type FileHandle } from "node:fs/promises";
import { join } from "node:path";
import type { BlobInfo, BlobReader, ByteRange, PackageStore, PutBlobOptions } from "../../depot/ports.js";
import { RunnerDepotError } from "../../errors.js";
import type { FsStoreContext } from "./store-context.js";
import type { DurableWrites } from "./durable.js";
import { writeBody } from "./blob-writer.js";
import type { HashWorker } from "./hash-worker.js";
import { openIfExists } from "./files.js";
import type { RecordDb } from "./record-db.js";
import { readHead, replay, rowChunks, rowReader } from "./small-blobs.js";

const DIGEST_RE = /^sha256:([0-9a-f]{64})$/;
const BLOB_NAME_RE = /^[0-9a-f]{64}$/;
/** Chunk size of blob reads (fewer, larger chunks to the socket; bounded memory per download). */
const READ_BYTES = 256 * 1024;

/** The blob half of a PackageStore. */
type FsBlobs = Pick<PackageStore, "putBlob" | "getBlob" | "openBlob" | "statBlob" | "deleteBlob" | "listBlobs">;

/** Rows of small blobs read per page while listing. */
const ROW_PAGE = 1000;
/**
 * A body declared (`size`: an upload's Content-Length) at least this long is hashed on the
 * store's worker thread (hash-worker.ts); a shorter one, or one of unknown length, on this
 * thread, where a hash costs less than the thread's start and the messages that would
 * carry it.
 */
const WORKER_HASH_BYTES = 1024 * 1024;

/** Makes the blob operations of one store; `records` opens the store and answers its database. */
export function createFsBlobs(
  ctx: FsStoreContext,
  durable: DurableWrites,
  records: () => Promise<RecordDb>,
  hashes?: HashWorker,
): FsBlobs {
  function blobPath(digest: string): string | null {
    const hex = DIGEST_RE.exec(digest)?.[1];
    return hex ? join(ctx.blobsDir, hex.slice(0, 2), hex) : null;
  }

  /** A small blob's bytes, or null when it is not a row (absent, a file, or not a digest). O(log rows + size). */
  async function row(digest: string): Promise<Uint8Array | null> {
    const hex = DIGEST_RE.exec(digest)?.[1];
    if (!hex) return null;
    const found = (await records()).statements.blobGet.get(Buffer.from(hex, "hex")) as { data: Uint8Array } | undefined;
    return found?.data ?? null;
  }

  /** Stores a whole small body as a row (unless its digest is a file already). */
  async function putSmall(chunks: Uint8Array[], size: number, opts: PutBlobOptions): Promise<BlobInfo> {
    const bytes = Buffer.concat(chunks, size);
    const hex = createHash("sha256").update(bytes).digest("hex");
    const digest = `sha256:${hex}`;
    if (opts.expectedDigest !== undefined && opts.expectedDigest !== digest) {
      throw new RunnerDepotError("DIGEST_MISMATCH", `Content hashes to ${digest}, not ${opts.expectedDigest}`);
    }
    if (statSync(blobPath(digest)!, { throwIfNoEntry: false })?.size === size) return { digest, size };
    const key = Buffer.from(hex, "hex");
    // deferSync: a row is in the records' WAL, so the caller's syncRecords covers it.
    await (await records()).write((s) => s.blobInsert.run(key, bytes), opts.deferSync !== true);
    return { digest, size };
  }

  /** A stored blob opened for reading (getBlob, openBlob); null when it is not there (never stored, or collected). */
  async function openStoredBlob(digest: string): Promise<FileHandle | null> {
    await ctx.init();
    const path = blobPath(digest);
    return path ? openIfExists(path) : null;
  }

  return {
    /** O(size) time, O(1 MiB) memory (blob-writer.ts): a large body streams to disk as it arrives. */
    async putBlob(body: AsyncIterable<Uint8Array>, opts: PutBlobOptions = {}): Promise<BlobInfo> {
      await ctx.init();
      const head = await readHead(body, opts.maxBytes);
      if (!head.rest) return putSmall(head.chunks, head.size, opts);
      const tmp = ctx.tmpPath();
      let handle: FileHandle | undefined = await open(tmp, "wx");
      try {
        const parallel = hashes && opts.size !== undefined && opts.size >= WORKER_HASH_BYTES;
        const { digest, size } = await writeBody(
          handle,
          replay(head),
          opts,
          ctx.sync,
          parallel ? hashes.start() : undefined,
        );
        if (opts.expectedDigest !== undefined && opts.expectedDigest !== digest) {
          throw new RunnerDepotError("DIGEST_MISMATCH", `Content hashes to ${digest}, not ${opts.expectedDigest}`);
        }
        const final = blobPath(digest)!;
        // Bytes already stored (a re-upload): keep the blob there, drop the copy. Renaming
        // over it would free the old file's blocks and, on ext4 (auto_da_alloc), start
        // writing the new one out: for 256 MiB that doubled the upload's system time.
        // stat and rename inline, as the record calls (durable.ts): no thread-pool round trip.
        const stored = statSync(final, { throwIfNoEntry: false })?.size === size;
        if (!stored && ctx.sync) await handle.sync();
        await handle.close();
        handle = undefined;
        const dir = join(final, "..");
        // Stored or not, the shard's entry is fsynced first (once a shard and store): bytes
        // already there may be a rename by a process that died before that fsync.
        await durable.ensureDir(dir);
        if (stored) await rm(tmp, { force: true });
        else renameSync(tmp, final);
        // A stored blob's writer synced it before its rename; its name may still await this sync.
        await durable.fsyncDir(dir);
        return { digest, size };
      } catch (error) {
        await handle?.close().catch(() => undefined);
        await rm(tmp, { force: true });
        throw error;
      }
    },

    async getBlob(digest: string, range?: ByteRange): Promise<AsyncIterable<Uint8Array> | null> {
      const data = await row(digest);
      if (data) return rowChunks(data, range);
      const handle = await openStoredBlob(digest);
      if (!handle) return null;
      // The open handle keeps the bytes readable even if the blob is collected meanwhile.
      return handle.createReadStream({
        start: range?.start,
        end: range?.end,
        autoClose: true,
        highWaterMark: READ_BYTES,
      });
    },

    async openBlob(digest: string): Promise<BlobReader | null> {
      const data = await row(digest);
      if (data) return rowReader(data);
      const handle = await openStoredBlob(digest);
      if (!handle) return null;
      try {
        const { size } = await handle.stat();
        // pread(2) into the caller's buffer: no allocation per read, unlike a read stream.
        return {
          size,
          read: async (buffer, offset, length, position) =>
            (await handle.read(buffer, offset, length, position)).bytesRead,
          close: () => handle.close(),
        };
      } catch (error) {
        await handle.close().catch(() => undefined);
        throw error;
      }
    },

    /** O(log rows): one lookup, then (not a row) one stat. */
    async statBlob(digest: string) {
      await ctx.init();
      const path = blobPath(digest);
      if (!path) return null;
      const found = (await records()).statements.blobSize.get(Buffer.from(digest.slice(7), "hex")) as
        { size: number } | undefined;
      if (found) return { size: Number(found.size) };
      const info = statSync(path, { throwIfNoEntry: false }); // inline (durable.ts)
      return info ? { size: info.size } : null;
    },

    async deleteBlob(digest: string) {
      await ctx.init();
      const path = blobPath(digest);
      if (!path) return;
      // Lazy: a delete a machine crash loses leaves the blob, which the next collection takes.
      const key = Buffer.from(digest.slice(7), "hex");
      await (await records()).write((s) => s.blobDelete.run(key), false);
      await rm(path, { force: true });
    },

    /**
     * In digest order, rows and files merged (a digest both, as a row stored beside a
     * file another process wrote, once): O(blobs) reads of 256 shard directories, each
     * sorted in O(n log n), and of the rows a page at a time.
     */
    async *listBlobs() {
      await ctx.init();
      const rows = rowDigests(await records());
      let nextRow = await rows.next();
      for (const shard of (await readdir(ctx.blobsDir)).sort()) {
        const names = await readdir(join(ctx.blobsDir, shard)).catch(() => [] as string[]);
        for (const name of names.sort()) {
          if (!BLOB_NAME_RE.test(name)) continue;
          for (; !nextRow.done && nextRow.value <= name; nextRow = await rows.next())
            if (nextRow.value < name) yield `sha256:${nextRow.value}`;
          yield `sha256:${name}`;
        }
      }
      for (; !nextRow.done; nextRow = await rows.next()) yield `sha256:${nextRow.value}`;
    },
  };
}

/** The hex digests of the small-blob rows in order, a page at a time. */
async function* rowDigests(db: RecordDb): AsyncGenerator<string> {
  let after: Uint8Array = Buffer.alloc(0);
  for (;;) {
    const page = db.statements.blobPage.all(after, ROW_PAGE) as Array<{ digest: Uint8Array }>;
    for (const { digest } of page)
      yield Buffer.from(digest.buffer, digest.byteOffset, digest.byteLength).toString("hex");
    if (page.length < ROW_PAGE) return;
    after = page.at(-1)!.digest;
  }
}
