/**
 * Small blobs of the fs store: bodies up to {@link SMALL_BLOB_BYTES} are rows of records.db (`small_blobs`,
 * digest → bytes) instead of files. A one-file publish stores two such blobs (the file and the manifest); as
 * files each cost a temp file, an fsync, a rename and a directory fsync, as rows they join the records' group
 * commit and its one WAL flush (docs/decisions/depot-publish-durability.md, "Records in SQLite").
 * Why: docs/decisions/depot-publish-durability.md, "small-blobs.ts: why small blobs are rows".
 */
import type { BlobReader, ByteRange } from "../../depot/ports.js";
import { readBodyHead, type BodyHead } from "../../depot/store/body-head.js";
import { RunnerDepotError } from "../../errors.js";

/** Bodies up to this many bytes are stored as rows. */
const SMALL_BLOB_BYTES = 16 * 1024;

/**
 * Reads `body` until it ends or passes SMALL_BLOB_BYTES. TOO_LARGE as soon as `maxBytes` is passed.
 * O(SMALL_BLOB_BYTES + one chunk) memory.
 */
export function readHead(body: AsyncIterable<Uint8Array>, maxBytes: number | undefined): Promise<BodyHead> {
  return readBodyHead(body, SMALL_BLOB_BYTES, maxBytes);
}

/** A row's bytes (or a range of them, ends inclusive) as the one chunk getBlob answers. */
export async function* rowChunks(data: Uint8Array, range?: ByteRange): AsyncIterable<Uint8Array> {
  const part = range ? data.subarray(range.start, range.end + 1) : data;
  if (part.byteLength > 0) yield part;
}

/** A BlobReader over a row's bytes (copied out at the open, so a delete meanwhile changes nothing). */
export function rowReader(data: Uint8Array): BlobReader {
  return {
    size: data.byteLength,
    async read(buffer, offset, length, position) {
      if (position >= data.byteLength) return 0;
      const part = data.subarray(position, Math.min(position + length, data.byteLength));
      buffer.set(part, offset);
      return part.byteLength;
    },
    async close() {},
  };
}
