/**
 * The one-time import of a store's record files (legacy-records.ts) into `records.db`,
 * on the store's first open by this code.
 *
 * It runs in one write transaction of the database, so it is exclusive across processes
 * (the others wait for the write lock, then find it done) and resumable: a kill rolls the
 * whole import back and the next open runs it again. Before it reads any record it puts
 * the fence in place (legacy-records.ts), so code that reads record files refuses the
 * directory from then on. A torn lazy record reads as absent, as it did; a damaged durable
 * one stops the import with INTERNAL (nothing imported, the store does not open) rather
 * than losing a record. The record files are left as they were (nothing reads them; an
 * operator may remove them, keeping `records/format~`). Once the import committed the
 * fence says so (`imported`, legacy-records.ts); an open that then finds no import in
 * records.db (the file removed, or replaced by a copy from before the upgrade) fails
 * INTERNAL instead of importing the old files again or starting an empty store.
 *
 * O(record files) once per store; afterwards O(1) per open (one meta lookup).
 */
import { mkdirSync } from "node:fs";
import { RunnerDepotError } from "../../errors.js";
import type { RecordDb } from "./record-db.js";
import {
  fencePath,
  legacyRecordFiles,
  readFormatUnderFence,
  readLegacyRecord,
  writeFence,
  type LegacyRecord,
} from "./legacy-records.js";

/** The meta row that says the import ran (its value: when, and how many records). */
const IMPORTED = "legacy-records-imported";

/** Imports `recordsDir`'s files unless done before; the number imported, or null when it was done already. */
export async function importLegacyRecords(
  db: RecordDb,
  recordsDir: string,
  sync: boolean,
  now: () => Date = () => new Date(),
): Promise<number | null> {
  // Set when the fence still says `importing` (or is missing) after an import committed, by this open or an earlier one.
  let unmarked: { original: LegacyRecord | null } | undefined;
  const imported = await db.exclusive((conn) => {
    // Also for a new store: the fence keeps older code from starting an empty store here.
    mkdirSync(recordsDir, { recursive: true });
    const { original, fence } = readFormatUnderFence(recordsDir);
    if (conn.prepare("SELECT value FROM meta WHERE name = ?").get(IMPORTED)) {
      if (fence !== "imported") unmarked = { original };
      return null;
    }
    if (fence === "imported") {
      throw new RunnerDepotError(
        "INTERNAL",
        `${fencePath(recordsDir)} says this store's records moved into records.db, but records.db beside it holds none: it was removed or replaced. Restore records.db (with records.db-wal) from a backup; to start a new, empty store here instead, remove the directory ${recordsDir}.`,
      );
    }
    if (fence === null) writeFence(recordsDir, original, "importing", sync, now());
    // A row already in the database (none, unless a record file was put back by hand
    // after an import) wins: it is the newer.
    const insert = conn.prepare(
      "INSERT INTO records (key, revision, value) VALUES (?, ?, ?) ON CONFLICT (key) DO NOTHING",
    );
    let imported = 0;
    for (const { key, file } of legacyRecordFiles(recordsDir)) {
      const record = key === "format" ? original : readLegacyRecord(file);
      if (!record) continue;
      insert.run(Buffer.from(key, "utf8"), record.revision, JSON.stringify(record.value ?? null));
      imported++;
    }
    conn
      .prepare("INSERT INTO meta (name, value) VALUES (?, ?)")
      .run(IMPORTED, JSON.stringify({ at: now().toISOString(), records: imported }));
    unmarked = { original };
    return imported;
  });
  // After the commit (and its flush), never before: a fence saying `imported` over an
  // import that did not commit would refuse the store for good.
  if (unmarked) writeFence(recordsDir, unmarked.original, "imported", sync, now());
  return imported;
}
