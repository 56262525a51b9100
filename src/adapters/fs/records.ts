/**
 * Records of the fs store: one JSON file per key (`{ key, revision, value }`, see
 * record-keys.ts for the name), with compare-and-swap on the revision. A create is a
 * hard link of a whole temp file (no lock); a swap or delete holds the key's lock for its
 * read-compare-rename. Every operation is O(record size) plus at most one lock and one
 * directory fsync (shared with concurrent writers, see durable.ts).
 */
import { randomUUID } from "node:crypto";
import { link, unlink } from "node:fs/promises";
import { join } from "node:path";
import type { PackageStore, StoredRecord } from "../../depot/ports.js";
import { RunnerDepotError } from "../../errors.js";
import type { FsStoreContext } from "./context.js";
import type { DurableWrites } from "./durable.js";
import { openIfExists } from "./files.js";
import type { RecordLocks } from "./locks.js";
import { recordPath } from "./record-keys.js";

/** The first read of a record file: most records fit, so a read is open, read, close. */
const RECORD_READ_BYTES = 16 * 1024;

/** A record file's content. */
interface RecordFile {
  key: string;
  revision: string;
  value: unknown;
}

/** The condition of a putRecord: create-only (`ifRevision: null`) or swap from a revision. */
type PutCondition = { ifRevision: string | null; lazy?: boolean };

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
      await durable.writeSynced(tmp, content(revision));
      await link(tmp, file);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "EEXIST") return null;
      throw error;
    } finally {
      await unlink(tmp).catch(() => undefined);
    }
    if (!lazy) await durable.fsyncDir(join(file, ".."));
    return revision;
  }

  /** Replaces the record if its revision is still `ifRevision`; the caller holds the key's lock. */
  async function swapRecord(file: string, content: (revision: string) => string, cond: PutCondition): Promise<string | null> {
    const current = await readRecordFile(file);
    if ((current?.revision ?? null) !== cond.ifRevision) return null;
    const revision = randomUUID();
    // The file's bytes are always synced before the rename (never a torn record after
    // a machine crash); a lazy write skips only the directory's fsync.
    await durable.writeAtomically(file, content(revision));
    if (!cond.lazy) await durable.fsyncDir(join(file, ".."));
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
            const current = await readRecordFile(file);
            if (!current) return false;
            if (cond && cond.ifRevision !== null && cond.ifRevision !== current.revision) return false;
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

/**
 * Reads a record file: open, one read, close for a record under RECORD_READ_BYTES (most
 * are), where `readFile` also asks the size first and reads again to see the end. A
 * regular file's read returns fewer bytes than asked only at its end. A larger record
 * grows the buffer fourfold per read: O(size) bytes copied in all.
 */
async function readRecordFile(file: string): Promise<RecordFile | null> {
  const handle = await openIfExists(file);
  if (!handle) return null;
  try {
    let buffer = Buffer.allocUnsafe(RECORD_READ_BYTES);
    let length = 0;
    for (;;) {
      const { bytesRead } = await handle.read(buffer, length, buffer.length - length, length);
      length += bytesRead;
      if (bytesRead === 0 || length < buffer.length) break;
      const larger = Buffer.allocUnsafe(buffer.length * 4);
      buffer.copy(larger, 0, 0, length);
      buffer = larger;
    }
    return JSON.parse(buffer.toString("utf8", 0, length)) as RecordFile;
  } finally {
    await handle.close();
  }
}
