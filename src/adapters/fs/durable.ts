/**
 * Durable blob writes of the fs store: directory fsyncs shared by concurrent writers (group commit) over
 * directory handles kept open, and mkdir -p remembered per store (a directory's entry fsynced in its parent
 * the first time). A filesystem that cannot fsync a directory at all is tolerated; a failed fsync is not
 * (`isDirSyncUnsupported`). Records live in records.db (record-db.ts), which flushes through SQLite's WAL.
 * Why: docs/decisions/depot-publish-durability.md, "durable.ts: group-committed directory fsyncs".
 */
import { constants as fsConstants, mkdirSync } from "node:fs";
import { mkdir, open, type FileHandle } from "node:fs/promises";
import { dirname, resolve } from "node:path";
import type { FsStoreContext } from "./store-context.js";

/** Directory handles kept open for fsyncs (see `syncDirNow`). */
const DIR_HANDLES = 64;
/** Beyond this many remembered directories, `ensureDir` forgets them all (bounded memory). */
const MADE_DIRS = 100_000;

/** The durable-write operations of one fs store (see {@link createDurableWrites}). */
export interface DurableWrites {
  /** Flushes a directory's entries to disk; concurrent callers share one fsync. No-op without sync. */
  fsyncDir(path: string): Promise<void>;
  /** mkdir -p, skipped for a directory this store made before. */
  ensureDir(path: string): Promise<void>;
  /** Closes the directory handles kept open (the store's close). */
  closeHandles(): Promise<void>;
}

/** Makes the durable-write operations of one store; their caches live as long as it. */
export function createDurableWrites(ctx: FsStoreContext): DurableWrites {
  const dirs = createDirectorySync(ctx);

  /**
   * Blob shard directories known to exist (and, with sync, their entries on disk): a write skips its mkdir (directories
   * are never removed while open). O(1).
   */
  const madeDirs = new Set<string>();
  /** The first write into a shard this store makes: later writers into it wait for its entry's fsync. */
  const making = new Map<string, Promise<void>>();
  function remember(path: string): void {
    if (madeDirs.size > MADE_DIRS) madeDirs.clear();
    madeDirs.add(path);
  }
  async function ensureDir(path: string): Promise<void> {
    if (madeDirs.has(path)) return;
    if (!ctx.sync) {
      mkdirSync(path, { recursive: true });
      remember(path);
      return;
    }
    let pending = making.get(path);
    if (!pending) {
      // The shard's entry in its parent (and theirs, for directories made with it) is
      // fsynced before a blob renamed into it counts as durable: once per shard and store,
      // even when it existed (a process that made it may have died before its fsync). A
      // failed fsync is tried again by the next write.
      const first = mkdirSync(path, { recursive: true });
      pending = dirs.syncMade(path, first).then(() => remember(path));
      const settled = pending.finally(() => making.delete(path));
      settled.catch(() => undefined);
      making.set(path, pending);
    }
    await pending;
  }

  return { fsyncDir: dirs.fsyncDir, ensureDir, closeHandles: dirs.close };
}

/** What directory fsyncs need of their owner: whether to sync at all, and whether it is closing. */
type DirSyncContext = Pick<FsStoreContext, "sync" | "isClosed">;

/** Directory fsyncs of one owner (see {@link createDirectorySync}). */
interface DirectorySync {
  /** Flushes a directory's entries to disk; concurrent callers share one fsync. No-op without sync. */
  fsyncDir(path: string): Promise<void>;
  /**
   * mkdir -p, then (with sync) an fsync of the parent of `path` and of every directory it
   * created, so their entries survive a crash. O(directories created + 1) fsyncs: once per
   * store, not per write.
   */
  makeDir(path: string): Promise<void>;
  /**
   * With sync, fsyncs the parent of `path` and of every directory above it that a mkdir -p
   * made (`first`: what mkdir returned), for a caller that made it itself. No-op without sync.
   */
  syncMade(path: string, first: string | undefined): Promise<void>;
  /** Closes the directory handles kept. */
  close(): Promise<void>;
}

/**
 * Directory fsyncs shared by concurrent callers (group commit) over directory handles kept
 * open (none while `ctx.isClosed()` says true), for an owner other than the blob store (the fs
 * log store's jobs directory, the fs log archive's). `close()` closes the handles kept.
 * A filesystem that cannot fsync a directory is tolerated as {@link isDirSyncUnsupported}
 * says (once, with a warning); any other failure (EIO...) rejects the caller.
 *
 * @example
 * const dirs = createDirectorySync({ sync: true, isClosed: () => false });
 * await dirs.makeDir(jobsDir); // its entry (and any parent made) survives a machine crash
 * renameSync(tmp, target);
 * await dirs.fsyncDir(dirname(target)); // the rename survives a machine crash
 */
export function createDirectorySync(ctx: DirSyncContext): DirectorySync {
  const syncDirNow = createDirSyncer(ctx);
  // One-shot handles: these are synced once per store, not kept open.
  const syncMade = (path: string, first: string | undefined) =>
    ctx.sync ? syncEntries(path, first, (parent) => syncDirNow.sync(parent, false)) : Promise.resolve();
  async function makeDir(dir: string): Promise<void> {
    // Absolute, as mkdir names the first directory it made.
    const path = resolve(dir);
    await syncMade(path, await mkdir(path, { recursive: true }));
  }
  return { fsyncDir: createGroupFsync(ctx, syncDirNow.sync), makeDir, syncMade, close: syncDirNow.close };
}

/**
 * Fsyncs the directories holding the entries of `path` and of every directory mkdir -p made above it (`first`,
 * what mkdir returned: the topmost it made; undefined when it made none), deepest first.
 * Why: docs/decisions/depot-publish-durability.md, "durable.ts: syncEntries".
 */
function syncEntries(path: string, first: string | undefined, syncDir: (dir: string) => Promise<void>): Promise<void> {
  const parents: string[] = [];
  for (let made = path; ; made = dirname(made)) {
    parents.push(dirname(made));
    if (first === undefined || made === first || dirname(made) === made) break;
  }
  return parents.reduce((done, parent) => done.then(() => syncDir(parent)), Promise.resolve());
}

/**
 * True for the errors by which a platform or filesystem says it cannot fsync a directory
 * (not that the disk failed), which a directory fsync may ignore, as PostgreSQL's
 * fsync_fname_ext does: EINVAL (Linux, on filesystems with no fsync for directories: some
 * FUSE and network ones), EBADF (platforms that refuse fsync on a read-only descriptor),
 * EISDIR (a platform that cannot open a directory at all), and EPERM on Windows only
 * (what libuv makes of FlushFileBuffers refusing a directory handle). EIO, ENOSPC, EROFS
 * and the rest are failures. O(1).
 *
 * @example
 * isDirSyncUnsupported(Object.assign(new Error("fsync"), { code: "EINVAL" })) // true
 * isDirSyncUnsupported(Object.assign(new Error("fsync"), { code: "EIO" }))    // false
 */
function isDirSyncUnsupported(error: unknown): boolean {
  const code = (error as NodeJS.ErrnoException | null)?.code;
  return (
    code === "EINVAL" || code === "EBADF" || code === "EISDIR" || (code === "EPERM" && process.platform === "win32")
  );
}

/**
 * Directory fsyncs in flight, per directory.
 * Why: docs/decisions/depot-publish-durability.md, "durable.ts: createGroupFsync".
 */
function createGroupFsync(
  ctx: DirSyncContext,
  syncDirNow: (path: string) => Promise<void>,
): (path: string) => Promise<void> {
  const dirSyncs = new Map<string, { running: Promise<void>; queued?: Promise<void> }>();

  function fsyncDir(path: string): Promise<void> {
    if (!ctx.sync) return Promise.resolve();
    const state = dirSyncs.get(path);
    if (!state) {
      const running = syncDirNow(path).finally(() => settleDirSync(path, running));
      dirSyncs.set(path, { running });
      return running;
    }
    state.queued ??= state.running.catch(() => undefined).then(() => syncDirNow(path));
    return state.queued;
  }

  /** When the running sync ends, the queued one (if any) becomes the running one. */
  function settleDirSync(path: string, finished: Promise<void>): void {
    const state = dirSyncs.get(path);
    if (!state || state.running !== finished) return;
    if (!state.queued) {
      dirSyncs.delete(path);
      return;
    }
    const running = state.queued.finally(() => settleDirSync(path, running));
    running.catch(() => undefined);
    dirSyncs.set(path, { running });
  }

  return fsyncDir;
}

/**
 * Open handles of recently synced directories (most recent last), so a directory fsync is one call, not open,
 * fsync and close: the blob shards recently written stay open.
 * Why: docs/decisions/depot-publish-durability.md, "durable.ts: createDirSyncer".
 */
function createDirSyncer(ctx: DirSyncContext): {
  sync(path: string, keep?: boolean): Promise<void>;
  close(): Promise<void>;
} {
  const dirHandles = new Map<string, Promise<FileHandle>>();
  /** Set once the filesystem refused a directory fsync as unsupported: no more are tried. */
  let unsupported = false;

  async function syncOnce(path: string): Promise<void> {
    const once = await open(path, fsConstants.O_RDONLY);
    await once.sync().finally(() => once.close());
  }

  async function syncKept(path: string): Promise<void> {
    let handle = dirHandles.get(path);
    if (handle) dirHandles.delete(path);
    else {
      const opening = open(path, fsConstants.O_RDONLY);
      opening.catch(() => {
        if (dirHandles.get(path) === opening) dirHandles.delete(path);
      });
      handle = opening;
    }
    dirHandles.set(path, handle);
    if (dirHandles.size > DIR_HANDLES) {
      const [oldest, evicted] = dirHandles.entries().next().value as [string, Promise<FileHandle>];
      dirHandles.delete(oldest);
      void evicted.then((h) => h.close()).catch(() => undefined);
    }
    await (await handle).sync();
  }

  /** Forgets the handle kept for `path` (closed once a sync still on it ends). O(1). */
  function forget(path: string): void {
    const handle = dirHandles.get(path);
    if (!handle) return;
    dirHandles.delete(path);
    void handle.then((h) => h.close()).catch(() => undefined);
  }

  async function sync(path: string, keep = true): Promise<void> {
    if (unsupported) return;
    try {
      // Closing: no handle is kept past close(), so open one for this sync alone.
      await (keep && !ctx.isClosed() ? syncKept(path) : syncOnce(path));
      return;
    } catch (error) {
      if (!isDirSyncUnsupported(error)) throw error;
      forget(path);
    }
    try {
      await syncOnce(path);
    } catch (error) {
      if (!isDirSyncUnsupported(error)) throw error;
      if (unsupported) return;
      unsupported = true;
      const code = (error as NodeJS.ErrnoException).code;
      process.emitWarning(
        `fsync of the directory ${path} is not supported here (${code}): directory fsyncs are skipped from now on, so a rename or a new file may not survive a machine crash`,
        {
          code: "RUNNER_DEPOT_DIR_FSYNC_UNSUPPORTED",
        },
      );
    }
  }

  async function close(): Promise<void> {
    const handles = [...dirHandles.values()];
    dirHandles.clear();
    await Promise.allSettled(handles.map(async (h) => (await h).close()));
  }

  return { sync, close };
}
