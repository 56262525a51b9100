/**
 * Records of the fs store: one JSON file per key (`{ key, revision, value }`, see
 * record-keys.ts for the name), with compare-and-swap on the revision. A create is a
 * hard link of a whole temp file (no lock); a swap or delete holds the key's lock for its
 * read-compare-rename. Every operation is O(record size) plus at most one lock and one
 * directory fsync (shared with concurrent writers, see durable.ts).
 *
 * Lazy creates (the port's `WriteCondition.lazy`: a write a machine crash may lose) are
 * not flushed at all, neither the file nor its directory: a power loss may then leave the
 * name with a torn body (empty or cut short). Every other write flushes the file before
 * its name appears (and a swap, lazy or not, replaces the name only with a flushed file),
 * so a record file that does not parse can only be such a lost create, and it reads as
 * absent, exactly what losing the create means; a later create of the key replaces it,
 * and any delete of the key removes it.
 * A lazy create's text starts with a space (LAZY_MARK; JSON allows it), and so does a
 * losable swap's (`WriteCondition.losable`: written and renamed over the record without
 * any flush, for a record whose whole loss is safe), so only a file that is empty,
 * NUL-filled (what XFS shows of unwritten blocks) or marked lazy counts as torn: any other unparsable file is a durable record damaged outside the store (a disk
 * fault, a partial restore, a hand edit) and answers INTERNAL rather than reading as
 * absent, which would let a create replace a published version.
 *
 * Every call here but a flush, a rename over a record and a record's delete runs inline
 * (see durable.ts for why).
 */
import { randomUUID } from "node:crypto";
import { closeSync, linkSync, openSync, readSync, renameSync } from "node:fs";
import { unlink } from "node:fs/promises";
import { join } from "node:path";
import type { PackageStore, StoredRecord } from "../../depot/ports.js";
import { RunnerDepotError } from "../../errors.js";
import type { FsStoreContext } from "./context.js";
import type { DurableWrites } from "./durable.js";
import { unlinkQuietly } from "./files.js";
import type { RecordLocks } from "./locks.js";
import { recordPath } from "./record-keys.js";

/** The first byte of a lazy create's file: what tells a torn lazy create from damage. */
const LAZY_MARK = " ";

/** The first read of a record file: most records fit, so a read is open, read, close. */
const RECORD_READ_BYTES = 16 * 1024;
/** The buffer of that first read (see readRecordState). */
const SCRATCH = Buffer.allocUnsafe(RECORD_READ_BYTES);

/** A record file's content. */
interface RecordFile {
  key: string;
  revision: string;
  value: unknown;
}

/** The condition of a putRecord: create-only (`ifRevision: null`) or swap from a revision. */
type PutCondition = { ifRevision: string | null; lazy?: boolean; losable?: boolean };

/** The record half of a PackageStore, without listing (listing.ts). */
export type FsRecords = Pick<PackageStore, "getRecord" | "putRecord" | "deleteRecord">;

/** Makes the record operations of one store. */
export function createFsRecords(ctx: FsStoreContext, durable: DurableWrites, locks: RecordLocks): FsRecords {
  /**
   * Create-only needs no lock and no read: the file is written whole under a temp name and
   * hard-linked into place, and link(2) fails when the name exists. A compare-and-swap or
   * delete in another process holds the lock only while the record exists, so it cannot
   * interleave with a create that succeeds.
   */
  async function createRecord(file: string, content: (revision: string) => string, lazy: boolean | undefined): Promise<string | null> {
    const revision = randomUUID();
    const tmp = ctx.tmpPath();
    try {
      // A lazy create is not flushed (see the top of this file).
      await durable.writeSynced(tmp, lazy ? LAZY_MARK + content(revision) : content(revision), !lazy);
      if (!linkUnlessTaken(tmp, file)) {
        // Taken, unless by a torn lazy create (it reads as absent): this one replaces it,
        // under the key's lock so a concurrent swap, delete or create judges it once. A
        // whole file (every one but after a machine crash) is judged without the lock, as
        // before torn files existed: a lost create-only race (a sequence position, a
        // reference noted again) costs one read, and never waits on a held lock.
        if ((await readRecordState(file)) !== "torn") return null;
        const replaced = await locks.withLock(file, async () => {
          const state = await readRecordState(file);
          // Gone meanwhile (a delete in another process removes a torn file): the key is
          // free, so this create takes it as it would have at first.
          if (state === null) return linkUnlessTaken(tmp, file);
          if (state !== "torn") return false;
          renameSync(tmp, file);
          return true;
        });
        if (!replaced) return null;
      }
    } finally {
      unlinkQuietly(tmp); // the linked (or renamed) name keeps the file
    }
    if (!lazy) await durable.fsyncDir(join(file, ".."));
    return revision;
  }

  /** Replaces the record if its revision is still `ifRevision`; the caller holds the key's lock. */
  async function swapRecord(file: string, content: (revision: string) => string, cond: PutCondition): Promise<string | null> {
    const current = await readRecordFile(file);
    if ((current?.revision ?? null) !== cond.ifRevision) return null;
    const revision = randomUUID();
    // The file's bytes are synced before the rename (never a torn record after a machine
    // crash); a lazy write skips only the directory's fsync. A losable one (lazy too)
    // skips both: marked like a lazy create, so a torn result reads as absent.
    const losable = cond.lazy === true && cond.losable === true;
    const body = losable ? LAZY_MARK + content(revision) : content(revision);
    // A durable swap's directory fsync runs before the replaced file is freed (durable.ts).
    await durable.writeAtomically(file, body, !losable, cond.lazy ? undefined : () => durable.fsyncDir(join(file, "..")));
    return revision;
  }

  return {
    async getRecord<T>(key: string): Promise<StoredRecord<T> | null> {
      await ctx.init();
      const record = await readRecordFile(recordPath(ctx.recordsDir, key));
      return record ? { value: record.value as T, revision: record.revision } : null;
    },

    async putRecord(key: string, value: unknown, cond: PutCondition) {
      await ctx.init();
      const file = recordPath(ctx.recordsDir, key);
      const json = JSON.stringify(value);
      if (json === undefined) throw new RunnerDepotError("BAD_REQUEST", "Record value is not JSON");
      await durable.ensureDir(join(file, ".."));
      // The value is serialised once; only the revision differs between tries.
      const content = (revision: string) => `{"key":${JSON.stringify(key)},"revision":"${revision}","value":${json}}`;
      if (cond.ifRevision === null) return locks.withKey(key, () => createRecord(file, content, cond.lazy));
      return locks.withKey(key, () => locks.withLock(file, () => swapRecord(file, content, cond)));
    },

    async deleteRecord(key: string, cond?: PutCondition) {
      await ctx.init();
      const file = recordPath(ctx.recordsDir, key);
      return locks.withKey(key, () =>
        locks
          .withLock(file, async () => {
            const current = await readRecordState(file);
            if (current === "torn") {
              // A torn lazy create reads as absent, so removing it changes nothing any reader
              // sees; left in place it would stay for ever under a key nobody creates again
              // (a lost transaction's items). Not flushed: a crash may bring it back, torn.
              await unlink(file);
              return false;
            }
            if (!current) return false;
            if (cond && cond.ifRevision !== null && cond.ifRevision !== current.revision) return false;
            // Through the pool: it frees the record's blocks (durable.ts).
            await unlink(file);
            if (!cond?.lazy) await durable.fsyncDir(join(file, ".."));
            return true;
          })
          // ENOENT: the key's directory is missing (the lock cannot be made there), so no record.
          .catch((error) => {
            if ((error as NodeJS.ErrnoException).code === "ENOENT") return false;
            throw error;
          }),
      );
    },
  };
}

/** Hard-links `tmp` to `file` (inline); false when `file` exists. */
function linkUnlessTaken(tmp: string, file: string): boolean {
  try {
    linkSync(tmp, file);
    return true;
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "EEXIST") return false;
    throw error;
  }
}

/**
 * Reads a record file: open, one read, close (inline) for a record under RECORD_READ_BYTES
 * (most are), where `readFile` also asks the size first and reads again to see the end. A
 * regular file's read returns fewer bytes than asked only at its end. A larger record
 * grows the buffer fourfold per read: O(size) bytes copied in all.
 */
async function readRecordFile(file: string): Promise<RecordFile | null> {
  const state = await readRecordState(file);
  return state === "torn" ? null : state;
}

/** A record file's content, null when there is none, `torn` when it does not parse (a lazy create cut by a machine crash). */
async function readRecordState(file: string): Promise<RecordFile | "torn" | null> {
  let fd: number;
  try {
    fd = openSync(file, "r");
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return null;
    throw error;
  }
  try {
    // The read is synchronous from open to toString, so one scratch buffer serves every
    // read of the process: no 16 KiB allocation per record read.
    let buffer = SCRATCH;
    let length = 0;
    for (;;) {
      const bytesRead = readSync(fd, buffer, length, buffer.length - length, length);
      length += bytesRead;
      if (bytesRead === 0 || length < buffer.length) break;
      const larger = Buffer.allocUnsafe(buffer.length * 4);
      buffer.copy(larger, 0, 0, length);
      buffer = larger;
    }
    return parseRecord(buffer.toString("utf8", 0, length));
  } finally {
    closeSync(fd);
  }
}

/**
 * A record file's text parsed; `torn` when it is what a machine crash leaves of a lazy
 * create (see the top of this file). INTERNAL for any other text that is not a record.
 */
function parseRecord(text: string): RecordFile | "torn" {
  let parsed: RecordFile | null = null;
  try {
    parsed = JSON.parse(text) as RecordFile | null;
  } catch {
    // Judged below.
  }
  if (parsed !== null && typeof parsed === "object" && typeof parsed.revision === "string") return parsed;
  if (text === "" || text.startsWith(LAZY_MARK) || text.charCodeAt(0) === 0) return "torn";
  throw new RunnerDepotError("INTERNAL", "A record file of the fs store is damaged (it is neither a record nor a torn lazy create)");
}
