/**
 * What the parts of the fs store (blobs.ts, records.ts, durable.ts) share: the directory
 * layout, the sync mode and the store's lifecycle. store.ts makes one per store; the parts
 * take it instead of importing each other, so no import circles.
 */
export interface FsStoreContext {
  /** `blobs/sha256`: content-addressed blobs, `<2 hex>/<64 hex>`. */
  readonly blobsDir: string;
  /** `tmp`: blob files being written, renamed into place when whole. */
  readonly tmpDir: string;
  /** False under `unsafeNoSync`: no fsync at all (tests on tmpfs only). */
  readonly sync: boolean;
  /** Creates the layout and opens the record database once; rejects UNAVAILABLE once closed. */
  init(): Promise<void>;
  /** True once close() began. */
  isClosed(): boolean;
  /** A fresh name in `tmp/`; `kind` marks files that are not an upload in flight. */
  tmpPath(kind?: string): string;
}
