/**
 * The PostgreSQL schema of the records and job-log adapters. Everything lives in one
 * schema (default `runner_depot`), so a host can keep it apart from its own tables and
 * tests can use a throw-away schema each.
 */
import pg from "pg";
import type { Pool, PoolClient, PoolConfig } from "pg";
import { RunnerDepotError } from "../../errors.js";

/** Options shared by the PostgreSQL adapters. */
export interface PostgresOptions {
  /** A pool the host owns (the adapter never ends a pool it was given). */
  pool?: Pool;
  /** Or a connection string for a pool the adapter creates and ends on close. */
  connectionString?: string;
  /**
   * Or a full pool configuration. Timeouts it leaves out get the defaults of
   * {@link POSTGRES_TIMEOUTS} (a pool the host gives should set its own).
   */
  poolConfig?: PoolConfig;
  /** Schema holding the tables; default `runner_depot`. Created when missing. */
  schema?: string;
  /** Create the tables on first use; default true. Set false when `migrate()` runs at deploy time. */
  autoMigrate?: boolean;
}

/**
 * Timeouts of a pool the adapter creates (and of its LISTEN connection): a database that
 * stops answering costs a call at most about connect + query time, then UNAVAILABLE, and a
 * connection that timed out is destroyed, never reused. docs/decisions/backends.md has the
 * figures behind them.
 */
export const POSTGRES_TIMEOUTS = {
  /** A new connection (TCP and startup) or a wait for a pooled one. */
  connectionTimeoutMillis: 5_000,
  /** Client side: a statement with no answer by then fails and its connection is destroyed. */
  query_timeout: 10_000,
  /** Server side: the server cancels a statement running longer (the connection stays good). */
  statement_timeout: 8_000,
  /** Server side: a transaction whose client went silent is rolled back, its row locks freed. */
  idle_in_transaction_session_timeout: 30_000,
  /** TCP keepalive, so a half-open idle connection is found out by the kernel too. */
  keepAlive: true,
  keepAliveInitialDelayMillis: 10_000,
} as const satisfies PoolConfig;

/** The pool configuration of a pool the adapter creates: the host's settings over the timeouts. */
export function poolConfigOf(options: PostgresOptions): PoolConfig {
  return { ...POSTGRES_TIMEOUTS, ...(options.poolConfig ?? { connectionString: options.connectionString }) };
}

/**
 * A failure that leaves the connection's state unknown (a timeout, a lost or reset socket),
 * as opposed to a statement the server refused (an SQLSTATE outside the connection classes).
 */
export function isConnectionFailure(error: unknown): boolean {
  return !(error instanceof RunnerDepotError) && !isStatementError(error);
}

/** A statement the server refused (an SQLSTATE), as opposed to a lost connection or a server going down. */
export function isStatementError(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === "string" && /^[0-9A-Z]{5}$/.test(code) && !/^(08|53|57|58)/.test(code);
}

const IDENT = /^[a-z_][a-z0-9_]{0,62}$/;
const MIGRATE_LOCK = 0x72756e6e; // "runn": one advisory lock for every schema.

/** The schema name, validated and quoted for SQL. */
function quoteSchema(schema = "runner_depot"): string {
  if (!IDENT.test(schema)) {
    throw new RunnerDepotError("INVALID_ARGUMENT", `schema must match ${IDENT}: ${JSON.stringify(schema)}`);
  }
  return `"${schema}"`;
}

function chunkColumns(compression: string): string {
  return `request_id text NOT NULL, first bigint NOT NULL, count integer NOT NULL,
          bytes bytea ${compression} NOT NULL, ends bytea NOT NULL, flags bytea NOT NULL,
          PRIMARY KEY (request_id, first)`;
}

function statements(s: string): string[] {
  return [
    `CREATE SCHEMA IF NOT EXISTS ${s}`,
    // Revisions come from one sequence, so a record deleted and created again never
    // reuses a revision a stale writer may still hold.
    `CREATE SEQUENCE IF NOT EXISTS ${s}.record_revision`,
    `CREATE TABLE IF NOT EXISTS ${s}.records (
       key text COLLATE "C" PRIMARY KEY,
       value json NOT NULL,
       revision bigint NOT NULL
     )`,
    // Depot blobs of up to 16 KiB (small-blobs.ts): hex digest → bytes. Stores from before it get the table at
    // their next open; their blobs stay in S3 and are still read there.
    `CREATE TABLE IF NOT EXISTS ${s}.small_blobs (
       digest text COLLATE "C" PRIMARY KEY,
       bytes bytea NOT NULL
     )`,
    // Rows a flush of the depot's asynchronous commits updates (records.ts, syncRecords):
    // one of 64 at random, so concurrent flushes rarely wait on one row lock.
    `CREATE TABLE IF NOT EXISTS ${s}.sync_points (slot integer PRIMARY KEY, n bigint NOT NULL)`,
    `INSERT INTO ${s}.sync_points (slot, n) SELECT g, 0 FROM generate_series(0, 63) AS g ON CONFLICT (slot) DO NOTHING`,
    // Room on each page (fillfactor) so an append's update of the job row can stay on its
    // page as a HOT update, writing no index entries (see SEEN_STEP in log-store.ts).
    `CREATE TABLE IF NOT EXISTS ${s}.jobs (
       request_id text PRIMARY KEY,
       status text NOT NULL,
       last_seen_at timestamptz NOT NULL,
       ended_at timestamptz,
       state json NOT NULL,
       created_at timestamptz NOT NULL DEFAULT now()
     ) WITH (fillfactor = 70)`,
    `CREATE INDEX IF NOT EXISTS jobs_open_last_seen ON ${s}.jobs (last_seen_at) WHERE status = 'open'`,
    `CREATE INDEX IF NOT EXISTS jobs_ended_at ON ${s}.jobs (ended_at) WHERE status <> 'open'`,
    // Job lists page newest first by (created_at, request_id); rows from before the column
    // existed get the migration's time. The second index serves a status filter.
    // The ALTER only when the column is missing: even a no-op ALTER takes an exclusive lock,
    // which would deadlock against replicas appending while another process migrates.
    `DO $$ BEGIN
       IF NOT EXISTS (SELECT 1 FROM information_schema.columns
                      WHERE table_schema = '${s.slice(1, -1)}' AND table_name = 'jobs' AND column_name = 'created_at') THEN
         ALTER TABLE ${s}.jobs ADD COLUMN created_at timestamptz NOT NULL DEFAULT now();
       END IF;
     END $$`,
    `CREATE INDEX IF NOT EXISTS jobs_created ON ${s}.jobs (created_at, request_id)`,
    `CREATE INDEX IF NOT EXISTS jobs_status_created ON ${s}.jobs (status, created_at, request_id)`,
    // Whether the job's log moved to the archive, as a column of its own: an index whose
    // predicate reads `state` (as jobs_unarchived of earlier releases did, on
    // state->>'archived') makes every update of `state`, so every append, a non-HOT update
    // that writes an entry into each index of the table. Added (and filled from the state,
    // the old index dropped) only when missing: a no-op ALTER would still lock the table.
    `DO $$ BEGIN
       IF NOT EXISTS (SELECT 1 FROM information_schema.columns
                      WHERE table_schema = '${s.slice(1, -1)}' AND table_name = 'jobs' AND column_name = 'archived') THEN
         ALTER TABLE ${s}.jobs ADD COLUMN archived boolean NOT NULL DEFAULT false;
         UPDATE ${s}.jobs SET archived = true WHERE (state->>'archived') IS NOT NULL;
         DROP INDEX IF EXISTS ${s}.jobs_unarchived;
       END IF;
     END $$`,
    // The archive sweep's query: ended jobs whose lines are still here, oldest end first.
    // Its predicate reads columns an append never changes (status, archived), so the job
    // row's update stays HOT (test/adapters/postgres/postgres-adapter.test.ts counts n_tup_hot_upd).
    `CREATE INDEX IF NOT EXISTS jobs_to_archive ON ${s}.jobs (ended_at) WHERE status <> 'open' AND NOT archived`,
    // Lines as UTF-8 bytes: PostgreSQL text cannot hold NUL, which a job may print.
    // Row per line: what earlier releases wrote; still read, no longer written.
    `CREATE TABLE IF NOT EXISTS ${s}.job_lines (
       request_id text NOT NULL,
       position bigint NOT NULL,
       line bytea NOT NULL,
       stderr boolean NOT NULL,
       marker boolean NOT NULL,
       PRIMARY KEY (request_id, position)
     )`,
    // A job's sections (runner/service/log-sections.ts), a row written only by appends that hold a section marker:
    // the job row's state stays small, so the appends without one cost what they did. Kept through archiving,
    // removed with the job. Stores from before it get the table at their next open and read as having none.
    `CREATE TABLE IF NOT EXISTS ${s}.job_sections (
       request_id text PRIMARY KEY,
       record json NOT NULL
     )`,
    // Lines in chunks (log-lines.ts says why): `first` is the position of the chunk's first
    // line. lz4 where the server has it (PostgreSQL 14+ built with it): pglz costs more CPU
    // than the insert. Created with it or without, never altered (an ALTER locks the table).
    `DO $$ BEGIN
       CREATE TABLE IF NOT EXISTS ${s}.job_chunks (${chunkColumns("COMPRESSION lz4")});
     EXCEPTION WHEN OTHERS THEN
       CREATE TABLE IF NOT EXISTS ${s}.job_chunks (${chunkColumns("")});
     END $$`,
  ];
}

/**
 * Creates the schema and tables of the PostgreSQL adapters if missing (idempotent, safe
 * to run from several processes at once).
 *
 * @example
 * await migrate(pool, { schema: "runner_depot" });
 */
export async function migrate(pool: Pool, options: { schema?: string } = {}): Promise<void> {
  const s = quoteSchema(options.schema);
  let client;
  try {
    client = await pool.connect();
  } catch (error) {
    throw unavailable(error);
  }
  const onError = () => {};
  client.on("error", onError);
  try {
    await client.query("BEGIN");
    // Concurrent CREATE … IF NOT EXISTS can still collide in the catalog: serialise.
    await client.query("SELECT pg_advisory_xact_lock($1)", [MIGRATE_LOCK]);
    for (const sql of statements(s)) await client.query(sql);
    await client.query("COMMIT");
  } catch (error) {
    await client.query("ROLLBACK").catch(() => {});
    throw unavailable(error);
  } finally {
    client.removeListener("error", onError);
    client.release();
  }
}

/** Pool, quoted schema and a once-only migration shared by the adapters. */
export interface PostgresHandle {
  pool: Pool;
  schema: string;
  ready(): Promise<void>;
  close(): Promise<void>;
}

/** Builds the shared handle from adapter options. */
export function openPostgres(options: PostgresOptions): PostgresHandle {
  const schemaName = options.schema ?? "runner_depot";
  const schema = quoteSchema(schemaName);
  const owns = !options.pool;
  const pool = options.pool ?? new pg.Pool(poolConfigOf(options));
  // An idle client losing its connection emits 'error' on the pool: without a
  // listener the host process would crash on a database restart.
  if (owns) pool.on("error", () => {});
  let migrated: Promise<void> | null = options.autoMigrate === false ? Promise.resolve() : null;
  let closed = false;
  return {
    pool,
    schema,
    ready() {
      if (closed) return Promise.reject(new RunnerDepotError("UNAVAILABLE", "PostgreSQL adapter closed"));
      if (!migrated) {
        migrated = migrate(pool, { schema: schemaName });
        // A failed migration (database down) is retried on the next call.
        migrated.catch(() => {
          migrated = null;
        });
      }
      return migrated;
    },
    async close() {
      if (closed) return;
      closed = true;
      if (owns) await pool.end();
    },
  };
}

/**
 * A one-row relation that turns `synchronous_commit` off until the end of the statement's own
 * (implicit) transaction: its commit then returns without waiting for the WAL flush. The
 * change is local, so the session is back to its setting for the next statement. Joined
 * into the write itself: no round trip of its own.
 */
export const ASYNC_COMMIT = `(SELECT set_config('synchronous_commit', 'off', true)) AS async_commit`;

/** Turns a database failure into UNAVAILABLE, keeping the cause; our own errors pass. */
export function unavailable(
  error: unknown,
  code: "UNAVAILABLE" | "STORE_UNAVAILABLE" = "UNAVAILABLE",
): RunnerDepotError {
  if (error instanceof RunnerDepotError) return error;
  const message = error instanceof Error ? error.message : String(error);
  return new RunnerDepotError(code, `PostgreSQL: ${message}`, { cause: error });
}

/**
 * Runs `work` in one transaction on a pooled client (BEGIN … COMMIT, ROLLBACK on failure,
 * failures as UNAVAILABLE). A checked-out client whose socket dies emits 'error': unheard,
 * it would crash the host; a connection that failed mid-transaction is not given back.
 */
export async function inTransaction<T>(db: PostgresHandle, work: (client: PoolClient) => Promise<T>): Promise<T> {
  let client: PoolClient;
  try {
    await db.ready();
    client = await db.pool.connect();
  } catch (error) {
    throw unavailable(error);
  }
  let broken = false;
  const onError = () => {
    broken = true;
  };
  client.on("error", onError);
  try {
    await client.query("BEGIN");
    const out = await work(client);
    await client.query("COMMIT");
    return out;
  } catch (error) {
    // A connection that timed out or broke has a statement still pending: no ROLLBACK to
    // queue behind it, the connection is destroyed (the server rolls back when it goes).
    if (isConnectionFailure(error)) broken = true;
    else
      await client.query("ROLLBACK").catch(() => {
        broken = true;
      });
    throw unavailable(error);
  } finally {
    client.removeListener("error", onError);
    client.release(broken ? true : undefined);
  }
}
