/**
 * Records of the fs store: rows of `<dir>/records.db` (record-db.ts), `(key BLOB,
 * revision, value JSON)`, with compare-and-swap on the revision.
 * Why: docs/decisions/depot-publish-durability.md, "records.ts: the cost of each record operation".
 */
import { randomUUID } from "node:crypto";
import type { PackageStore, StoredRecord, WriteCondition } from "../../depot/ports.js";
import { RunnerDepotError } from "../../errors.js";
import type { RecordDb } from "./record-db.js";

/** Keys per page when the caller names no limit. */
const DEFAULT_PAGE = 1000;
/** The most keys one page answers. */
const MAX_PAGE = 1_000_000;
/** The longest key accepted, in UTF-8 bytes (depot keys are a few hundred at most). */
const MAX_KEY_BYTES = 4096;

/** The record half of a PackageStore. */
type FsRecords = Pick<PackageStore, "getRecord" | "putRecord" | "deleteRecord" | "listRecords">;

/** Makes the record operations of one store over its (lazily opened) record database. */
export function createFsRecords(open: () => Promise<RecordDb>): FsRecords {
  return {
    async getRecord<T>(key: string): Promise<StoredRecord<T> | null> {
      const db = await open();
      const row = db.statements.get.get(keyBytes(key)) as { revision: string; value: string } | undefined;
      return row ? { value: JSON.parse(row.value) as T, revision: row.revision } : null;
    },

    async putRecord(key: string, value: unknown, cond: WriteCondition) {
      const json = JSON.stringify(value);
      if (json === undefined) throw new RunnerDepotError("BAD_REQUEST", "Record value is not JSON");
      const bytes = keyBytes(key);
      const db = await open();
      const revision = randomUUID();
      // deferSync: the caller's later syncRecords flushes it (one WAL: it covers every commit before it).
      const durable = cond.lazy !== true && cond.deferSync !== true;
      // Told at the commit: one WAL keeps commits in order (WriteCondition.onVisible).
      const onVisible = cond.onVisible;
      const visible = onVisible && ((written: string | null) => onVisible(written !== null));
      if (cond.ifRevision === null)
        return db.write((s) => (s.insert.run(bytes, revision, json).changes === 1 ? revision : null), durable, visible);
      const ifRevision = cond.ifRevision;
      return db.write(
        (s) => (s.swap.run(revision, json, bytes, ifRevision).changes === 1 ? revision : null),
        durable,
        visible,
      );
    },

    async deleteRecord(key: string, cond?: WriteCondition) {
      const bytes = keyBytes(key);
      const db = await open();
      const ifRevision = cond?.ifRevision ?? null;
      const durable = cond?.lazy !== true;
      if (ifRevision === null) return db.write((s) => Number(s.deleteAny.run(bytes).changes) > 0, durable);
      return db.write((s) => Number(s.deleteIf.run(bytes, ifRevision).changes) > 0, durable);
    },

    async listRecords(prefix: string, page: { cursor?: string; limit?: number } = {}) {
      const db = await open();
      // Bounded: at most MAX_PAGE keys a page (the depot's largest asks for fewer).
      const asked = Number.isFinite(page.limit)
        ? Math.floor(page.limit!)
        : page.limit === undefined
          ? DEFAULT_PAGE
          : MAX_PAGE;
      const limit = Math.max(1, Math.min(asked, MAX_PAGE));
      const s = db.statements;
      const low = Buffer.from(prefix, "utf8");
      const high = successor(low);
      const after = page.cursor === undefined ? undefined : Buffer.from(page.cursor, "utf8");
      // One more row than the page: whether a next page exists, without a count.
      const rows = (
        high === null
          ? after === undefined
            ? s.listAll.all(limit + 1)
            : s.listAllAfter.all(after, limit + 1)
          : after === undefined
            ? s.listRange.all(low, high, limit + 1)
            : s.listRangeAfter.all(after, low, high, limit + 1)
      ) as Array<{ key: Uint8Array }>;
      const keys = rows
        .slice(0, limit)
        .map((r) => Buffer.from(r.key.buffer, r.key.byteOffset, r.key.byteLength).toString("utf8"));
      return rows.length > limit ? { keys, cursor: keys.at(-1)! } : { keys };
    },
  };
}

/** A key's UTF-8 bytes: what the table stores and orders. O(key length); BAD_REQUEST past MAX_KEY_BYTES. */
function keyBytes(key: string): Buffer {
  const bytes = Buffer.from(key, "utf8");
  if (bytes.length > MAX_KEY_BYTES)
    throw new RunnerDepotError("BAD_REQUEST", `Record key too long for the fs store: ${key.slice(0, 40)}…`);
  return bytes;
}

/**
 * The least byte string above every string starting with `prefix` (the prefix with its
 * last byte below 0xff incremented, what follows dropped); null when there is none (an
 * empty prefix, or only 0xff bytes, which UTF-8 never holds). O(prefix length).
 */
function successor(prefix: Uint8Array): Buffer | null {
  const out = Buffer.from(prefix);
  for (let i = out.length - 1; i >= 0; i--) {
    if (out[i]! < 0xff) {
      out[i] = out[i]! + 1;
      return out.subarray(0, i + 1);
    }
  }
  return null;
}
