/**
 * The flush of records.db's write-ahead log for durable record writes, on libuv's thread
 * pool instead of inside the commit.
 *
 * SQLite's `synchronous=FULL` fsyncs the WAL inside COMMIT, on the calling thread: the
 * event loop. With the store's commits at `synchronous=NORMAL` (the WAL written, not
 * flushed) the store flushes the WAL itself: `fdatasync` of the same file through its
 * own descriptor, on the pool, and a durable write's promise resolves after a flush that
 * started after its commit. The WAL only grows by appended frames until a checkpoint,
 * and a checkpoint in NORMAL mode flushes the WAL before it copies and the database after,
 * so one flush of the file covers every commit before it (lazy ones too): concurrent
 * batches share it (at most one running and one queued, as directory fsyncs do in
 * durable.ts; the queued one starts two turns of the event loop after the running one
 * ends, so the next writes of the requests that one answered join it). Meanwhile the event loop serves other requests and commits more batches.
 *
 * As with FULL's flush, a commit is on stable storage before its promise resolves; unlike
 * it, other readers may see the commit during the flush (the file layout's records were
 * readable between their rename and their directory's fsync alike).
 *
 * SQLite deletes the WAL only when the last connection closes, and this store's stays
 * open, so the file stays one inode; still, each flush checks the path's inode (one
 * inline stat) and reopens when it changed. A WAL file this store has not flushed before
 * gets its directory fsynced once too, so its name survives a crash with its content.
 *
 * A failed flush (EIO, ENOSPC from the device) fails every write waiting on it, and every
 * later one: the kernel may have dropped the WAL pages it could not write (marking them
 * clean), so a later fdatasync can succeed without them, and since WAL frames are
 * checksummed in a chain, recovery after a crash stops at the first lost frame and drops
 * every commit after it too. Measured on a loop-mounted ext4 whose backing file ran out
 * of space: three writes failed ENOSPC, the next three resolved after a clean flush, and a
 * copy of the disk then held none of the six. So the flusher stays failed ({@link WalSync.failure})
 * and the store refuses writes until a restarted process opens it again.
 */
import { closeSync, constants as fsConstants, fdatasync, fsync, openSync, statSync } from "node:fs";
import diagnostics_channel from "node:diagnostics_channel";
import { dirname, resolve } from "node:path";
import { RunnerDepotError } from "../../errors.js";

/**
 * Events of the WAL flusher, for tests and diagnostics (published only while someone
 * subscribes): `{ type: "flushed", wal }` when an fdatasync of the WAL at path `wal` ended.
 */
export const walFlushChannel = diagnostics_channel.channel("runner-depot:fs-wal-flush");

/**
 * Flushes of the WAL running at once; a caller past them joins the one queued after them.
 * One: 3 at once measured no faster at concurrency 8 (87.7 / 74.6 vs 78.2 / 88.0
 * publishes/s, alternating runs, 00:22 UTC, load 5.8-6.1), and one flush covers more.
 */
const MAX_FLUSHES = 1;

/**
 * WALs whose flush failed in this process, with the error: a store opened again on the
 * same directory in this process refuses writes too (its descriptor, opened after the
 * error, would not report it). Grows by one entry per failed WAL path: a handful at most.
 */
const failedWals = new Map<string, RunnerDepotError>();

/** Fsyncs a directory (on the pool), the fsync itself through `flushing` (which judges its failure). */
async function syncDir(path: string, flushing: (call: Promise<void>) => Promise<void>): Promise<void> {
  const fd = openSync(path, fsConstants.O_RDONLY);
  try {
    await flushing(new Promise<void>((resolve, reject) => fsync(fd, (error) => (error ? reject(error) : resolve()))));
  } finally {
    closeSync(fd);
  }
}

/** The WAL flusher of one connection (see {@link createWalSync}). */
export interface WalSync {
  /** Resolves once a flush of the WAL that started after this call has finished. O(1) to join. */
  sync(): Promise<void>;
  /** The error every write answers once a flush of the WAL or its directory failed; undefined until then. */
  failure(): RunnerDepotError | undefined;
  /** Waits for flushes in flight and closes the descriptor. */
  close(): Promise<void>;
}

/** Makes the WAL flusher of the database at `dbPath` (its WAL is `<dbPath>-wal`). */
export function createWalSync(dbPath: string): WalSync {
  const walPath = `${dbPath}-wal`;
  let file: { fd: number; ino: number; named: Promise<void> } | undefined;
  let inFlight = 0;
  /** The flush that starts when the running one ends, joined by every caller meanwhile. */
  let queued: { promise: Promise<void>; resolve(): void; reject(error: unknown): void } | undefined;
  /** Set by the first failed fsync or fdatasync: from then on every flush fails with it. */
  let failed: RunnerDepotError | undefined = failedWals.get(resolve(walPath));

  /** Runs an fsync-like call; its failure fails the flusher for good (see the top of this file). */
  async function flushing(call: Promise<void>): Promise<void> {
    try {
      await call;
    } catch (error) {
      if (!failed) {
        const code = (error as NodeJS.ErrnoException).code ?? String(error);
        const message = `A flush of ${walPath} failed (${code}): writes since may not be on disk, and a later flush would not write them again. The fs store refuses writes; check the disk, then restart the process.`;
        failed = new RunnerDepotError("UNAVAILABLE", message, { cause: error });
        failedWals.set(resolve(walPath), failed);
      }
      throw failed;
    }
  }

  /**
   * The WAL's descriptor, (re)opened when the path names another inode; a new one's
   * directory is flushed first (every flush of that inode waits for it). Null without a
   * WAL: nothing was committed into one since the last connection checkpointed and
   * removed it, so there is nothing to flush.
   */
  async function descriptor(): Promise<number | null> {
    const ino = statSync(walPath, { throwIfNoEntry: false })?.ino;
    if (ino === undefined) return null;
    if (file?.ino !== ino) {
      if (file) closeSync(file.fd);
      file = { fd: openSync(walPath, fsConstants.O_RDONLY), ino, named: syncDir(dirname(walPath), flushing) };
    }
    const current = file;
    try {
      await current.named;
    } catch (error) {
      // The directory could not be opened (EMFILE, say): the next flush tries again.
      if (file === current) {
        closeSync(current.fd);
        file = undefined;
      }
      throw error;
    }
    return current.fd;
  }

  async function flushNow(): Promise<void> {
    if (failed) throw failed;
    const fd = await descriptor();
    if (fd === null) return;
    await flushing(
      new Promise<void>((resolve, reject) => fdatasync(fd, (error) => (error ? reject(error) : resolve()))),
    );
    if (walFlushChannel.hasSubscribers) walFlushChannel.publish({ type: "flushed", wal: walPath });
  }

  /** Starts a flush; when it ends, the queued one (if any) starts. */
  function launch(): Promise<void> {
    inFlight++;
    return flushNow().finally(() => {
      if (!queued) {
        inFlight--;
        return;
      }
      const go = () => {
        inFlight--;
        const next = queued!;
        queued = undefined;
        launch().then(next.resolve, next.reject);
      };
      // The queued flush starts two turns of the event loop later, not at once: the writes
      // the ended flush answered go on to their requests' next writes, whose batch commits
      // in the next turn (record-db.ts) and so joins this flush instead of waiting behind it.
      // Only when a flush was queued, so a lone writer (concurrency 1) never waits for it.
      // Measured at concurrency 8 with fsync (01:03–01:07 UTC, load 2–5): more publishes/s
      // in 8 of 9 pairs (e.g. 207.7 → 220.8, 211.3 → 218.9, 204.3 → 210.7/s) and 0.4 ms less
      // server CPU per publish in the quiet ones; concurrency 1 unchanged (58.0 / 60.6 →
      // 55.5 / 61.0/s); a 1 ms timer instead was no better.
      setImmediate(() => setImmediate(go));
    });
  }

  function sync(): Promise<void> {
    if (inFlight < MAX_FLUSHES) return launch();
    if (!queued) {
      let resolve!: () => void;
      let reject!: (error: unknown) => void;
      const promise = new Promise<void>((res, rej) => {
        resolve = res;
        reject = rej;
      });
      queued = { promise, resolve, reject };
    }
    return queued.promise;
  }

  return {
    sync,
    failure: () => failed,
    async close() {
      while (inFlight > 0 || queued) await new Promise((resolve) => setTimeout(resolve, 1));
      if (file) closeSync(file.fd);
      file = undefined;
    },
  };
}
