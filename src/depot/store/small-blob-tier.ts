/**
 * The blob half of `composeStore` when its record store keeps small blobs ({@link RecordStore.smallBlobs}, the
 * PostgreSQL records store): a body of up to `maxBytes` becomes a row there, a larger one goes to the blob store
 * (S3). Reads look in the rows first, then in the blob store, so blobs a store wrote before it had the rows
 * still read. A small blob is served by the depot itself (`signBlobUrl` answers null for it).
 * Why: docs/decisions/depot-scale-out.md, "Small blobs in PostgreSQL".
 */
import { createHash } from "node:crypto";
import { RunnerDepotError } from "../../errors.js";
import type { BlobInfo, BlobStore, ByteRange, PutBlobOptions, SmallBlobStore } from "../ports.js";
import { readBodyHead, replayBodyHead, type BodyHead } from "./body-head.js";
import { RecentBlobs } from "./recent-blobs.js";

/** Two digest streams in byte order, merged, each digest once. O(1) memory. */
async function* mergeSorted(a: AsyncIterable<string>, b: AsyncIterable<string>): AsyncIterable<string> {
  const ia = a[Symbol.asyncIterator]();
  const ib = b[Symbol.asyncIterator]();
  let na = await ia.next();
  let nb = await ib.next();
  while (!na.done || !nb.done) {
    if (nb.done || (!na.done && na.value < nb.value)) {
      yield na.value as string;
      na = await ia.next();
    } else if (na.done || nb.value < na.value) {
      yield nb.value;
      nb = await ib.next();
    } else {
      yield na.value;
      na = await ia.next();
      nb = await ib.next();
    }
  }
}

/** A copy of a row's bytes, or of a range of them (ends inclusive), as the one chunk getBlob answers. */
async function* rowChunks(data: Uint8Array, range?: ByteRange): AsyncIterable<Uint8Array> {
  // A copy (at most 16 KiB): the caller may reuse the chunk's memory, and `data` may be RecentBlobs' own.
  const part = Buffer.from(range ? data.subarray(range.start, range.end + 1) : data);
  if (part.byteLength > 0) yield part;
}

/** Bytes of small blobs kept in memory for reads (RecentBlobs): 4 MiB, about 240 blobs of 16 KiB. */
const RECENT_BYTES = 4 * 1024 * 1024;
/**
 * How long a kept blob is served without asking the table again: another replica may delete it (GC), and this
 * one cannot tell; a read then sees the deleted bytes for at most this long, as if it had started that much
 * earlier. A commit's two reads of a blob its addition wrote fall well within it.
 */
const RECENT_MAX_AGE_MS = 5_000;

/** Options of {@link tierSmallBlobs}. */
export interface TierOptions {
  /** The clock of the recent bytes' age (ms); default Date.now. */
  now?: () => number;
}

/**
 * Blob operations over small rows and a blob store (the BlobStore half of a composed store).
 *
 * @example
 * const blobs = tierSmallBlobs(records.smallBlobs!, createS3BlobStore({ bucket: "depot" }));
 * await blobs.putBlob(body, { deferSync: true }); // ≤ 16 KiB: one INSERT, no S3 request
 */
export function tierSmallBlobs(
  small: SmallBlobStore,
  large: BlobStore,
  options: TierOptions = {},
): Omit<BlobStore, "close" | "openBlob"> {
  const recent = new RecentBlobs(RECENT_BYTES, RECENT_MAX_AGE_MS, options.now);
  /** Stores a whole small body as a row. O(size): one hash, one INSERT. */
  async function putSmall(head: BodyHead, options: PutBlobOptions): Promise<BlobInfo> {
    const bytes = Buffer.concat(head.chunks, head.size);
    if (options.size !== undefined && options.size !== head.size)
      throw new RunnerDepotError("BAD_REQUEST", `body is ${head.size} bytes, not its declared ${options.size}`);
    const digest = `sha256:${createHash("sha256").update(bytes).digest("hex")}`;
    if (options.expectedDigest !== undefined && options.expectedDigest !== digest)
      throw new RunnerDepotError("DIGEST_MISMATCH", `Content hashes to ${digest}, not ${options.expectedDigest}`);
    const mark = recent.mark();
    await small.putSmallBlob(digest, bytes, { deferSync: options.deferSync });
    recent.put(digest, bytes, mark);
    return { digest, size: head.size };
  }

  const tier: Omit<BlobStore, "close" | "openBlob"> = {
    async putBlob(body, options = {}) {
      // A declared length past the threshold streams straight to the blob store (S3: one PutObject to its key).
      if (options.size !== undefined && options.size > small.maxBytes) return large.putBlob(body, options);
      const head = await readBodyHead(body, small.maxBytes, options.maxBytes);
      return head.rest ? large.putBlob(replayBodyHead(head), options) : putSmall(head, options);
    },

    async getBlob(digest, range) {
      let data = recent.get(digest);
      if (!data) {
        const mark = recent.mark();
        data = (await small.getSmallBlob(digest)) ?? undefined;
        if (!data) return large.getBlob(digest, range);
        recent.put(digest, data, mark);
      }
      if (range && range.start >= data.byteLength && data.byteLength > 0)
        throw new RunnerDepotError("RANGE_NOT_SATISFIABLE", `range ${range.start}-${range.end} is outside the blob`);
      return rowChunks(data, range);
    },

    /** One row lookup, then (not a row) the blob store's stat. */
    async statBlob(digest) {
      const size = await small.statSmallBlob(digest);
      return size !== null ? { size } : large.statBlob(digest);
    },

    /** Both places: a store from before the rows may hold the same digest in the blob store too. */
    async deleteBlob(digest) {
      recent.delete(digest);
      try {
        await small.deleteSmallBlob(digest);
        await large.deleteBlob(digest);
      } finally {
        // Again once the row is gone: a read that saw it before then caches nothing (RecentBlobs.mark).
        recent.delete(digest);
      }
    },

    listBlobs: () => mergeSorted(small.listSmallBlobs(), large.listBlobs()),
  };
  if (large.signBlobUrl) {
    const sign = large.signBlobUrl.bind(large);
    // A row has no URL of its own: null, and the depot serves the bytes itself.
    tier.signBlobUrl = async (digest, options) =>
      (await small.statSmallBlob(digest)) !== null ? null : sign(digest, options);
  }
  return tier;
}
