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
  /**
   * The body's length in bytes, when the caller knows it up front (an upload's
   * `Content-Length`). With `expectedDigest`, it lets a store send the bytes in one request
   * to their final place (S3: a `PutObject` whose signed payload hash is the digest, which
   * the server checks). A store using it refuses a body of another length (BAD_REQUEST)
   * and keeps nothing; stores may ignore it (the fs store sizes its work by it only).
   */
  size?: number;
  /**
   * As {@link WriteCondition.deferSync}: the caller calls {@link RecordStore.syncRecords}
   * before it relies on the blob surviving a machine crash. A store may then resolve
   * without flushing only a blob that its syncRecords covers and that it keeps in the order
   * of its records (the fs store: a blob of up to 16 KiB, a row of records.db; `composeStore` over
   * PostgreSQL records: a row of their `small_blobs`); any other
   * blob (a file) it makes durable before resolving, as without this option. Stores
   * without syncRecords ignore it.
   */
  deferSync?: boolean;
}

/**
 * Random access to one stored blob, read into the caller's buffers (see
 * {@link BlobStore.openBlob}). The bytes stay readable until `close()`, even if the blob
 * is deleted meanwhile.
 */
export interface BlobReader {
  /** The blob's length in bytes. */
  readonly size: number;
  /**
   * Reads up to `length` bytes at `position` into `buffer` from `offset`; resolves to the count read (0 at the end).
   */
  read(buffer: Uint8Array, offset: number, length: number, position: number): Promise<number>;
  close(): Promise<void>;
}

/** Content-addressed blob storage. */
export interface BlobStore {
  /** Streams the body in, hashing as it goes; idempotent for equal content. */
  putBlob(body: AsyncIterable<Uint8Array>, options?: PutBlobOptions): Promise<BlobInfo>;
  /** The blob's bytes (or a range of them), or null when absent. */
  getBlob(digest: string, range?: ByteRange): Promise<AsyncIterable<Uint8Array> | null>;
  /**
   * Optional: opens a blob for reads into buffers the caller owns and reuses, so moving
   * its bytes to a socket or a hash allocates nothing per chunk (the fs store offers it;
   * the depot falls back to `getBlob` without it). Null when absent, or when the store does not offer this
   * blob for such reads (the S3 store: only its local copies of this process's uploads); the depot then reads it
   * with `getBlob`.
   */
  openBlob?(digest: string): Promise<BlobReader | null>;
  /** The blob's size, or null when absent. */
  statBlob(digest: string): Promise<{ size: number } | null>;
  /** Removes a blob; absent is fine. */
  deleteBlob(digest: string): Promise<void>;
  /**
   * Every stored digest (garbage collection), in byte order of the digest (every store here lists so; the
   * small-blob tier of `composeStore` merges it with its rows on that order, each digest once).
   */
  listBlobs(): AsyncIterable<string>;
  /**
   * Optional: blobs of up to this many bytes are never signed (`signBlobUrl` answers null for them), so the
   * depot serves them itself and keeps no archive copy that small for redirects (composeStore over PostgreSQL
   * records: such blobs are rows). Absent: any blob may be signed.
   */
  readonly unsignedMaxBytes?: number;
  /** A time-limited URL the client may fetch the blob from, when the backend can sign. */
  signBlobUrl?(digest: string, options?: { expiresInSeconds?: number; filename?: string }): Promise<string | null>;
  close?(): Promise<void>;
}

/** A stored record and its revision (opaque; changes on every write). */
export interface StoredRecord<T = unknown> {
  value: T;
  revision: string;
}

/** The condition of a record write. */
export interface WriteCondition {
  /** The revision the record must have; null: it must be absent (create-only), or for a delete, any. */
  ifRevision: string | null;
  /**
   * The depot sets this on writes whose loss in a machine crash (power loss, kernel panic)
   * is safe: index and clean-up writes (reference notes, a freed slot, a dropped claim,
   * a finished transaction's working records, an open transaction's records that a
   * confirmed write replaces or the commit re-derives: docs/decisions/depot-publish-durability.md).
   * A store may then skip flushing the write to stable storage (the fs store commits a
   * batch of only such writes without a WAL fsync); a reader must still never see it torn
   * (a store whose writes can tear reads a torn create as absent). A process crash loses
   * nothing either way. Stores may ignore it.
   */
  lazy?: boolean;
  /**
   * With `lazy`: a machine crash may lose the whole record, not only this write. The depot
   * sets it on the count and touch of a transaction that is still open, since an open
   * transaction may be lost whole (depot-api.md §9). A store may then write it without
   * any flush at all, even where that could leave the record torn; a torn record must read
   * as absent. Stores may ignore it (the fs store treats it as `lazy`: its records.db
   * never tears a write).
   */
  losable?: boolean;
  /**
   * The depot sets this on writes other processes should learn of promptly (a new entry of
   * the change sequence, which moves the catalog's ETag). A store offering
   * {@link RecordStore.watchRecords} tells every watcher, in any process, of each such
   * write once it is visible; other stores ignore it.
   */
  announce?: boolean;
  /**
   * Called at most once, with whether the write was applied, as soon as its outcome is visible to every reader
   * of the store, which may be before it is on stable storage (the fs store answers a durable write after its
   * commit's WAL flush, and calls this at the commit). A store calling it promises that what a machine crash
   * keeps is a prefix of its writes in the order they became visible (the fs store: one WAL, replayed in order
   * up to its first torn frame), so a write made after this call can never survive a crash without this one.
   * Stores whose writes are durable when visible (PostgreSQL, memory) do not call it; callers then go on at the
   * promise's resolution.
   * Why: docs/decisions/depot-publish-durability.md, "ports.ts: WriteCondition.onVisible".
   */
  onVisible?: (applied: boolean) => void;
  /**
   * The caller calls {@link RecordStore.syncRecords} before it relies on this write
   * surviving a machine crash (before it answers a request: depot/transactions/ordered-writes.ts). Set only on
   * a store offering syncRecords, which may then commit the write without a flush of its
   * own and resolve once its outcome is visible (the fs store commits it as a lazy write).
   * Stores without syncRecords ignore it (their writes are durable when they resolve).
   */
  deferSync?: boolean;
}

/**
 * Blobs a record store keeps beside its records (see {@link RecordStore.smallBlobs}): whole small bodies, already
 * hashed by the caller, keyed by their digest. Content-addressed and idempotent like a {@link BlobStore}.
 */
export interface SmallBlobStore {
  /** Bodies up to this many bytes belong here; larger ones go to the blob store. */
  readonly maxBytes: number;
  /**
   * Stores `bytes` under `digest` (their sha256, computed by the caller); a no-op when present. With
   * `deferSync`, as {@link PutBlobOptions.deferSync}: the store's syncRecords makes it durable.
   */
  putSmallBlob(digest: string, bytes: Uint8Array, options?: { deferSync?: boolean }): Promise<void>;
  /** The bytes, or null when absent here. */
  getSmallBlob(digest: string): Promise<Uint8Array | null>;
  /** The size, or null when absent here. */
  statSmallBlob(digest: string): Promise<number | null>;
  /** Removes it; absent is fine. True when it was here. */
  deleteSmallBlob(digest: string): Promise<boolean>;
  /** Every digest kept here, in byte order of the digest (so a caller can merge it with another sorted list). */
  listSmallBlobs(): AsyncIterable<string>;
}

/** Small JSON records with compare-and-swap. */
export interface RecordStore {
  getRecord<T = unknown>(key: string): Promise<StoredRecord<T> | null>;
  /**
   * Writes when the current revision equals `ifRevision` (null: only when absent).
   * Returns the new revision, or null when it lost the race. Never partially writes.
   * See {@link WriteCondition.lazy} for writes a machine crash may lose.
   */
  putRecord(key: string, value: unknown, cond: WriteCondition): Promise<string | null>;
  /** Deletes when the revision matches (null: unconditionally). True when deleted. */
  deleteRecord(key: string, cond?: WriteCondition): Promise<boolean>;
  /** Keys starting with `prefix`, in byte order, paged. */
  listRecords(prefix: string, page?: { cursor?: string; limit?: number }): Promise<{ keys: string[]; cursor?: string }>;
  /**
   * Optional: calls `listener(key)` after each `announce` write (see {@link WriteCondition.announce}) by any
   * process sharing the store, once it is readable. `listener(null)` means "writes may have been missed; look
   * again": it is called when the watch starts listening and whenever it loses and regains its feed, and from
   * one `null` until the next every announced write is reported. Returns an unsubscribe.
   * Why: docs/decisions/depot-publish-durability.md, "ports.ts: RecordStore.watchRecords".
   */
  watchRecords?(listener: (key: string | null) => void): () => void;
  /**
   * Optional: resolves once every write of this store that was visible when it was called (its own, other
   * callers', lazy and `deferSync` ones alike) is on stable storage; rejects when that cannot be promised (the
   * fs store after a failed flush, which also fails every later write). The fs store offers it (one WAL flush,
   * shared by every caller meanwhile), and so does the PostgreSQL records store (its lazy and deferred writes
   * commit asynchronously; docs/decisions/depot-scale-out.md); stores durable when visible need not.
   * Why: docs/decisions/depot-publish-durability.md, "ports.ts: RecordStore.syncRecords".
   */
  syncRecords?(): Promise<void>;
  /**
   * Optional: small blobs kept beside the records (the PostgreSQL records store: a table of its schema).
   * `composeStore` puts a body of up to `maxBytes` there instead of into its blob store, and reads there first:
   * a small blob then costs one record-store round trip, joins the records' flush, and never reaches S3.
   * Why: docs/decisions/depot-scale-out.md, "Small blobs in PostgreSQL".
   */
  readonly smallBlobs?: SmallBlobStore;
  close?(): Promise<void>;
}

/** The whole port the depot router takes. */
export interface PackageStore extends BlobStore, RecordStore {
  close?(): Promise<void>;
}
