/**
 * Depot records on PostgreSQL: one row per key with a JSON value and a revision drawn
 * from a sequence. Compare-and-swap is a single statement (INSERT … ON CONFLICT DO
 * NOTHING to create, UPDATE … WHERE revision = $n to swap), so the row lock PostgreSQL
 * takes decides every race, across any number of depot replicas. A row lock lives for
 * one statement (each is its own transaction): none is held across a round trip.
 *
 * Writes a machine crash may lose (`lazy`) and writes a request flushes once before it
 * answers (`deferSync`) commit asynchronously (`synchronous_commit` off for that statement
 * alone), and {@link RecordStore.syncRecords} makes them durable with one WAL flush: a
 * publish waits for one or two flushes instead of one per write.
 * Why: docs/decisions/depot-scale-out.md, "records.ts: asynchronous commits and one flush".
 *
 * Reads and asynchronous writes go over a few pipelined connections of the store's own
 * (pipeline.ts), still one transaction each; writes that wait for a flush go through the pool.
 * Why: docs/decisions/depot-scale-out.md, "Pipelined statements".
 */
import { createHash } from "node:crypto";
import pg from "pg";
import { RunnerDepotError } from "../../errors.js";
import type { RecordStore, StoredRecord, WriteCondition } from "../../depot/ports.js";
import { createRecordWatch, MAX_ANNOUNCED_KEY, recordChannelOf } from "./record-notify.js";
import { ASYNC_COMMIT, openPostgres, unavailable } from "./schema.js";
import { createPipeline } from "./pipeline.js";
import { sharedFlush } from "./shared-flush.js";
import { createPostgresSmallBlobs, SMALL_BLOB_BYTES } from "./small-blobs.js";
import type { PostgresOptions } from "./schema.js";

/** Options of {@link createPostgresRecords}. */
export interface PostgresRecordsOptions extends PostgresOptions {
  /** Page size of `listRecords` when the caller gives none; default 1 000 (max 10 000). */
  defaultPageSize?: number;
  /**
   * Blobs of up to this many bytes are kept in the table `small_blobs` beside the records
   * ({@link RecordStore.smallBlobs}: `composeStore` puts them there, not in its blob store); default 16 KiB,
   * 0 for none. At most 1 MiB: a row is read whole.
   */
  smallBlobBytes?: number;
  /**
   * Connections of the store's own (made from the pool's options, beside it) that carry reads and writes
   * that commit asynchronously, many at once, pipelined (pipeline.ts); default 2, 0 to send every statement
   * through the pool. Writes whose commit waits for the WAL flush still go through the pool, so a flush
   * never holds up the statements queued behind it.
   */
  pipelineConnections?: number;
}

const REVISION = /^[0-9]{1,19}$/;
/** Revisions are bigints: a longer or larger string was never issued and cannot match. */
const isRevision = (r: string) => REVISION.test(r) && BigInt(r) <= 9223372036854775807n;

/** Joined into a write: its commit does not wait for the WAL flush (schema.ts). */
const ASYNC = ASYNC_COMMIT;
/** Pipelined connections of a store by default (docs/decisions/depot-scale-out.md, "Pipelined statements"). */
const PIPELINE_CONNECTIONS = 2;
/** Rows of `sync_points`: concurrent flushes update different rows, so they share the WAL flush (group commit). */
const SYNC_POINTS = 64;

/** Names of prepared statements by their text (the schema is in the text, so stores on one pool never clash). */
const statementNames = new Map<string, string>();

/** A prepared statement's name for `sql`: O(length of sql) once per distinct text, then O(1). */
function statementName(sql: string): string {
  let name = statementNames.get(sql);
  if (!name) {
    name = `rd_${createHash("sha256").update(sql).digest("hex").slice(0, 24)}`;
    statementNames.set(sql, name);
  }
  return name;
}

/** Whether a write may commit without waiting for the WAL flush (see the file's comment). */
function asynchronous(cond: WriteCondition | undefined): boolean {
  return cond?.lazy === true || cond?.deferSync === true;
}

/**
 * Creates a {@link RecordStore} on PostgreSQL.
 *
 * @example
 * const records = createPostgresRecords({ connectionString: "postgres://postgres@127.0.0.1/depot" });
 * const store = composeStore({ blobs: createS3BlobStore({ bucket: "depot" }), records });
 */
export function createPostgresRecords(options: PostgresRecordsOptions): RecordStore {
  const db = openPostgres(options);
  const t = `${db.schema}.records`;
  const seq = `${db.schema}.record_revision`;
  const syncPoints = `${db.schema}.sync_points`;
  const pageDefault = options.defaultPageSize ?? 1000;
  const schemaName = options.schema ?? "runner_depot";
  const channel = recordChannelOf(schemaName);
  // One LISTEN connection of its own, opened by the first watcher (record-notify.ts).
  const watch = createRecordWatch(() => new pg.Client(db.pool.options), schemaName);
  const lanes = options.pipelineConnections ?? PIPELINE_CONNECTIONS;
  const pipeline = lanes > 0 ? createPipeline(() => db.pool.options, lanes) : null;

  /**
   * Runs one statement: pipelined unless `flushed` (its commit waits for the WAL flush: sent through the
   * pool, so the statements queued behind it on a pipelined connection do not wait for the flush too).
   */
  async function query<R>(sql: string, params: unknown[], flushed = false): Promise<R[]> {
    try {
      await db.ready();
      // A named statement: each connection parses and plans it once, then only binds and runs it (about
      // 40% less PostgreSQL CPU for a key lookup, docs/decisions/depot-scale-out.md).
      const config = { name: statementName(sql), text: sql, values: params };
      if (pipeline && !flushed) return await pipeline.query<R>(config);
      return (await db.pool.query(config)).rows as R[];
    } catch (error) {
      throw unavailable(error, "STORE_UNAVAILABLE");
    }
  }

  function encode(value: unknown): string {
    return JSON.stringify(value) ?? "null";
  }

  const smallBytes = Math.min(options.smallBlobBytes ?? SMALL_BLOB_BYTES, 1024 * 1024);
  const smallBlobs = smallBytes > 0 ? createPostgresSmallBlobs(db, query, smallBytes) : undefined;

  return {
    ...(smallBlobs ? { smallBlobs } : {}),

    async getRecord<T = unknown>(key: string): Promise<StoredRecord<T> | null> {
      const rows = await query<{ value: T; revision: string }>(`SELECT value, revision FROM ${t} WHERE key = $1`, [
        key,
      ]);
      const row = rows[0];
      return row ? { value: row.value, revision: String(row.revision) } : null;
    },

    async putRecord(key: string, value: unknown, cond: WriteCondition): Promise<string | null> {
      const later = asynchronous(cond);
      // An announced write notifies in the same statement: delivered at its commit, only when it wrote.
      const announce = cond.announce === true && key.length <= MAX_ANNOUNCED_KEY;
      const wrap = (write: string, params: unknown[]) =>
        announce
          ? {
              sql: `WITH w AS (${write}) SELECT revision, pg_notify($${params.length + 1}, $1) FROM w`,
              params: [...params, channel],
            }
          : { sql: write, params };
      if (cond.ifRevision === null) {
        const { sql, params } = wrap(
          later
            ? `INSERT INTO ${t} (key, value, revision) SELECT $1, $2, nextval('${seq}') FROM ${ASYNC}
               ON CONFLICT (key) DO NOTHING RETURNING revision`
            : `INSERT INTO ${t} (key, value, revision) VALUES ($1, $2, nextval('${seq}'))
               ON CONFLICT (key) DO NOTHING RETURNING revision`,
          [key, encode(value)],
        );
        const rows = await query<{ revision: string }>(sql, params, !later);
        return rows[0] ? String(rows[0].revision) : null;
      }
      // A revision this store never issued cannot match anything.
      if (!isRevision(cond.ifRevision)) return null;
      const { sql, params } = wrap(
        `UPDATE ${t} SET value = $2, revision = nextval('${seq}') ${later ? `FROM ${ASYNC}` : ""}
         WHERE key = $1 AND revision = $3 RETURNING revision`,
        [key, encode(value), cond.ifRevision],
      );
      const rows = await query<{ revision: string }>(sql, params, !later);
      return rows[0] ? String(rows[0].revision) : null;
    },

    watchRecords(listener: (key: string | null) => void) {
      return watch.watch(listener);
    },

    async deleteRecord(key: string, cond?: WriteCondition): Promise<boolean> {
      const revision = cond?.ifRevision ?? null;
      const later = asynchronous(cond);
      const using = later ? `USING ${ASYNC}` : "";
      if (revision === null) {
        const rows = await query(`DELETE FROM ${t} ${using} WHERE key = $1 RETURNING 1`, [key], !later);
        return rows.length > 0;
      }
      if (!isRevision(revision)) return false;
      const rows = await query(
        `DELETE FROM ${t} ${using} WHERE key = $1 AND revision = $2 RETURNING 1`,
        [key, revision],
        !later,
      );
      return rows.length > 0;
    },

    /**
     * One WAL flush covering every commit visible now, in any session of the cluster: a
     * synchronous commit that wrote WAL waits for the flush up to its own commit record, which
     * lies after every commit record already written (a commit that only took a transaction id
     * would not wait). One short round trip through the pool; the calls of this process share it
     * (shared-flush.ts: one runs, the callers meanwhile join the next), and concurrent statements
     * share the WAL flush (group commit). O(1).
     */
    syncRecords: sharedFlush(() => {
      const slot = Math.floor(Math.random() * SYNC_POINTS);
      return query(`UPDATE ${syncPoints} SET n = n + 1 WHERE slot = $1`, [slot], true);
    }),

    async listRecords(prefix: string, page: { cursor?: string; limit?: number } = {}) {
      const limit = page.limit ?? pageDefault;
      if (!Number.isSafeInteger(limit) || limit < 1) {
        throw new RunnerDepotError("INVALID_ARGUMENT", `listRecords limit must be a positive integer, not ${limit}`);
      }
      const take = Math.min(limit, 10_000);
      // The key column collates "C": byte order, and LIKE 'prefix%' can use the index.
      const pattern = prefix.replace(/[\\%_]/g, (c) => `\\${c}`) + "%";
      const params: unknown[] = [pattern, take + 1];
      let after = "";
      if (page.cursor !== undefined) {
        params.push(page.cursor);
        after = "AND key > $3";
      }
      const rows = await query<{ key: string }>(
        `SELECT key FROM ${t} WHERE key LIKE $1 ${after} ORDER BY key LIMIT $2`,
        params,
      );
      const keys = rows.slice(0, take).map((r) => r.key);
      return rows.length > take ? { keys, cursor: keys[keys.length - 1] } : { keys };
    },

    async close() {
      await pipeline?.close();
      await watch.close();
      await db.close();
    },
  };
}
