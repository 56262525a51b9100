/**
 * The filesystem PackageStore: the depot's embedded default. This file composes it from
 * one file per concern: blobs.ts (with durable.ts) and records.ts (over record-db.ts, with
 * record-import.ts for stores written before the database), which share a
 * {@link FsStoreContext} made here.
 * Why: docs/decisions/depot-publish-durability.md, "store.ts: the fs store's layout".
 */
import { randomUUID } from "node:crypto";
import { mkdir, readdir, rm, stat } from "node:fs/promises";
import { join } from "node:path";
import type { PackageStore } from "../../depot/ports.js";
import { RunnerDepotError } from "../../errors.js";
import { createFsBlobs } from "./blobs.js";
import type { FsStoreContext } from "./store-context.js";
import { createDurableWrites } from "./durable.js";
import { openRecordDb, type RecordDb } from "./record-db.js";
import { importLegacyRecords } from "./record-import.js";
import { createFsRecords } from "./records.js";
import { createHashWorker } from "./hash-worker.js";

/** Options of {@link createFsStore}. */
export interface FsStoreOptions {
  /**
   * Ignored; still accepted so a host that passes it keeps working (no error, no warning).
   * Why: docs/decisions/depot-publish-durability.md, "store.ts: FsStoreOptions.staleLockMs".
   *
   * @deprecated No effect since records moved into records.db; will be removed in a
   * future major version. Use `lockTimeoutMs` to bound waits for another process's lock.
   */
  staleLockMs?: number;
  /**
   * How long a write waits for the record database's write lock (held by another process) before failing UNAVAILABLE
   * (default 30 s; a commit lasts a millisecond or so).
   */
  lockTimeoutMs?: number;
  /**
   * Skip fsync (tests on tmpfs only; a crash may then lose acknowledged writes). Never in a
   * process sharing the directory with one that syncs: its checkpoints copy the other's
   * commits into records.db without flushing it, and once the WAL restarts over them the
   * other's WAL flush no longer covers them.
   */
  unsafeNoSync?: boolean;
  /**
   * WAL frames (4 KiB pages) past which writes answer STORE_UNAVAILABLE (503) while another
   * process's read transaction keeps records.db's WAL from being reset (default 64,000,
   * about 263 MB; docs/decisions/depot-publish-durability.md, "An outside reader").
   */
  walCapFrames?: number;
  /**
   * Hash uploads of 1 MiB or more on a worker thread of the store, beside the socket reads
   * and the disk writes (default false: on the calling thread as they arrive, which
   * measured faster and cheaper on 2 cores). Why and figures:
   * docs/decisions/depot-blob-uploads.md, "Figures of the fs upload work".
   */
  hashOnWorker?: boolean;
}

/**
 * Temp files older than this are removed at start as orphans of killed writers; younger ones may be a live process's.
 */
const ORPHAN_AGE_MS = 3_600_000;

/**
 * Creates a PackageStore in a directory (created when missing). Blobs are not signable, so
 * the depot streams them itself.
 *
 * @example
 * ```ts
 * import { createFsStore } from "runner-depot/adapters/fs";
 * import { createPackageRouter } from "runner-depot/depot";
 *
 * const store = createFsStore("/var/lib/depot");
 * const depot = createPackageRouter(store);
 * // … serve depot; on shutdown, after the server stopped:
 * await store.close?.();
 * ```
 */
export function createFsStore(dir: string, options: FsStoreOptions = {}): PackageStore {
  const sync = !options.unsafeNoSync;
  const lockTimeoutMs = options.lockTimeoutMs ?? 30_000;
  let db: RecordDb | undefined;
  // The blobs directory is made through `durable` (its entry fsynced, durable.ts): bound late, setUp runs on first use.
  const ctx = createContext(
    dir,
    sync,
    (path) => durable.ensureDir(path),
    async () => {
      db = await openRecordDb(join(dir, "records.db"), {
        sync,
        lockTimeoutMs,
        walCapFrames: options.walCapFrames,
      });
      try {
        await importLegacyRecords(db, join(dir, "records"), sync);
      } catch (error) {
        await db.close();
        db = undefined;
        throw error;
      }
    },
  );
  const durable = createDurableWrites(ctx);
  const hashes = options.hashOnWorker === true ? createHashWorker() : undefined;
  // After the first open, a call goes straight to the database: no promise hop.
  const records = async () => (db && !ctx.isClosed() ? db : (await ctx.init(), db!));
  return {
    ...createFsBlobs(ctx, durable, records, hashes),
    ...createFsRecords(records),
    /** One WAL flush covers every commit before it: blob rows and records, lazy and deferred ones (record-db.ts). */
    async syncRecords() {
      await (await records()).sync();
    },
    /** Waits for record batches in flight, then closes the database and the directory handles. */
    async close() {
      const opening = ctx.close();
      await opening?.catch(() => undefined);
      await db?.close();
      await durable.closeHandles();
      await hashes?.close();
    },
  };
}

/** The context the parts share, with the store's one-time setup and its closed flag. */
function createContext(
  dir: string,
  sync: boolean,
  makeDir: (path: string) => Promise<void>,
  openRecords: () => Promise<void>,
): FsStoreContext & { close(): Promise<void> | undefined } {
  const blobsDir = join(dir, "blobs", "sha256");
  const tmpDir = join(dir, "tmp");
  let ready: Promise<void> | undefined;
  let closed = false;
  return {
    blobsDir,
    tmpDir,
    sync,
    init() {
      if (closed) return Promise.reject(new RunnerDepotError("UNAVAILABLE", "The fs store is closed"));
      ready ??= setUp(dir, blobsDir, tmpDir, makeDir).then(openRecords);
      // A failed open (a damaged record file, a lock not had in time) is tried again by the next call.
      ready.catch(() => (ready = undefined));
      return ready;
    },
    isClosed: () => closed,
    close() {
      closed = true;
      return ready;
    },
    tmpPath: (kind = "") => join(tmpDir, `${kind}${process.pid}-${randomUUID()}`),
  };
}

/** Creates the layout and removes orphans of killed writers: O(files in tmp/), once per store. */
async function setUp(
  dir: string,
  blobsDir: string,
  tmpDir: string,
  makeDir: (path: string) => Promise<void>,
): Promise<void> {
  // Blobs are renamed into shards below it: its entry (and its parents', when made) must be on disk.
  await makeDir(blobsDir);
  await mkdir(tmpDir, { recursive: true });
  // Only old orphans: another live process may be writing fresh ones.
  for (const name of await readdir(tmpDir)) {
    const path = join(tmpDir, name);
    const info = await stat(path).catch(() => null);
    if (info && Date.now() - info.mtimeMs > ORPHAN_AGE_MS) await rm(path, { force: true });
  }
  // Second names of record files the file layout kept while it replaced them: nothing
  // reads them since the records moved into records.db.
  await rm(join(dir, "graves"), { recursive: true, force: true });
}
