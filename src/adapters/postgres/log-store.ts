/**
 * Runner job logs on PostgreSQL, shared by several orchestrator replicas. A job is a row
 * in `jobs` (its state as JSON, plus the columns the lost-job and retention queries
 * need); its lines are rows of `job_lines`. Every append and finish runs in one
 * transaction holding the job's row lock (SELECT … FOR UPDATE), so two replicas that
 * receive the same job (a runner that reconnected elsewhere) can never interleave:
 * the offset rules are checked against the committed state and lines are inserted in
 * one multi-row statement.
 */
import type { PoolClient } from "pg";
import { RunnerDepotError } from "../../errors.js";
import { applyAppend, applyFinish, applyOpen, newEntries, newJobState } from "../../runner/job-state.js";
import type { JobInfo, JobLogStore, JobResult, JobState, LogEntry, StoredLine } from "../../runner/ports.js";
import { openPostgres, unavailable } from "./schema.js";
import type { PostgresOptions } from "./schema.js";

/** Options of {@link createPostgresLogStore}. */
export type PostgresLogStoreOptions = PostgresOptions;

/** Lines per INSERT statement: keeps one statement's parameters to a few MiB. */
const BATCH = 5000;

/**
 * Creates a {@link JobLogStore} on PostgreSQL.
 *
 * @example
 * const logs = createPostgresLogStore({ connectionString: process.env.DATABASE_URL });
 * const runner = createRunnerService(queue, { logs });
 */
export function createPostgresLogStore(options: PostgresLogStoreOptions): JobLogStore {
  const db = openPostgres(options);
  const jobs = `${db.schema}.jobs`;
  const lines = `${db.schema}.job_lines`;

  async function tx<T>(work: (client: PoolClient) => Promise<T>): Promise<T> {
    let client: PoolClient;
    try {
      await db.ready();
      client = await db.pool.connect();
    } catch (error) {
      throw unavailable(error);
    }
    let broken = false;
    // A checked-out client whose socket dies emits 'error': unheard, it would crash the host.
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
      await client.query("ROLLBACK").catch(() => {
        broken = true;
      });
      throw unavailable(error);
    } finally {
      client.removeListener("error", onError);
      // A connection that failed mid-transaction is not given back to the pool.
      client.release(broken ? true : undefined);
    }
  }

  async function run<R>(sql: string, params: unknown[]): Promise<R[]> {
    try {
      await db.ready();
      return (await db.pool.query(sql, params)).rows as R[];
    } catch (error) {
      throw unavailable(error);
    }
  }

  async function lock(client: PoolClient, requestId: string): Promise<JobState | null> {
    const out = await client.query(`SELECT state FROM ${jobs} WHERE request_id = $1 FOR UPDATE`, [requestId]);
    return out.rows[0] ? (out.rows[0].state as JobState) : null;
  }

  async function insertJob(client: PoolClient, state: JobState): Promise<boolean> {
    const out = await client.query(
      `INSERT INTO ${jobs} (request_id, status, last_seen_at, ended_at, state) VALUES ($1, $2, $3, $4, $5)
       ON CONFLICT (request_id) DO NOTHING`,
      [state.requestId, state.status, state.lastSeenAt, state.result?.endedAt ?? null, JSON.stringify(state)],
    );
    return out.rowCount === 1;
  }

  async function saveJob(client: PoolClient, state: JobState): Promise<void> {
    await client.query(
      `UPDATE ${jobs} SET status = $2, last_seen_at = $3, ended_at = $4, state = $5 WHERE request_id = $1`,
      [state.requestId, state.status, state.lastSeenAt, state.result?.endedAt ?? null, JSON.stringify(state)],
    );
  }

  /** Locks the job's row, creating the job first when absent. */
  async function lockOrCreate(client: PoolClient, requestId: string, now: Date): Promise<JobState> {
    const found = await lock(client, requestId);
    if (found) return found;
    // Another replica may create it between our SELECT and INSERT: then lock theirs.
    await insertJob(client, newJobState(requestId, now));
    const created = await lock(client, requestId);
    if (!created) throw new RunnerDepotError("INTERNAL", `job ${requestId} vanished`);
    return created;
  }

  async function insertLines(client: PoolClient, requestId: string, first: number, stored: StoredLine[]): Promise<void> {
    for (let i = 0; i < stored.length; i += BATCH) {
      const slice = stored.slice(i, i + BATCH);
      // unnest() of parallel arrays: one statement, three parameters, any row count.
      await client.query(
        `INSERT INTO ${lines} (request_id, position, line, stderr, marker)
         SELECT $1, $2::bigint + t.ord - 1, t.line, t.stderr, t.marker
         FROM unnest($3::bytea[], $4::boolean[], $5::boolean[]) WITH ORDINALITY AS t(line, stderr, marker, ord)`,
        [
          requestId,
          first + i,
          slice.map((l) => Buffer.from(l.line, "utf8")),
          slice.map((l) => l.stderr),
          slice.map((l) => l.marker === true),
        ],
      );
    }
  }

  return {
    async open(requestId: string, openOptions: { expect?: boolean; info?: JobInfo; now?: Date } = {}) {
      return tx(async (client) => {
        const now = openOptions.now ?? new Date();
        const fresh = newJobState(requestId, now, openOptions.expect ?? false, openOptions.info);
        if (await insertJob(client, fresh)) return fresh;
        const state = await lock(client, requestId);
        if (!state) throw new RunnerDepotError("INTERNAL", `job ${requestId} vanished`);
        if (applyOpen(state, openOptions)) await saveJob(client, state);
        return state;
      });
    },

    async get(requestId: string) {
      const rows = await run<{ state: JobState }>(`SELECT state FROM ${jobs} WHERE request_id = $1`, [requestId]);
      return rows[0]?.state ?? null;
    },

    async append(requestId: string, at: number, entries: LogEntry[], now: Date = new Date()) {
      return tx(async (client) => {
        const state = await lockOrCreate(client, requestId, now);
        const fresh = newEntries(state, at, entries);
        const firstLine = state.storedLines;
        const stored = applyAppend(state, fresh, now);
        await insertLines(client, requestId, firstLine, stored);
        await saveJob(client, state);
        return state;
      });
    },

    async finish(requestId: string, result: JobResult, finishOptions: { at?: number } = {}) {
      return tx(async (client) => {
        const state = await lockOrCreate(client, requestId, new Date(result.endedAt));
        const first = applyFinish(state, result, finishOptions.at);
        if (first) await saveJob(client, state);
        return { state, first };
      });
    },

    async read(requestId: string, from = 0, limit?: number) {
      const params: unknown[] = [requestId, from];
      let cap = "";
      if (limit !== undefined) {
        params.push(limit);
        cap = "LIMIT $3";
      }
      const rows = await run<{ line: Buffer; stderr: boolean; marker: boolean }>(
        `SELECT line, stderr, marker FROM ${lines} WHERE request_id = $1 AND position >= $2 ORDER BY position ${cap}`,
        params,
      );
      return rows.map((r) => {
        const line: StoredLine = { line: r.line.toString("utf8"), stderr: r.stderr };
        if (r.marker) line.marker = true;
        return line;
      });
    },

    async stale(before: Date) {
      const rows = await run<{ state: JobState }>(
        `SELECT state FROM ${jobs} WHERE status = 'open' AND last_seen_at < $1 ORDER BY last_seen_at`,
        [before],
      );
      return rows.map((r) => r.state);
    },

    async prune(before: Date) {
      return tx(async (client) => {
        const out = await client.query(
          `DELETE FROM ${jobs} WHERE status <> 'open' AND ended_at < $1 RETURNING request_id`,
          [before],
        );
        const ids = out.rows.map((r: { request_id: string }) => r.request_id);
        if (ids.length > 0) await client.query(`DELETE FROM ${lines} WHERE request_id = ANY($1::text[])`, [ids]);
        return ids.length;
      });
    },

    async close() {
      await db.close();
    },
  };
}
