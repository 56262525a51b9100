/**
 * The flush of records.db's write-ahead log for durable record writes, on libuv's thread
 * pool instead of inside the commit.
 * Why: docs/decisions/depot-publish-durability.md, "wal-sync.ts: flushing the WAL off the event loop".
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
   * The WAL's descriptor, (re)opened when the path names another inode; a new one's directory is flushed first
   * (every flush of that inode waits for it).
   * Why: docs/decisions/depot-publish-durability.md, "wal-sync.ts: createWalSync.descriptor".
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
      // The queued flush starts two turns of the event loop later, not at once.
      // Why: docs/decisions/depot-publish-durability.md, "wal-sync.ts: inside createWalSync.launch".
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
