/**
 * Checkpoints of records.db's write-ahead log on a worker thread with its own connection,
 * instead of inside a commit on the event loop.
 * Why: docs/decisions/depot-publish-durability.md, "checkpointer.ts: why checkpoints run in a worker".
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
/** The longest wait between tries, reached by doubling while a reader keeps the WAL from being reset. */
const MAX_RETRY_MS = 5_000;
/**
 * WAL frames (4 KiB pages; 64,000 ≈ 256 MiB) past which writes are refused (STORE_UNAVAILABLE)
 * until a checkpoint resets the WAL: only another process's long read transaction keeps it
 * from being reset (docs/decisions/depot-publish-durability.md, "An outside reader").
 */
export const WAL_CAP_FRAMES = 64_000;
/** The least time between two warnings that a reader blocks the checkpoints. */
const WARN_EVERY_MS = 60_000;
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
  /**
   * Called after each commit: asks the worker for a checkpoint once the WAL holds CHECKPOINT_FRAMES. O(1): one pread.
   */
  committed(): void;
  /**
   * Null, or why a write is refused: the WAL holds more than the cap and no checkpoint has
   * reset it since (a reader holds it). Asks for a checkpoint then, so the refusals end
   * once the reader does. O(1): one pread.
   */
  refusal(): string | null;
  /** Lets a checkpoint in progress end, then closes the worker's connection and the thread. */
  close(): Promise<void>;
}

/**
 * The worker's program (plain JavaScript, run with `eval`: no file to resolve next to the built or the TypeScript
 * sources).
 * Why: docs/decisions/depot-publish-durability.md, "checkpointer.ts: WORKER_SOURCE".
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
  let report = { copied: 0, restarted: false, pinned: false, frames: 0 };
  try {
    const first = passive.get();
    report.copied = first.checkpointed;
    report.frames = first.log;
    // A reader on an older snapshot keeps frames from being copied: a RESTART would hold
    // the write lock waiting for it (commits stall) and fail anyway.
    if (first.checkpointed < first.log) report.pinned = true;
    else {
      const last = restart.get();
      report = { copied: last.checkpointed, restarted: last.busy === 0, pinned: false, frames: last.log };
    }
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
  /** Whether a reader's older snapshot kept frames from being copied (no RESTART was tried). */
  pinned: boolean;
  /** Frames in the WAL. */
  frames: number;
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
export function createCheckpointer(
  path: string,
  sync: boolean,
  healthy: () => boolean,
  capFrames = WAL_CAP_FRAMES,
): Checkpointer {
  let worker: Worker | undefined;
  let exited: Promise<void> | undefined;
  /** A checkpoint asked of the worker and not answered yet. */
  let busy = false;
  /** Not before this time (ms since the epoch): after a RESTART that found the lock taken. */
  let notBefore = 0;
  let closed = false;
  let shm: number | undefined;
  /** Tries in a row that did not reset the WAL: the wait before the next doubles with each. */
  let failures = 0;
  /** A RESTART succeeded and no commit came since: the WAL index still counts the old frames. */
  let reset = false;
  let warnedAt = -Infinity;
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
      if (report.restarted) {
        failures = 0;
        reset = true;
      } else {
        notBefore = Date.now() + Math.min(MAX_RETRY_MS, RETRY_MS * 2 ** failures++);
      }
      if (report.pinned && Date.now() - warnedAt >= WARN_EVERY_MS) {
        warnedAt = Date.now();
        const mib = ((report.frames * 4096) / 2 ** 20).toFixed(0);
        process.emitWarning(
          `${path}: another connection's read transaction (a backup, an sqlite3 shell?) keeps the WAL from being checkpointed; it holds ${report.frames} frames (~${mib} MiB) and writes are refused past ${capFrames} until that transaction ends`,
          { code: "RUNNER_DEPOT_FS_CHECKPOINT_BLOCKED" },
        );
      }
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

  function ask(frames: number): void {
    if (closed || busy || Date.now() < notBefore || frames < CHECKPOINT_FRAMES || !healthy()) return;
    worker ??= start();
    busy = true;
    worker.postMessage("checkpoint");
  }

  return {
    committed() {
      reset = false;
      ask(walFrames());
    },
    refusal() {
      if (reset) return null;
      const frames = walFrames();
      if (frames <= capFrames) return null;
      ask(frames);
      return `the record database's WAL holds ${frames} frames, past its cap of ${capFrames}: another connection's read transaction on ${path} (a backup, an sqlite3 shell?) keeps it from being checkpointed; writes resume once it ends`;
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
