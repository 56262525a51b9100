/**
 * Small depot blobs as rows of PostgreSQL (`small_blobs`: hex digest → bytes), beside the records, as the fs
 * store keeps them in records.db. `composeStore` puts a body of up to `maxBytes` here instead of into S3: a
 * one-file publish (the file, its manifest, its archive) then makes no S3 request at all, and a row written
 * with `deferSync` commits asynchronously and joins the records' one flush (records.ts, syncRecords).
 * Why: docs/decisions/depot-scale-out.md, "Small blobs in PostgreSQL".
 */
import type { SmallBlobStore } from "../../depot/ports.js";
import { ASYNC_COMMIT, type PostgresHandle } from "./schema.js";

/** Bodies up to this many bytes are rows by default (as the fs store's small blobs). */
export const SMALL_BLOB_BYTES = 16 * 1024;
/** Rows per page of `listSmallBlobs`. */
const LIST_PAGE = 1000;
const DIGEST = /^sha256:([0-9a-f]{64})$/;

/** The store's statement runner; `flushed` for a write whose commit waits for the WAL flush. */
type Query = <R>(sql: string, params: unknown[], flushed?: boolean) => Promise<R[]>;

/**
 * Creates the small-blob rows of one records store; `query` is the store's (its pool, its errors).
 *
 * @example
 * const small = createPostgresSmallBlobs(db, query, 16 * 1024);
 * await small.putSmallBlob(digest, bytes, { deferSync: true });
 */
export function createPostgresSmallBlobs(db: PostgresHandle, query: Query, maxBytes: number): SmallBlobStore {
  const t = `${db.schema}.small_blobs`;
  const hexOf = (digest: string) => DIGEST.exec(digest)?.[1] ?? null;
  return {
    maxBytes,

    /** One INSERT … ON CONFLICT DO NOTHING: idempotent, concurrent puts of one digest race on the key. O(size). */
    async putSmallBlob(digest, bytes, options = {}) {
      const hex = hexOf(digest);
      if (!hex) throw new Error(`not a sha256 digest: ${digest}`);
      const data = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
      await query(
        options.deferSync
          ? `INSERT INTO ${t} (digest, bytes) SELECT $1, $2 FROM ${ASYNC_COMMIT} ON CONFLICT (digest) DO NOTHING`
          : `INSERT INTO ${t} (digest, bytes) VALUES ($1, $2) ON CONFLICT (digest) DO NOTHING`,
        [hex, data],
        !options.deferSync,
      );
    },

    /** One indexed read. O(log rows + size). */
    async getSmallBlob(digest) {
      const hex = hexOf(digest);
      if (!hex) return null;
      const rows = await query<{ bytes: Buffer }>(`SELECT bytes FROM ${t} WHERE digest = $1`, [hex]);
      return rows[0]?.bytes ?? null;
    },

    async statSmallBlob(digest) {
      const hex = hexOf(digest);
      if (!hex) return null;
      const rows = await query<{ size: number }>(`SELECT octet_length(bytes) AS size FROM ${t} WHERE digest = $1`, [
        hex,
      ]);
      return rows[0] ? Number(rows[0].size) : null;
    },

    async deleteSmallBlob(digest) {
      const hex = hexOf(digest);
      if (!hex) return false;
      return (await query(`DELETE FROM ${t} WHERE digest = $1 RETURNING 1`, [hex], true)).length > 0;
    },

    /** Keyset pages of LIST_PAGE digests in byte order ("C" collation). O(rows) over the whole walk. */
    async *listSmallBlobs() {
      let after = "";
      for (;;) {
        const rows = await query<{ digest: string }>(
          `SELECT digest FROM ${t} WHERE digest > $1 ORDER BY digest LIMIT ${LIST_PAGE}`,
          [after],
        );
        for (const row of rows) yield `sha256:${row.digest}`;
        if (rows.length < LIST_PAGE) return;
        after = rows[rows.length - 1]!.digest;
      }
    },
  };
}
