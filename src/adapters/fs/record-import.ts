/**
 * The one-time import of a store's record files (legacy-records.ts) into `records.db`,
 * on the store's first open by this code.
 * Why: docs/decisions/depot-publish-durability.md, "record-import.ts: importing the old layout once".
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
  // Set when the fence still says `importing` (or is missing) after an import committed, by this open or an earlier
  // one.
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
