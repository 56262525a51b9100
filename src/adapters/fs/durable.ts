/**
 * Durable writes of the fs store: files written whole and synced, renamed into place, and
 * directory fsyncs shared by concurrent writers (group commit) over directory handles kept
 * open. Everything a blob or record write needs so a crash never leaves a torn file or an
 * acknowledged write that is lost.
 *
 * The small calls of a record write (open, write of a few hundred bytes, close, link,
 * unlink of a temp name or a lock, mkdir, and the record reads in records.ts) run inline on
 * the calling thread; the flushes (fsync, fdatasync), which wait for the disk, and the
 * calls that free an old file's blocks (a grave's unlink, graves.ts, and a record's delete)
 * go through libuv's thread pool, and so do renames (a swap's rename over a record). A pool round trip (queue, wake a worker, post the result
 * back, wake the loop) cost more CPU than a small call: a one-file publish makes about
 * 150 of them, and moving them inline took the server's CPU per publish from 10.7 to 8.5
 * ms with fsync (7.8 to 5.6 ms without; decisions/depot-publish-durability.md). Freeing
 * blocks is another matter: on a filesystem mounted with online discard (ext4 `discard`
 * without a journal, as on the host measured) it issues the discard in the call, 0.26 ms
 * median, 3 ms p90, 16 ms at worst per rename over a record there; inline, the event loop
 * would wait for it. A rename over a record would even wait for it holding both
 * directories' locks, so a swap keeps the replaced file linked in a grave until its
 * rename is done and unlinks it afterwards (graves.ts). On a local filesystem the inline calls take microseconds; on a
 * network filesystem each blocks the event loop for a round trip, the price there.
 */
import { closeSync, constants as fsConstants, fsync as fsyncCallback, mkdirSync, openSync, writeSync } from "node:fs";
import { open, rename, type FileHandle } from "node:fs/promises";
import type { FsStoreContext } from "./context.js";
import { unlinkQuietly } from "./files.js";
import type { Graves } from "./graves.js";

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
  /** Writes a new (small) file whole and (unless unsafeNoSync, or `flush` is false) flushes it to disk. Inline but for the flush. */
  writeSynced(path: string, data: string | Uint8Array, flush?: boolean): Promise<void>;
  /**
   * Replaces `file` with `data` whole: written and (unless `flush` is false) synced under a
   * temp name, then renamed; `afterRename` (the directory's fsync of a durable swap) runs
   * before the replaced file is freed (see the function).
   */
  writeAtomically(file: string, data: string | Uint8Array, flush?: boolean, afterRename?: () => Promise<void>): Promise<void>;
  /** Closes the directory handles kept open (the store's close). */
  closeHandles(): Promise<void>;
}

/** Makes the durable-write operations of one store; their caches live as long as it. */
export function createDurableWrites(ctx: FsStoreContext, graves: Graves): DurableWrites {
  const syncDirNow = createDirSyncer(ctx);
  const fsyncDir = createGroupFsync(ctx, syncDirNow.sync);

  /** Record directories known to exist: a write skips its mkdir (directories are never removed while open). O(1). */
  const madeDirs = new Set<string>();
  async function ensureDir(path: string): Promise<void> {
    if (madeDirs.has(path)) return;
    mkdirSync(path, { recursive: true });
    if (madeDirs.size > MADE_DIRS) madeDirs.clear();
    madeDirs.add(path);
  }

  async function writeSynced(path: string, data: string | Uint8Array, flush = true): Promise<void> {
    const fd = openSync(path, "wx");
    try {
      const bytes = typeof data === "string" ? Buffer.from(data) : data;
      for (let at = 0; at < bytes.byteLength; ) at += writeSync(fd, bytes, at, bytes.byteLength - at);
      if (ctx.sync && flush) await fsyncFd(fd);
    } finally {
      closeSync(fd);
    }
  }

  async function writeAtomically(file: string, data: string | Uint8Array, flush = true, afterRename?: () => Promise<void>): Promise<void> {
    const tmp = ctx.tmpPath();
    await writeSynced(tmp, data, flush);
    // The replaced file lives on in a grave until the rename is done, so the rename frees
    // nothing (and waits for no discard) under its directories' locks (graves.ts).
    const grave = graves.keep(file);
    try {
      // Through the pool: across directories it takes the filesystem's rename mutex,
      // which other programs' renames may hold while they free blocks.
      await rename(tmp, file);
    } catch (error) {
      unlinkQuietly(tmp); // quietly: the rename's error is the one to report
      if (grave !== null) await graves.release(grave);
      throw error;
    }
    try {
      // The grave is released only after `afterRename` (a durable swap's directory fsync):
      // on a filesystem without a journal, which orders nothing, the old file's free could
      // otherwise reach the disk (with any neighbouring inode's flush) before the entry that
      // names the new file, and fsck would then drop the record's name: both values lost.
      await afterRename?.();
    } finally {
      if (grave !== null) await graves.release(grave);
    }
  }

  return { fsyncDir, ensureDir, writeSynced, writeAtomically, closeHandles: syncDirNow.close };
}

/**
 * Directory fsyncs in flight, per directory. A caller needs a sync that starts after its
 * rename, so it joins the queued one (or queues one) behind a sync already running:
 * concurrent writers into one directory (`records/trans`, `records/pkg`, a sequence
 * shard) share one fsync instead of one each (group commit). At most two syncs per
 * directory exist at once, however many writers wait: O(1) per call.
 */
function createGroupFsync(ctx: FsStoreContext, syncDirNow: (path: string) => Promise<void>): (path: string) => Promise<void> {
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
 * Open handles of recently synced directories (most recent last), so a directory fsync
 * is one call, not open, fsync and close: the few directories every publish writes
 * (`records/trans`, `records/pkg`, a sequence shard, blob shards) stay open. At most
 * DIR_HANDLES; the least recently used is evicted in O(1) (a Map keeps insertion order,
 * and a use re-inserts). FileHandle.close waits for a sync still running on the handle.
 */
function createDirSyncer(ctx: FsStoreContext): { sync(path: string): Promise<void>; close(): Promise<void> } {
  const dirHandles = new Map<string, Promise<FileHandle>>();

  async function sync(path: string): Promise<void> {
    if (ctx.isClosed()) {
      // Closing: no handle is kept past close(), so open one for this sync alone.
      const once = await open(path, fsConstants.O_RDONLY);
      await once.sync().finally(() => once.close());
      return;
    }
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

  async function close(): Promise<void> {
    const handles = [...dirHandles.values()];
    dirHandles.clear();
    await Promise.allSettled(handles.map(async (h) => (await h).close()));
  }

  return { sync, close };
}

/** fsync(2) of an open descriptor on libuv's thread pool (it waits for the disk). */
function fsyncFd(fd: number): Promise<void> {
  return new Promise<void>((resolve, reject) => fsyncCallback(fd, (error) => (error ? reject(error) : resolve())));
}
