/**
 * The depot's port: content-addressed blobs plus small JSON records with
 * compare-and-swap. All depot logic (transactions, commit, catalog, deltas) is
 * written on these primitives so that each adapter stays small.
 */

/** A byte range, both ends inclusive (as in HTTP `Range`). */
export interface ByteRange {
  start: number;
  end: number;
}

/** A stored blob's identity. `digest` is `sha256:<64 lower-case hex>`. */
export interface BlobInfo {
  digest: string;
  size: number;
}

/** Options of {@link BlobStore.putBlob}. */
export interface PutBlobOptions {
  /** When given, the body must hash to it, else DIGEST_MISMATCH and nothing is kept. */
  expectedDigest?: string;
  /** Refuse (TOO_LARGE, nothing kept) a body longer than this many bytes. */
  maxBytes?: number;
}

/** Content-addressed blob storage. */
export interface BlobStore {
  /** Streams the body in, hashing as it goes; idempotent for equal content. */
  putBlob(body: AsyncIterable<Uint8Array>, options?: PutBlobOptions): Promise<BlobInfo>;
  /** The blob's bytes (or a range of them), or null when absent. */
  getBlob(digest: string, range?: ByteRange): Promise<AsyncIterable<Uint8Array> | null>;
  /** The blob's size, or null when absent. */
  statBlob(digest: string): Promise<{ size: number } | null>;
  /** Removes a blob; absent is fine. */
  deleteBlob(digest: string): Promise<void>;
  /** Every stored digest (garbage collection). */
  listBlobs(): AsyncIterable<string>;
  /** A time-limited URL the client may fetch the blob from, when the backend can sign. */
  signBlobUrl?(digest: string, options?: { expiresInSeconds?: number; filename?: string }): Promise<string | null>;
  close?(): Promise<void>;
}

/** A stored record and its revision (opaque; changes on every write). */
export interface StoredRecord<T = unknown> {
  value: T;
  revision: string;
}

/** Small JSON records with compare-and-swap. */
export interface RecordStore {
  getRecord<T = unknown>(key: string): Promise<StoredRecord<T> | null>;
  /**
   * Writes when the current revision equals `ifRevision` (null: only when absent).
   * Returns the new revision, or null when it lost the race. Never partially writes.
   */
  putRecord(key: string, value: unknown, cond: { ifRevision: string | null }): Promise<string | null>;
  /** Deletes when the revision matches (null: unconditionally). True when deleted. */
  deleteRecord(key: string, cond?: { ifRevision: string | null }): Promise<boolean>;
  /** Keys starting with `prefix`, in byte order, paged. */
  listRecords(prefix: string, page?: { cursor?: string; limit?: number }): Promise<{ keys: string[]; cursor?: string }>;
  close?(): Promise<void>;
}

/** The whole port the depot router takes. */
export interface PackageStore extends BlobStore, RecordStore {
  close?(): Promise<void>;
}
