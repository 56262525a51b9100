/**
 * The fs store's record database: `<dir>/records.db`, one SQLite database in WAL mode
 * opened through `node:sqlite` (sqlite.ts), shared by every process that opens the store.
 * Why: docs/decisions/depot-publish-durability.md, "record-db.ts: group commit and its costs".
 */
import { RunnerDepotError } from "../../errors.js";
import type { DatabaseSync, StatementSync } from "node:sqlite";
import { loadSqlite } from "./sqlite.js";
import { createWalSync, type WalSync } from "./wal-sync.js";
import { BACKSTOP_PAGES, createCheckpointer, type Checkpointer } from "./checkpointer.js";

/** The schema version this code writes (`PRAGMA user_version`); a newer database is refused. */
const RECORD_DB_VERSION = 1;
/** How long SQLite's own busy handler may block the event loop before a batch waits on timers. */
const BUSY_SPIN_MS = 5;
/** The longest timer wait between two tries at a held write lock (the wait doubles from 1 ms). */
const MAX_RETRY_DELAY_MS = 50;

/** A write of the batch: runs inside the transaction and answers its own outcome. */
type BatchWrite<T> = (db: PreparedRecords) => T;

/** The prepared statements of the records table. */
interface PreparedRecords {
  readonly insert: StatementSync;
  readonly swap: StatementSync;
  readonly deleteAny: StatementSync;
  readonly deleteIf: StatementSync;
  readonly get: StatementSync;
  readonly listAll: StatementSync;
  readonly listAllAfter: StatementSync;
  readonly listRange: StatementSync;
  readonly listRangeAfter: StatementSync;
  /** Small blobs (blobs.ts): digest (32 bytes) → bytes. */
  readonly blobInsert: StatementSync;
  readonly blobGet: StatementSync;
  readonly blobSize: StatementSync;
  readonly blobDelete: StatementSync;
  readonly blobPage: StatementSync;
}

/** One open record database (see {@link openRecordDb}). */
export interface RecordDb {
  readonly statements: PreparedRecords;
  /**
   * Queues `work` into the next batch; resolves with its result once the batch committed
   * (with an fsync when `durable` and the store syncs). O(1) to queue; a batch costs one
   * transaction and at most one fsync whatever its size.
   */
  write<T>(work: BatchWrite<T>, durable: boolean, visible?: (result: T) => void): Promise<T>;
  /**
   * Resolves once every batch committed before the call is on stable storage: a WAL flush
   * that started after it (shared with every other caller meanwhile; none when the store
   * does not sync). Fails as a durable write would after a failed flush.
   */
  sync(): Promise<void>;
  /** Runs `work` in a transaction of its own holding the write lock (setup, import). */
  exclusive<T>(work: (db: DatabaseSync) => T): Promise<T>;
  /** Waits for queued batches, then closes the connection. */
  close(): Promise<void>;
}

interface Queued {
  work: BatchWrite<unknown>;
  durable: boolean;
  /** Told the outcome at the commit, before a durable write's flush (WriteCondition.onVisible). */
  visible?: (result: unknown) => void;
  resolve(value: unknown): void;
  reject(error: unknown): void;
}

/**
 * Opens (creating when missing) the record database at `path`: WAL, the schema, and the
 * prepared statements. STORE_FORMAT_UNSUPPORTED for a database newer than this code.
 *
 * @example
 * ```ts
 * const db = await openRecordDb("/var/lib/depot/records.db", { sync: true, lockTimeoutMs: 30_000 });
 * const revision = await db.write((s) => s.insert.run(key, "r1", "{}").changes === 1, true);
 * await db.close();
 * ```
 */
export async function openRecordDb(
  path: string,
  options: { sync: boolean; lockTimeoutMs: number; walCapFrames?: number },
): Promise<RecordDb> {
  const { DatabaseSync } = loadSqlite();
  const db = new DatabaseSync(path);
  try {
    db.exec(`PRAGMA busy_timeout = ${BUSY_SPIN_MS}`);
    await retryBusy(options.lockTimeoutMs, () => {
      // WAL is a property of the file: set once, by whichever process opens it first.
      if ((db.prepare("PRAGMA journal_mode").get() as { journal_mode: string }).journal_mode !== "wal")
        db.exec("PRAGMA journal_mode = WAL");
    });
    await inTransaction(db, options.lockTimeoutMs, () => {
      const version = (db.prepare("PRAGMA user_version").get() as { user_version: number }).user_version;
      if (version > RECORD_DB_VERSION) {
        throw new RunnerDepotError(
          "STORE_FORMAT_UNSUPPORTED",
          `${path} has record database version ${version}; this runner-depot reads version ${RECORD_DB_VERSION}. Upgrade runner-depot to serve it.`,
        );
      }
      // Keys as BLOBs of their UTF-8 bytes, so SQLite orders them by memcmp: the port's byte
      // order. WITHOUT ROWID: the key is the b-tree's key, one lookup per read. Small blobs
      // (up to 16 KiB, blobs.ts) in a rowid table: SQLite advises against WITHOUT ROWID for
      // rows that large.
      db.exec(`CREATE TABLE IF NOT EXISTS records (key BLOB PRIMARY KEY, revision TEXT NOT NULL, value TEXT NOT NULL) WITHOUT ROWID;
               CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
               CREATE TABLE IF NOT EXISTS small_blobs (digest BLOB PRIMARY KEY, data BLOB NOT NULL);
               PRAGMA user_version = ${RECORD_DB_VERSION};`);
    });
  } catch (error) {
    db.close();
    throw error;
  }
  // NORMAL: a commit writes the WAL without flushing it; durable writes wait for the
  // store's own flush of the WAL, off the event loop (wal-sync.ts).
  // Checkpoints run on a worker (checkpointer.ts); this connection's own automatic one
  // only past the backstop, should the worker stall.
  db.exec(`PRAGMA synchronous = ${options.sync ? "NORMAL" : "OFF"}; PRAGMA wal_autocheckpoint = ${BACKSTOP_PAGES}`);
  const statements = prepare(db);
  const wal = options.sync ? createWalSync(path) : undefined;
  const checkpointer = createCheckpointer(path, options.sync, () => wal?.failure() === undefined, options.walCapFrames);
  return createBatcher(db, statements, wal, checkpointer, options.lockTimeoutMs);
}

/** Prepares the statements every record operation uses (each O(log records) per row). */
function prepare(db: DatabaseSync): PreparedRecords {
  return {
    insert: db.prepare("INSERT INTO records (key, revision, value) VALUES (?, ?, ?) ON CONFLICT (key) DO NOTHING"),
    swap: db.prepare("UPDATE records SET revision = ?, value = ? WHERE key = ? AND revision = ?"),
    deleteAny: db.prepare("DELETE FROM records WHERE key = ?"),
    deleteIf: db.prepare("DELETE FROM records WHERE key = ? AND revision = ?"),
    get: db.prepare("SELECT revision, value FROM records WHERE key = ?"),
    listAll: db.prepare("SELECT key FROM records ORDER BY key LIMIT ?"),
    listAllAfter: db.prepare("SELECT key FROM records WHERE key > ? ORDER BY key LIMIT ?"),
    listRange: db.prepare("SELECT key FROM records WHERE key >= ? AND key < ? ORDER BY key LIMIT ?"),
    listRangeAfter: db.prepare("SELECT key FROM records WHERE key > ? AND key >= ? AND key < ? ORDER BY key LIMIT ?"),
    blobInsert: db.prepare("INSERT INTO small_blobs (digest, data) VALUES (?, ?) ON CONFLICT (digest) DO NOTHING"),
    blobGet: db.prepare("SELECT data FROM small_blobs WHERE digest = ?"),
    blobSize: db.prepare("SELECT length(data) AS size FROM small_blobs WHERE digest = ?"),
    blobDelete: db.prepare("DELETE FROM small_blobs WHERE digest = ?"),
    blobPage: db.prepare("SELECT digest FROM small_blobs WHERE digest > ? ORDER BY digest LIMIT ?"),
  };
}

/** The group commit over one connection: a queue drained by one batch at a time. */
function createBatcher(
  db: DatabaseSync,
  statements: PreparedRecords,
  wal: WalSync | undefined,
  checkpointer: Checkpointer,
  lockTimeoutMs: number,
): RecordDb {
  let queue: Queued[] = [];
  let scheduled = false;
  let running: Promise<void> | undefined;
  let closed = false;

  function schedule(): void {
    if (scheduled || running) return;
    scheduled = true;
    // setImmediate, not a microtask: writes issued by every I/O callback of this turn join.
    setImmediate(() => {
      scheduled = false;
      running = runBatch().finally(() => {
        running = undefined;
        if (queue.length > 0) schedule();
      });
    });
  }

  async function runBatch(): Promise<void> {
    const batch = queue;
    queue = [];
    const failure = wal?.failure();
    if (failure) {
      for (const q of batch) q.reject(failure);
      return;
    }
    const results: unknown[] = [];
    /** The write that threw inside the transaction, if one did. */
    let failing: { index: number; error: unknown } | undefined;
    try {
      await inTransaction(db, lockTimeoutMs, () => {
        for (const [index, q] of batch.entries()) {
          try {
            results.push(q.work(statements));
          } catch (error) {
            failing = { index, error };
            throw error;
          }
        }
      });
    } catch (error) {
      if (!failing) {
        // BEGIN or COMMIT failed (the lock not had in time, a full disk): nothing of the batch committed.
        for (const q of batch) q.reject(error);
        return;
      }
      // One write failed (a value past SQLite's length limit, a constraint): it answers its
      // own error, and its batch-mates, rolled back with it, go again in the next batch, in
      // order and ahead of writes queued since. A batch of n writes of which f fail takes
      // f + 1 transactions (O(n) statements each); without a failure, one.
      const { index, error: own } = failing;
      batch[index]!.reject(own);
      queue = [...batch.slice(0, index), ...batch.slice(index + 1), ...queue];
      return;
    }
    checkpointer.committed();
    // Lazy writes answer at once; durable ones after a WAL flush that started after this
    // commit. The batcher does not wait for it: the next batch commits meanwhile.
    const flushed = wal && batch.some((q) => q.durable) ? wal.sync() : undefined;
    batch.forEach((q, i) => {
      try {
        q.visible?.(results[i]);
      } catch {
        // The caller's callback: its failure is not the write's.
      }
      if (!q.durable || !flushed) q.resolve(results[i]);
      else flushed.then(() => q.resolve(results[i]), q.reject);
    });
  }

  return {
    statements,
    write<T>(work: BatchWrite<T>, durable: boolean, visible?: (result: T) => void): Promise<T> {
      if (closed) return Promise.reject(new RunnerDepotError("UNAVAILABLE", "The fs store is closed"));
      // A failed WAL flush: what is committed from now on would sit behind frames the disk may not hold (wal-sync.ts).
      const failure = wal?.failure();
      if (failure) return Promise.reject(failure);
      // Past the WAL's cap (an outside reader blocks its checkpoints): refused, not grown without end.
      const refused = checkpointer.refusal();
      if (refused) return Promise.reject(new RunnerDepotError("STORE_UNAVAILABLE", refused));
      return new Promise<T>((resolve, reject) => {
        queue.push({
          work,
          durable,
          visible: visible as ((result: unknown) => void) | undefined,
          resolve: resolve as (value: unknown) => void,
          reject,
        });
        schedule();
      });
    },
    async sync(): Promise<void> {
      if (closed) throw new RunnerDepotError("UNAVAILABLE", "The fs store is closed");
      await wal?.sync();
    },
    async exclusive<T>(work: (db: DatabaseSync) => T): Promise<T> {
      while (running || scheduled) await (running ?? new Promise((resolve) => setImmediate(resolve)));
      let result!: T;
      let changed = false;
      const changes = () => (db.prepare("SELECT total_changes() AS n").get() as { n: number }).n;
      await inTransaction(db, lockTimeoutMs, () => {
        const before = changes();
        result = work(db);
        changed = changes() !== before;
      });
      // Flushed only when it wrote: an open after a failed flush (wal-sync.ts) still reads.
      if (changed) {
        checkpointer.committed();
        await wal?.sync();
      }
      return result;
    },
    async close() {
      if (closed) return;
      closed = true;
      while (running || scheduled || queue.length > 0) {
        await (running ?? new Promise((resolve) => setImmediate(resolve)));
      }
      // Waits for the flushes in flight (the durable writes they answer resolve with them).
      await wal?.close();
      await checkpointer.close();
      db.close();
    },
  };
}

/**
 * Runs `work` in a write transaction (BEGIN IMMEDIATE … COMMIT), rolled back when it
 * throws. Waits for the write lock as {@link retryBusy} does; the work itself runs inline.
 */
async function inTransaction(db: DatabaseSync, lockTimeoutMs: number, work: () => void): Promise<void> {
  await retryBusy(lockTimeoutMs, () => db.exec("BEGIN IMMEDIATE"));
  try {
    work();
    db.exec("COMMIT");
  } catch (error) {
    // (`isTransaction` is newer than Node 22.15; a ROLLBACK without a transaction just fails.)
    try {
      db.exec("ROLLBACK");
    } catch {
      // SQLite already rolled back (an I/O error can end the transaction itself).
    }
    throw error;
  }
}

/**
 * Runs `attempt` until it does not fail SQLITE_BUSY: SQLite's handler spins up to
 * BUSY_SPIN_MS on the thread, then timers back off from 1 ms (randomised, doubling to
 * MAX_RETRY_DELAY_MS) until `lockTimeoutMs`, then UNAVAILABLE.
 */
async function retryBusy(lockTimeoutMs: number, attempt: () => void): Promise<void> {
  const deadline = Date.now() + lockTimeoutMs;
  let delay = 1;
  for (;;) {
    try {
      attempt();
      return;
    } catch (error) {
      if (!isBusy(error)) throw error;
      if (Date.now() > deadline)
        throw new RunnerDepotError("UNAVAILABLE", "Timed out waiting for the record database's write lock");
    }
    await new Promise((resolve) => setTimeout(resolve, delay + Math.random() * delay));
    delay = Math.min(delay * 2, MAX_RETRY_DELAY_MS);
  }
}

/** SQLITE_BUSY (5) or SQLITE_LOCKED (6), with or without extended bits. */
function isBusy(error: unknown): boolean {
  const code = (error as { errcode?: number } | null)?.errcode;
  return typeof code === "number" && ((code & 0xff) === 5 || (code & 0xff) === 6);
}
