/**
 * What the parts of the fs store (blobs.ts, records.ts, listing.ts, locks.ts, durable.ts)
 * share: the directory layout, the sync mode and the store's lifecycle. store.ts makes one
 * per store; the parts take it instead of importing each other, so no import circles.
 */
export interface FsStoreContext {
  /** `blobs/sha256`: content-addressed blobs, `<2 hex>/<64 hex>`. */
  readonly blobsDir: string;
  /** `records`: one file per record key (see record-keys.ts). */
  readonly recordsDir: string;
  /** `tmp`: files being written, renamed or hard-linked into place when whole. */
  readonly tmpDir: string;
  /** `graves`: second names of replaced record files until they are unlinked (graves.ts). */
  readonly gravesDir: string;
  /** False under `unsafeNoSync`: no fsync at all (tests on tmpfs only). */
  readonly sync: boolean;
  /** Creates the layout once (and sweeps old temp files); rejects UNAVAILABLE once closed. */
  init(): Promise<void>;
  /** True once close() began. */
  isClosed(): boolean;
  /** A fresh name in `tmp/`; `kind` marks files that are not an upload or record in flight. */
  tmpPath(kind?: string): string;
}
