/**
 * Joins a blob store and a record store into the one PackageStore the depot router
 * takes, e.g. blobs on S3 and records on PostgreSQL.
 */
import type { BlobStore, PackageStore, RecordStore } from "../ports.js";
import { tierSmallBlobs } from "./small-blob-tier.js";

/** Options of {@link composeStore}. */
export interface ComposeStoreOptions {
  /** Where content-addressed blobs live. */
  blobs: BlobStore;
  /** Where records with compare-and-swap live. */
  records: RecordStore;
}

/**
 * Creates a PackageStore from a BlobStore and a RecordStore; `close()` closes both. When the record store keeps
 * small blobs ({@link RecordStore.smallBlobs}: the PostgreSQL one, up to 16 KiB), bodies up to its size go
 * there and never reach the blob store (unless it keeps small blobs itself: the fs store); reads look there
 * first (small-blob-tier.ts).
 *
 * @example
 * const store = composeStore({
 *   blobs: createS3BlobStore({ bucket: "depot", clientConfig: { region: "eu-west-1" } }),
 *   records: createPostgresRecords({ connectionString: process.env.DATABASE_URL }),
 * });
 * const depot = createPackageRouter(store);
 */
export function composeStore(options: ComposeStoreOptions): PackageStore {
  const { records } = options;
  // A blob store with a flush of its own (the fs store) already keeps small blobs as rows of its records: it keeps them.
  const ownSync = (options.blobs as Partial<RecordStore>).syncRecords;
  const tiered = records.smallBlobs !== undefined && typeof ownSync !== "function";
  const blobs: BlobStore = tiered ? tierSmallBlobs(records.smallBlobs!, options.blobs) : options.blobs;
  let closing: Promise<void> | null = null;
  const store: PackageStore = {
    putBlob: (body, putOptions) => blobs.putBlob(body, putOptions),
    getBlob: (digest, range) => blobs.getBlob(digest, range),
    statBlob: (digest) => blobs.statBlob(digest),
    deleteBlob: (digest) => blobs.deleteBlob(digest),
    listBlobs: () => blobs.listBlobs(),
    getRecord: (key) => records.getRecord(key),
    putRecord: (key, value, cond) => records.putRecord(key, value, cond),
    deleteRecord: (key, cond) => records.deleteRecord(key, cond),
    listRecords: (prefix, page) => records.listRecords(prefix, page),
    close() {
      closing ??= Promise.all([options.blobs.close?.(), records.close?.()]).then(() => {});
      return closing;
    },
  };
  // Optional capabilities are offered only when the underlying store has them, so the router can tell.
  // syncRecords only when the blob store has none of its own: its promise covers one store's
  // writes in one order, and a blob store that flushes on request (the fs store) would keep a
  // deferred blob unflushed. A blob store without it (S3) ignores deferSync: its blobs are
  // durable when their put resolves, so the records' sync covers the rest.
  if (records.syncRecords && typeof ownSync !== "function") {
    const syncRecords = records.syncRecords.bind(records);
    store.syncRecords = () => syncRecords();
  }
  // The blob store's own, past the rows too: it declines (null) what it cannot open, rows included, and the
  // depot then reads that with getBlob (ports.ts).
  if (options.blobs.openBlob) {
    const openBlob = options.blobs.openBlob.bind(options.blobs);
    store.openBlob = (digest) => openBlob(digest);
  }
  if (records.watchRecords) {
    const watchRecords = records.watchRecords.bind(records);
    store.watchRecords = (listener) => watchRecords(listener);
  }
  if (blobs.signBlobUrl) {
    const sign = blobs.signBlobUrl.bind(blobs);
    store.signBlobUrl = (digest, signOptions) => sign(digest, signOptions);
  }
  // Rows are never signed: the depot serves a small archive from its items and makes no copy of it.
  if (tiered) return { ...store, unsignedMaxBytes: records.smallBlobs!.maxBytes };
  return store;
}
