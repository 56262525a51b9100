/**
 * Graves of the fs store: the file a swap replaces is kept alive under a name in
 * `graves/` until its rename is done, and freed afterwards by one unlink at a time.
 *
 * Why: a rename over a file that drops its last link frees the inode inside the rename,
 * while it still holds both directories' locks (and, across directories, the
 * filesystem's rename mutex): Linux's do_renameat2 puts the replaced dentry before it
 * unlocks. Freeing a file's blocks on a filesystem mounted with online `discard` (ext4
 * without a journal, as on the host measured) waits for the discard, 0.3-3 ms and more, so
 * every other create, link or unlink in `tmp/` and in the record's directory waited too
 * (perf: the event loop off the CPU in down_write under openat and unlink while a pool
 * thread sat in blkdev_issue_discard under do_renameat2). An unlink frees the inode after
 * it unlocked its directory, so the graves are freed that way, and one at a time, so the
 * discards hold at most one of libuv's threads, not all four while fsyncs wait.
 *
 * A grave is a hard link: taking one is a link(2) (no new inode, no data), inline. Graves
 * have a directory of their own, `graves/`, not `tmp/`: one fewer writer on `tmp/`'s lock,
 * which every temp file's create and unlink takes, and an open of the store can remove
 * every grave whatever its age (store.ts), since nothing ever reads one, while it keeps
 * young temp files (a live process's uploads). A crash leaves at most a few there.
 */
import { randomUUID } from "node:crypto";
import { linkSync } from "node:fs";
import { unlink } from "node:fs/promises";
import { join } from "node:path";
import type { FsStoreContext } from "./context.js";

/** Graves waiting beyond this many make a swap wait for the backlog (bounded memory, and no discard debt without end). */
const MAX_BACKLOG = 4096;

/** The graves of one store (see {@link createGraves}). */
export interface Graves {
  /** Hard-links `file` to a new grave, inline; null when there is none (`file` is gone, or the link was refused). O(1). */
  keep(file: string): string | null;
  /** Queues the unlink of `grave`; resolves at once unless the backlog is over its bound. O(1). */
  release(grave: string): Promise<void>;
  /** Waits until every queued grave is unlinked (the store's close). */
  drain(): Promise<void>;
}

/**
 * Makes the graves of one store: a queue drained by one unlink in flight at a time.
 *
 * @example
 * ```ts
 * const grave = graves.keep(recordFile); // before the rename over recordFile
 * await rename(tempFile, recordFile);    // frees nothing under the directory locks
 * if (grave) await graves.release(grave); // freed later, outside any directory lock
 * ```
 */
export function createGraves(ctx: FsStoreContext): Graves {
  const queue: string[] = [];
  let reaping: Promise<void> | undefined;
  /** Resolved when the backlog falls under its bound again (only while it is over). */
  let roomWaiters: Array<() => void> = [];

  async function reap(): Promise<void> {
    for (let grave = queue.shift(); grave !== undefined; grave = queue.shift()) {
      // Quietly: a grave another process's open swept (it removes graves of any age) is gone already.
      await unlink(grave).catch(() => undefined);
      if (queue.length < MAX_BACKLOG && roomWaiters.length > 0) {
        const waiters = roomWaiters;
        roomWaiters = [];
        for (const resolve of waiters) resolve();
      }
    }
    reaping = undefined;
  }

  return {
    keep(file) {
      const grave = join(ctx.gravesDir, `${process.pid}-${randomUUID()}`);
      try {
        linkSync(file, grave);
        return grave;
      } catch {
        // No grave, whatever the reason (ENOENT: no file to keep; EMLINK: the file is at
        // its filesystem's link limit, as a store snapshotted by hard links can be; ENOSPC
        // or EDQUOT: graves/ could not grow): a grave only spares the rename a free, so the
        // swap goes on as it did before graves, and the rename frees the file itself.
        return null;
      }
    },
    release(grave) {
      queue.push(grave);
      reaping ??= reap();
      if (queue.length <= MAX_BACKLOG) return Promise.resolve();
      return new Promise<void>((resolve) => roomWaiters.push(resolve));
    },
    async drain() {
      while (reaping) await reaping;
    },
  };
}
