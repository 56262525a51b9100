/**
 * An in-memory PackageStore: for unit tests and for embedding a throw-away depot.
 */
import { createHash, randomUUID } from "node:crypto";
import type { BlobInfo, ByteRange, PackageStore, PutBlobOptions, StoredRecord } from "../../depot/ports.js";
import { RunnerDepotError } from "../../errors.js";

/** Options of {@link createMemoryStore}. */
export interface MemoryStoreOptions {
  /** Size of the chunks getBlob yields, in bytes (default 64 KiB). */
  chunkBytes?: number;
}

/**
 * Creates an in-memory PackageStore. Records are deep-copied on the way in and out, so
 * callers never share state with the store; compare-and-swap is exact within the process.
 *
 * @example
 * const depot = createPackageRouter(createMemoryStore());
 */
export function createMemoryStore(options: MemoryStoreOptions = {}): PackageStore {
  const chunkBytes = options.chunkBytes ?? 64 * 1024;
  const blobs = new Map<string, Buffer>();
  const records = new Map<string, { json: string; revision: string }>();
  let closed = false;
  /** Watchers of announced writes: everyone shares this process, so none is ever missed. */
  const watchers = new Set<(key: string | null) => void>();

  function open(): void {
    if (closed) throw new RunnerDepotError("UNAVAILABLE", "The memory store is closed");
  }

  return {
    async putBlob(body: AsyncIterable<Uint8Array>, opts: PutBlobOptions = {}): Promise<BlobInfo> {
      open();
      const hash = createHash("sha256");
      const chunks: Buffer[] = [];
      let size = 0;
      for await (const chunk of body) {
        size += chunk.byteLength;
        if (opts.maxBytes !== undefined && size > opts.maxBytes) {
          throw new RunnerDepotError("TOO_LARGE", `Blob is larger than ${opts.maxBytes} bytes`);
        }
        hash.update(chunk);
        chunks.push(Buffer.from(chunk));
      }
      const digest = `sha256:${hash.digest("hex")}`;
      if (opts.expectedDigest !== undefined && opts.expectedDigest !== digest) {
        throw new RunnerDepotError("DIGEST_MISMATCH", `Content hashes to ${digest}, not ${opts.expectedDigest}`);
      }
      if (!blobs.has(digest)) blobs.set(digest, Buffer.concat(chunks, size));
      return { digest, size };
    },

    async getBlob(digest: string, range?: ByteRange): Promise<AsyncIterable<Uint8Array> | null> {
      open();
      const blob = blobs.get(digest);
      if (!blob) return null;
      const start = range?.start ?? 0;
      const end = Math.min(range?.end ?? blob.length - 1, blob.length - 1);
      return (async function* () {
        for (let at = start; at <= end; at += chunkBytes) {
          yield blob.subarray(at, Math.min(at + chunkBytes, end + 1));
        }
      })();
    },

    async statBlob(digest: string) {
      open();
      const blob = blobs.get(digest);
      return blob ? { size: blob.length } : null;
    },

    async deleteBlob(digest: string) {
      open();
      blobs.delete(digest);
    },

    async *listBlobs() {
      open();
      yield* [...blobs.keys()].sort();
    },

    async getRecord<T>(key: string): Promise<StoredRecord<T> | null> {
      open();
      const record = records.get(key);
      return record ? { value: JSON.parse(record.json) as T, revision: record.revision } : null;
    },

    async putRecord(key: string, value: unknown, cond: { ifRevision: string | null; announce?: boolean }) {
      open();
      const current = records.get(key);
      if ((current?.revision ?? null) !== cond.ifRevision) return null;
      const revision = randomUUID();
      records.set(key, { json: JSON.stringify(value), revision });
      if (cond.announce) for (const watcher of watchers) watcher(key);
      return revision;
    },

    watchRecords(listener: (key: string | null) => void) {
      watchers.add(listener);
      listener(null);
      return () => {
        watchers.delete(listener);
      };
    },

    async deleteRecord(key: string, cond?: { ifRevision: string | null }) {
      open();
      const current = records.get(key);
      if (!current) return false;
      if (cond && cond.ifRevision !== null && cond.ifRevision !== current.revision) return false;
      records.delete(key);
      return true;
    },

    async listRecords(prefix: string, page: { cursor?: string; limit?: number } = {}) {
      open();
      const keys = [...records.keys()]
        .filter((k) => k.startsWith(prefix) && (page.cursor === undefined || compareBytes(k, page.cursor) > 0))
        .sort(compareBytes);
      const limit = page.limit ?? 1000;
      const slice = keys.slice(0, limit);
      return keys.length > limit ? { keys: slice, cursor: slice.at(-1)! } : { keys: slice };
    },

    async close() {
      closed = true;
      watchers.clear();
    },
  };
}

function compareBytes(a: string, b: string): number {
  return Buffer.compare(Buffer.from(a), Buffer.from(b));
}
