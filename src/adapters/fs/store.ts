/**
 * The filesystem PackageStore: the depot's embedded default. This file composes it from
 * one file per concern: blobs.ts, records.ts, listing.ts (with record-keys.ts), locks.ts
 * and durable.ts, which share a {@link FsStoreContext} made here.
 *
 * Layout under `dir`:
 * - `blobs/sha256/<2 hex>/<64 hex>`: content-addressed blobs, immutable once renamed in;
 * - `records/<seg>/…/<last seg>~`: one JSON file per record key (`{ key, revision, value }`),
 *   segments percent-encoded so any key maps to a safe name;
 * - `tmp/`: files being written; a kill leaves at most an orphan here, never a torn blob or record;
 * - `graves/`: second names of record files a swap replaced, until they are unlinked
 *   (graves.ts); every open of the store empties it.
 *
 * Guarantees: every blob and record appears whole or not at all (write to `tmp/`, fsync,
 * rename, fsync the directory). Compare-and-swap is exact between concurrent calls in one
 * process (a per-key promise chain) and between processes sharing `dir` on one host or a
 * POSIX filesystem (a per-key lock file, created whole by hard-linking a written temp
 * file, held only for the read-compare-rename; a create-only write needs none: it
 * hard-links its written temp file into place, which fails when the name exists).
 * A lock left by a killed process is broken when its owner is gone (same host: the pid is
 * dead or belongs to a new incarnation) or it is older than `staleLockMs`.
 */
import { randomUUID } from "node:crypto";
import { mkdir, readdir, rm, stat } from "node:fs/promises";
import { join } from "node:path";
import type { PackageStore } from "../../depot/ports.js";
import { RunnerDepotError } from "../../errors.js";
import { createFsBlobs } from "./blobs.js";
import type { FsStoreContext } from "./context.js";
import { createDurableWrites } from "./durable.js";
import { createGraves } from "./graves.js";
import { createFsListing } from "./listing.js";
import { createLocks } from "./locks.js";
import { createFsRecords } from "./records.js";

/** Options of {@link createFsStore}. */
export interface FsStoreOptions {
  /** A lock older than this is broken whoever holds it (default 30 s; a critical section lasts milliseconds). */
  staleLockMs?: number;
  /** How long a compare-and-swap waits for a key's lock before failing UNAVAILABLE (default 30 s). */
  lockTimeoutMs?: number;
  /** Skip fsync (tests on tmpfs only; a crash may then lose acknowledged writes). */
  unsafeNoSync?: boolean;
}

/** Temp files older than this are removed at start as orphans of killed writers; younger ones may be a live process's. */
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
  const ctx = createContext(dir, !options.unsafeNoSync);
  const graves = createGraves(ctx);
  const durable = createDurableWrites(ctx, graves);
  const locks = createLocks(ctx, { staleLockMs: options.staleLockMs ?? 30_000, lockTimeoutMs: options.lockTimeoutMs ?? 30_000 });
  return {
    ...createFsBlobs(ctx, durable),
    ...createFsRecords(ctx, durable, locks),
    ...createFsListing(ctx),
    /** Waits for record work in flight, then releases the directory handles and the owner file. */
    async close() {
      ctx.close();
      await locks.drain();
      await graves.drain();
      await durable.closeHandles();
      await locks.releaseOwner();
    },
  };
}

/** The context the parts share, with the store's one-time setup and its closed flag. */
function createContext(dir: string, sync: boolean): FsStoreContext & { close(): void } {
  const blobsDir = join(dir, "blobs", "sha256");
  const recordsDir = join(dir, "records");
  const tmpDir = join(dir, "tmp");
  const gravesDir = join(dir, "graves");
  let ready: Promise<void> | undefined;
  let closed = false;
  return {
    blobsDir,
    recordsDir,
    tmpDir,
    gravesDir,
    sync,
    init() {
      if (closed) return Promise.reject(new RunnerDepotError("UNAVAILABLE", "The fs store is closed"));
      ready ??= setUp(blobsDir, recordsDir, tmpDir, gravesDir);
      return ready;
    },
    isClosed: () => closed,
    close() {
      closed = true;
    },
    tmpPath: (kind = "") => join(tmpDir, `${kind}${process.pid}-${randomUUID()}`),
  };
}

/** Creates the layout and removes orphans of killed writers: O(files in tmp/ and graves/), once per store. */
async function setUp(blobsDir: string, recordsDir: string, tmpDir: string, gravesDir: string): Promise<void> {
  await mkdir(blobsDir, { recursive: true });
  await mkdir(recordsDir, { recursive: true });
  await mkdir(tmpDir, { recursive: true });
  await mkdir(gravesDir, { recursive: true });
  // Only old orphans: another live process may be writing fresh ones.
  for (const name of await readdir(tmpDir)) {
    const path = join(tmpDir, name);
    const info = await stat(path).catch(() => null);
    if (info && Date.now() - info.mtimeMs > ORPHAN_AGE_MS) await rm(path, { force: true });
  }
  // Graves of any age (graves.ts): nothing reads one, and a live process's reaper ignores
  // one gone already.
  for (const name of await readdir(gravesDir)) await rm(join(gravesDir, name), { force: true });
}
