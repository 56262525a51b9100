/**
 * Checkpoints of records.db's write-ahead log on a worker thread with its own connection,
 * instead of inside a commit on the event loop.
 *
 * SQLite's automatic checkpoint runs in the commit that takes the WAL past 1,000 pages:
 * it copies every page the WAL holds into the database file and (at `synchronous=NORMAL`)
 * fsyncs the WAL before and the database after, all on the committing thread. For the fs
 * store that was the event loop, every ~18 publishes at concurrency 8 (the WAL grows by
 * ~27 pages a publish), for the length of a copy and two flushes. Here the store's own
 * connection commits with the automatic checkpoint pushed out to BACKSTOP_PAGES (a bound
 * on the WAL's growth should this worker fail or fall behind), and after each commit
 * reads the WAL's frame count from the WAL index (`<db>-shm`, one 24-byte pread, below);
 * past CHECKPOINT_FRAMES it asks the worker for a checkpoint: a PASSIVE one, which takes
 * no lock (commits go on meanwhile) and copies what it finds, then a RESTART one, which
 * holds the write lock while it copies the few frames committed during the first and
 * flushes (commits wait for it on timers, record-db.ts, a few ms; the event loop runs on),
 * so the next commit writes the WAL from its start again, as after an automatic
 * checkpoint. A PASSIVE checkpoint alone never finds the moment when the WAL is copied
 * whole and no commit came since, under steady commits: the file would grow to the
 * backstop. The cadence is SQLite's own (1,000 frames); a first version checkpointed on a
 * 200 ms timer instead, which copied and flushed the database up to 3× as often at low
 * rates and measured slower at concurrency 1 and 8.
 *
 * Guarantees are SQLite's own: a checkpoint never changes what a reader sees or what
 * survives a crash (the WAL is flushed before any page is copied, the database before the
 * WAL may be reused), whichever connection runs it; with `synchronous=OFF`
 * (`unsafeNoSync`) it flushes nothing, like every other write of such a store. No
 * checkpoint starts after a failed WAL flush: it could copy WAL pages the kernel dropped
 * (read back stale from the disk) into the database.
 *
 * A store that never commits never starts the worker; an idle one leaves it asleep (no
 * timers, no polling). Costs: one thread and one connection per open store; per commit one
 * pread of the WAL index, O(1).
 */
import diagnostics_channel from "node:diagnostics_channel";
import { closeSync, openSync, readSync } from "node:fs";
import { endianness } from "node:os";
import { Worker } from "node:worker_threads";

/**
 * Events of the checkpoint worker, for tests and diagnostics (published only while someone
 * subscribes): `{ type: "checkpoint", db, copied, restarted }` after each checkpoint, with
 * the WAL frames it had copied into the database file `db` and whether the WAL is to be
 * written from its start again.
 */
const checkpointChannel = diagnostics_channel.channel("runner-depot:fs-checkpoint");

/** WAL frames past which a commit asks the worker for a checkpoint: SQLite's own default cadence. */
const CHECKPOINT_FRAMES = 1000;
/** The least time between the end of a checkpoint whose RESTART found the lock taken and the next try. */
const RETRY_MS = 50;
/** How long a RESTART checkpoint waits for the write lock and for readers (SQLite's busy handler, on the worker). */
const RESTART_WAIT_MS = 200;
/**
 * The store's own connection still checkpoints (inline) past this many WAL pages (4 KiB
 * each: 64 MiB), which only a stalled worker lets the WAL reach.
 */
export const BACKSTOP_PAGES = 16_000;
/**
 * Where the WAL index (`<db>-shm`, sqlite.org/walformat.html) keeps `mxFrame`, the frames
 * of the WAL since it was last written from its start: a 32-bit integer in the host's byte
 * order at byte 16 of the first copy of its header.
 */
const MX_FRAME_OFFSET = 16;

/** The checkpointer of one store's database (see {@link createCheckpointer}). */
export interface Checkpointer {
  /** Called after each commit: asks the worker for a checkpoint once the WAL holds CHECKPOINT_FRAMES. O(1): one pread. */
  committed(): void;
  /** Lets a checkpoint in progress end, then closes the worker's connection and the thread. */
  close(): Promise<void>;
}

/**
 * The worker's program (plain JavaScript, run with `eval`: no file to resolve next to the
 * built or the TypeScript sources). It loads node:sqlite without its ExperimentalWarning
 * (as sqlite.ts does), opens the database, and on each "checkpoint" runs a PASSIVE
 * checkpoint and then a RESTART one, and answers what it did. "close" closes.
 */
const WORKER_SOURCE = `
const { parentPort, workerData } = require("node:worker_threads");
const emitWarning = process.emitWarning;
process.emitWarning = function (warning, ...rest) {
  const text = typeof warning === "string" ? warning : warning && warning.message;
  if (/SQLite/i.test(String(text))) return;
  return emitWarning.call(process, warning, ...rest);
};
const { DatabaseSync } = process.getBuiltinModule("node:sqlite");
process.emitWarning = emitWarning;
const db = new DatabaseSync(workerData.path);
db.exec("PRAGMA busy_timeout = " + workerData.restartWaitMs + "; PRAGMA synchronous = " + (workerData.sync ? "NORMAL" : "OFF") + "; PRAGMA wal_autocheckpoint = 0");
const passive = db.prepare("PRAGMA wal_checkpoint(PASSIVE)");
const restart = db.prepare("PRAGMA wal_checkpoint(RESTART)");
parentPort.on("message", (message) => {
  if (message === "close") {
    db.close();
    parentPort.close();
    return;
  }
  let report = { copied: 0, restarted: false };
  try {
    report.copied = passive.get().checkpointed;
    const last = restart.get();
    report = { copied: last.checkpointed, restarted: last.busy === 0 };
  } catch {
    // An I/O error: the next commit past the threshold tries again, and the store's own
    // connection checkpoints past the backstop.
  }
  parentPort.postMessage(report);
});
`;

/** What the worker answers after a checkpoint. */
interface Report {
  /** WAL frames copied into the database file. */
  copied: number;
  /** Whether the WAL is to be written from its start again. */
  restarted: boolean;
}

/**
 * Starts the checkpoint worker of the database at `path` (already in WAL mode), flushing
 * as `sync` says. `healthy` is asked before each checkpoint: false once a WAL flush failed
 * (wal-sync.ts), when copying the WAL could copy pages the kernel dropped.
 *
 * @example
 * ```ts
 * const checkpointer = createCheckpointer("/var/lib/depot/records.db", true, () => true);
 * checkpointer.committed(); // after each commit of the store's connection
 * await checkpointer.close();
 * ```
 */
export function createCheckpointer(path: string, sync: boolean, healthy: () => boolean): Checkpointer {
  let worker: Worker | undefined;
  let exited: Promise<void> | undefined;
  /** A checkpoint asked of the worker and not answered yet. */
  let busy = false;
  /** Not before this time (ms since the epoch): after a RESTART that found the lock taken. */
  let notBefore = 0;
  let closed = false;
  let shm: number | undefined;
  const header = Buffer.alloc(MX_FRAME_OFFSET + 4);

  /** The WAL's frames since its start, from the WAL index; 0 when there is none. One pread. */
  function walFrames(): number {
    try {
      shm ??= openSync(`${path}-shm`, "r");
      if (readSync(shm, header, 0, header.length, 0) < header.length) return 0;
      return endianness() === "LE" ? header.readUInt32LE(MX_FRAME_OFFSET) : header.readUInt32BE(MX_FRAME_OFFSET);
    } catch {
      return 0;
    }
  }

  function start(): Worker {
    const started = new Worker(WORKER_SOURCE, {
      eval: true,
      workerData: { path, sync, restartWaitMs: RESTART_WAIT_MS },
    });
    // The thread never keeps the process alive; the store's close ends it.
    started.unref();
    started.on("message", (report: Report) => {
      busy = false;
      if (!report.restarted) notBefore = Date.now() + RETRY_MS;
      if (checkpointChannel.hasSubscribers)
        checkpointChannel.publish({ type: "checkpoint", db: path, copied: report.copied, restarted: report.restarted });
    });
    exited = new Promise((resolve) => started.once("exit", () => resolve()));
    started.on("error", () => {
      // A worker that failed (cannot open the database): the store's own connection
      // checkpoints past the backstop; a later commit starts a new worker.
      if (worker === started) worker = undefined;
      busy = false;
      notBefore = Date.now() + RETRY_MS;
    });
    return started;
  }

  return {
    committed() {
      if (closed || busy || Date.now() < notBefore || walFrames() < CHECKPOINT_FRAMES || !healthy()) return;
      worker ??= start();
      busy = true;
      worker.postMessage("checkpoint");
    },
    async close() {
      if (closed) return;
      closed = true;
      if (shm !== undefined) closeSync(shm);
      if (!worker) return;
      // Ref'd again while it closes: a process whose last work is awaiting this must not
      // exit under the await (the thread was unref'd, nothing else holds the loop).
      worker.ref();
      worker.postMessage("close");
      await exited;
      worker = undefined;
    },
  };
}
