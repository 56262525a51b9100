/**
 * Runner job logs on PostgreSQL, shared by several orchestrator replicas. A job is a row
 * in `jobs` (its state as JSON, plus the columns the lost-job and retention queries
 * need); its lines are rows of `job_lines`.
 * Why: docs/decisions/runner-throughput.md, "log-store.ts (PostgreSQL): one statement per append".
 */
import type { PoolClient } from "pg";
import { RunnerDepotError } from "../../errors.js";
import {
  planAppend as planStoreAppend,
  applyFinish,
  applyOpen,
  cloneJobState,
  newEntries,
  newJobState,
} from "../../runner/service/job-state.js";
import { createdAtOf } from "../../runner/service/job-list.js";
import { emptySections, foldSections } from "../../runner/service/log-sections.js";
import type {
  JobInfo,
  JobListQuery,
  JobLogStore,
  JobResult,
  JobState,
  LogEntry,
  LogReadOptions,
  LogSections,
  StoredLine,
} from "../../runner/ports.js";
import { createGroupRunner } from "./log-group.js";
import {
  chunksFrom,
  LINE_META_BYTES,
  CUT_PLACEHOLDER,
  decodeRows,
  holdsCutPlaceholder,
  encodeGroup,
  rawRows,
  encodeLines,
  intArray,
  MAX_STATEMENT_CHARS,
  statementCuts,
} from "./log-lines.js";
import type { ChunkRow } from "./log-lines.js";
import { inTransaction, isStatementError, openPostgres, unavailable } from "./schema.js";
import type { PostgresOptions } from "./schema.js";
import { withPostgresLogExtras, type PostgresLogExtrasOptions } from "./log-store-notify-archive.js";
import { readsLineEntries } from "../../runner/protocol/received-line.js";
import { readKept } from "../../runner/service/log-tail.js";
import { maxBytesOf, pageBudget } from "../../runner/service/page-budget.js";

/**
 * The `last_seen_at` column moves only in steps of this much.
 * Why: docs/decisions/runner-throughput.md, "log-store.ts: SEEN_STEP".
 */
const SEEN_STEP = "10 seconds";

function coarseSeen(value: string): string {
  return `CASE WHEN ${value} >= j.last_seen_at + interval '${SEEN_STEP}' OR ${value} < j.last_seen_at THEN ${value} ELSE j.last_seen_at END`;
}

/** Options of {@link createPostgresLogStore}. */
export interface PostgresLogStoreOptions extends PostgresOptions, PostgresLogExtrasOptions {
  /**
   * Append statements (and job-row reads) in flight at once, default 4 each (group commit):
   * calls made meanwhile wait and go together in the next statement. Keep the sum below the pool's size.
   */
  groupStatements?: number;
}

/**
 * Job rows remembered for the one-statement append (state and its exact JSON text).
 * A forgotten job costs one locking transaction on its next append, nothing more.
 */
const KNOWN_JOBS = 4096;

interface Known {
  state: JobState;
  /** The row's `state` column, byte for byte (json keeps its input text). */
  text: string;
  /** The job's `job_sections` record as committed with that state; undefined: not known here (read under the lock). */
  sections?: LogSections;
}

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
  const chunks = `${db.schema}.job_chunks`;
  const sectionsTable = `${db.schema}.job_sections`;
  const insertChunks = `INSERT INTO ${chunks} (request_id, first, count, bytes, ends, flags)`;

  const tx = <T>(work: (client: PoolClient) => Promise<T>): Promise<T> => inTransaction(db, work);

  async function run<R>(sql: string, params: unknown[]): Promise<R[]> {
    try {
      await db.ready();
      return (await db.pool.query(sql, params)).rows as R[];
    } catch (error) {
      throw unavailable(error);
    }
  }

  // Insertion order is age: the oldest entry goes first when the map is full. O(1) per call.
  const known = new Map<string, Known>();
  function remember(state: JobState, text: string, sections?: LogSections): void {
    known.delete(state.requestId);
    if (state.status !== "open") return; // an ended job takes no more appends
    if (known.size >= KNOWN_JOBS) known.delete(known.keys().next().value!);
    known.set(state.requestId, sections === undefined ? { state, text } : { state, text, sections });
  }

  /** The job's committed section record (none: an empty one), read under its row lock. O(sections). */
  async function lockedSections(client: PoolClient, requestId: string): Promise<LogSections> {
    const out = await client.query(`SELECT record FROM ${sectionsTable} WHERE request_id = $1`, [requestId]);
    return (out.rows[0]?.record as LogSections | undefined) ?? emptySections();
  }

  async function saveSections(client: PoolClient, requestId: string, record: LogSections): Promise<void> {
    await client.query(
      `INSERT INTO ${sectionsTable} (request_id, record) VALUES ($1, $2)
       ON CONFLICT (request_id) DO UPDATE SET record = excluded.record`,
      [requestId, JSON.stringify(record)],
    );
  }

  /** Locks the job's row; the state as stored (parsed here, so its exact text is known). */
  async function lock(client: PoolClient, requestId: string): Promise<JobState | null> {
    const out = await client.query(`SELECT state::text AS text FROM ${jobs} WHERE request_id = $1 FOR UPDATE`, [
      requestId,
    ]);
    const text = out.rows[0]?.text as string | undefined;
    if (text === undefined) return null;
    const state = JSON.parse(text) as JobState;
    remember(state, text);
    return cloneJobState(state);
  }

  async function insertJob(client: PoolClient | null, state: JobState): Promise<boolean> {
    const text = JSON.stringify(state);
    const out = await (client ?? db.pool).query(
      `INSERT INTO ${jobs} (request_id, status, last_seen_at, ended_at, state, created_at) VALUES ($1, $2, $3, $4, $5, $6)
       ON CONFLICT (request_id) DO NOTHING`,
      [state.requestId, state.status, state.lastSeenAt, state.result?.endedAt ?? null, text, createdAtOf(state)],
    );
    if (out.rowCount === 1) remember(cloneJobState(state), text);
    return out.rowCount === 1;
  }

  async function saveJob(client: PoolClient, state: JobState, sections?: LogSections): Promise<void> {
    const text = JSON.stringify(state);
    await client.query(
      `UPDATE ${jobs} SET status = $2, last_seen_at = $3, ended_at = $4, state = $5 WHERE request_id = $1`,
      [state.requestId, state.status, state.lastSeenAt, state.result?.endedAt ?? null, text],
    );
    remember(cloneJobState(state), text, sections);
  }

  interface Swap {
    /** Characters of `stored` (a group's size bound). */
    chars: number;
    was: Known;
    state: JobState;
    text: string;
    first: number;
    stored: StoredLine[];
    /** The section record after this append when it changed (its JSON written with the lines), else undefined. */
    sections?: LogSections;
    /** The record to remember once swapped (changed or not), undefined when not known. */
    keep?: LogSections;
  }

  /**
   * The one-statement append, for a group of jobs at once (log-group.ts): for each job, swaps
   * its row from `was` to `state` (the row lock) and inserts its lines from position `first`,
   * or does neither. True for the jobs it did. O(bytes of all lines + jobs).
   */
  async function swapAppends(group: Swap[]): Promise<boolean[]> {
    const batch = encodeGroup(group);
    let out;
    try {
      out = await db.pool.query(
        // The states travel as two JSON arrays, not text[]: pg writes a text[] parameter as an
        // array literal, two regex replaces and a copy per element (and did so twice a query),
        // about a third of the fleet server's allocations (bench BENCH_FLEET_ALLOC); one
        // JSON.stringify each is native and copies once. json_array_elements_text gives back
        // the same strings.
        `WITH i AS (
         SELECT u.id, o.old, n.new, u.seen, u.k
         FROM unnest($1::text[], $4::timestamptz[]) WITH ORDINALITY AS u(id, seen, k)
         JOIN json_array_elements_text($2::json) WITH ORDINALITY AS o(old, k) ON o.k = u.k
         JOIN json_array_elements_text($3::json) WITH ORDINALITY AS n(new, k) ON n.k = u.k
       ), upd AS (
         UPDATE ${jobs} j SET last_seen_at = ${coarseSeen("i.seen")}, state = i.new::json
         FROM i WHERE j.request_id = i.id AND j.status = 'open' AND j.state::text = i.old
         RETURNING j.request_id
       ), c AS (
         SELECT a[6 * g - 5] AS k, a[6 * g - 4] AS first, a[6 * g - 3]::int AS l0, a[6 * g - 2]::int AS n,
                a[6 * g - 1]::int AS b0, a[6 * g]::int AS bn
         FROM (SELECT $8::bigint[] AS a) AS arr, generate_series(1, cardinality(arr.a) / 6) AS g
       ), ins AS (
         ${insertChunks}
         SELECT i.id, c.first, c.n, substring($5::bytea FROM c.b0 + 1 FOR c.bn),
                substring($6::bytea FROM 4 * c.l0 + 1 FOR 4 * c.n), substring($7::bytea FROM ${LINE_META_BYTES} * c.l0 + 1 FOR ${LINE_META_BYTES} * c.n)
         FROM c JOIN i ON i.k = c.k JOIN upd ON upd.request_id = i.id
       ), sec AS (
         INSERT INTO ${sectionsTable} (request_id, record)
         SELECT i.id, s.rec::json FROM json_array_elements_text($9::json) WITH ORDINALITY AS s(rec, k)
         JOIN i ON i.k = s.k JOIN upd ON upd.request_id = i.id
         WHERE s.rec IS NOT NULL
         ON CONFLICT (request_id) DO UPDATE SET record = excluded.record
       )
       SELECT request_id FROM upd`,
        [
          group.map((g) => g.state.requestId),
          JSON.stringify(group.map((g) => g.was.text)),
          JSON.stringify(group.map((g) => g.text)),
          group.map((g) => g.state.lastSeenAt),
          batch.bytes,
          batch.ends,
          batch.flags,
          batch.cuts,
          // Only the jobs whose sections changed carry a record (null for the rest): O(sections) for those alone.
          JSON.stringify(group.map((g) => (g.sections ? JSON.stringify(g.sections) : null))),
        ],
      );
    } catch (error) {
      // One job's bad row (a constraint) must not fail the others: each retries alone, under the lock.
      if (group.length > 1 && isStatementError(error)) return group.map(() => false);
      throw error;
    }
    const swapped = new Set(out.rows.map((r: { request_id: string }) => r.request_id));
    return group.map((g) => {
      if (!swapped.has(g.state.requestId)) return false;
      remember(g.state, g.text, g.keep);
      return true;
    });
  }

  /** Reads of job rows made meanwhile go in one statement (log-group.ts). O(jobs). */
  const groupGet = createGroupRunner(
    async (ids: string[]): Promise<(JobState | null)[]> => {
      const out = await db.pool.query(
        `SELECT request_id, state::text AS text FROM ${jobs} WHERE request_id = ANY($1::text[])`,
        [ids],
      );
      const texts = new Map<string, string>(
        out.rows.map((r: { request_id: string; text: string }) => [r.request_id, r.text]),
      );
      return ids.map((id) => {
        const text = texts.get(id);
        if (text === undefined) return null;
        const state = JSON.parse(text) as JobState;
        if (state.status === "open") remember(JSON.parse(text) as JobState, text);
        return state;
      });
    },
    { inFlight: options.groupStatements ?? 4, maxItems: 1000 },
  );

  // Jobs with a swap queued or in flight: a second append of one (a caller that does not
  // serialise its own) takes the locking transaction instead of joining the same statement.
  const swapping = new Set<string>();
  const groupAppend = createGroupRunner(swapAppends, {
    inFlight: options.groupStatements ?? 4,
    maxItems: 1000,
    maxWeight: MAX_STATEMENT_CHARS,
    weight: (swap) => swap.chars,
  });

  /** The one-statement finish: swaps the row from `was` to the ended `state`. */
  async function swapFinish(was: Known, state: JobState): Promise<boolean> {
    const text = JSON.stringify(state);
    const out = await db.pool.query(
      `UPDATE ${jobs} SET status = $2, last_seen_at = $3, ended_at = $4, state = $5
       WHERE request_id = $1 AND status = 'open' AND state::text = $6`,
      [state.requestId, state.status, state.lastSeenAt, state.result?.endedAt ?? null, text, was.text],
    );
    if (out.rowCount !== 1) return false;
    known.delete(state.requestId);
    return true;
  }

  /** What `append` can do in one statement from the remembered row, or null (then the transaction decides). */
  function planAppend(requestId: string, at: number, entries: LogEntry[], now: Date) {
    const was = known.get(requestId);
    // The remembered row only ever says yes: a refusal (gap, closed job) is for the committed state to give.
    if (!was || was.state.status !== "open" || !Number.isSafeInteger(at) || at < 0 || at > was.state.committed)
      return null;
    const state = cloneJobState(was.state);
    const fresh = newEntries(state, at, entries);
    let first = state.storedLines;
    const cutBefore = state.cut !== undefined;
    const plan = planStoreAppend(state, fresh, now);
    // One run and no drop go in one statement (also a cut log's tail within a segment); the rest (the cut's start,
    // a segment dropped) under the lock.
    if (plan.drop.length > 0 || plan.runs.length > 1 || (state.cut !== undefined && !cutBefore)) return null;
    const stored = plan.runs[0]?.lines ?? [];
    if (plan.runs[0]) first = plan.runs[0].first;
    // A marker needs the committed record to fold into: unknown here, the transaction reads it under the lock.
    const probe = foldSections(undefined, stored, first);
    if (probe !== undefined && was.sections === undefined) return null;
    const sections = probe === undefined ? undefined : foldSections(was.sections, stored, first);
    const keep = sections ?? was.sections;
    let chars = 0;
    for (const l of stored) chars += l.line.length;
    return chars <= MAX_STATEMENT_CHARS ? { was, state, first, stored, chars, sections, keep } : null;
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

  async function insertLines(
    client: PoolClient,
    requestId: string,
    first: number,
    stored: StoredLine[],
  ): Promise<void> {
    let from = 0;
    for (const to of statementCuts(stored)) {
      const batch = encodeLines(stored, from, to);
      await client.query(`${insertChunks} ${chunksFrom(1)}`, [
        requestId,
        first + from,
        batch.bytes,
        batch.ends,
        batch.flags,
        intArray(batch.cuts),
      ]);
      from = to;
    }
  }

  /**
   * The rows holding lines `from` … `from + limit - 1`.
   * Why: docs/decisions/runner-throughput.md, "log-store.ts: createPostgresLogStore.readRows".
   */
  function readRows(
    requestId: string,
    from: number,
    limit: number | undefined,
    maxBytes?: number,
  ): Promise<ChunkRow[]> {
    const to = limit === undefined ? null : from + limit;
    const rows = `SELECT first, bytes, ends, flags FROM ${chunks}
       WHERE request_id = $1 AND ($3::bigint IS NULL OR first < $3)
         AND first >= COALESCE((SELECT max(first) FROM ${chunks} WHERE request_id = $1 AND first <= $2), 0)
       UNION ALL
       SELECT position, line, NULL, set_byte('\\x00'::bytea, 0, stderr::int | (marker::int << 1)) FROM ${lines}
       WHERE request_id = $1 AND position >= $2 AND ($3::bigint IS NULL OR position < $3)`;
    if (maxBytes === undefined) return run<ChunkRow>(`${rows} ORDER BY 1`, [requestId, from, to]);
    // The read's byte bound, in the server: rows while the bytes before them are under it (the first always), so a
    // page brings at most maxBytes and one row (a chunk is at most CHUNK_BYTES). octet_length does not detoast.
    return run<ChunkRow>(
      `SELECT first, bytes, ends, flags FROM (
         SELECT r.*, sum(octet_length(r.bytes)) OVER (ORDER BY r.first ROWS UNBOUNDED PRECEDING)
                     - octet_length(r.bytes) AS before
         FROM (${rows}) r
       ) w WHERE before < $4 ORDER BY first`,
      [requestId, from, to, maxBytes],
    );
  }

  // NOTIFY, watch and the archive steps live in adapters/postgres/log-store-notify-archive.ts.
  // Reads entries by their fields only: handed received lines as entries (runner/protocol/received-line.ts).
  return readsLineEntries(
    withPostgresLogExtras(
      db,
      options.schema ?? "runner_depot",
      {
        async open(requestId: string, openOptions: { expect?: boolean; info?: JobInfo; now?: Date } = {}) {
          const now = openOptions.now ?? new Date();
          const fresh = newJobState(requestId, now, openOptions.expect ?? false, openOptions.info);
          // A new job is one INSERT on its own (one round trip); an existing one is locked and merged.
          try {
            await db.ready();
            if (await insertJob(null, fresh)) return fresh;
          } catch (error) {
            throw unavailable(error);
          }
          return tx(async (client) => {
            const state = await lock(client, requestId);
            if (!state) throw new RunnerDepotError("INTERNAL", `job ${requestId} vanished`);
            if (applyOpen(state, openOptions)) await saveJob(client, state);
            return state;
          });
        },

        async get(requestId: string) {
          try {
            await db.ready();
            return await groupGet(requestId);
          } catch (error) {
            throw unavailable(error);
          }
        },

        async append(requestId: string, at: number, entries: LogEntry[], now: Date = new Date()) {
          const plan = planAppend(requestId, at, entries, now);
          if (plan) {
            try {
              await db.ready();
              if (!swapping.has(requestId)) {
                swapping.add(requestId);
                const swapped = await groupAppend({ ...plan, text: JSON.stringify(plan.state) }).finally(() =>
                  swapping.delete(requestId),
                );
                if (swapped) return cloneJobState(plan.state);
              }
            } catch (error) {
              // The outcome is unknown (the statement may have committed): forget the row, so the
              // next append reads it under the lock instead of swapping from a stale text.
              known.delete(requestId);
              throw unavailable(error);
            }
          }
          return tx(async (client) => {
            const state = await lockOrCreate(client, requestId, now);
            const fresh = newEntries(state, at, entries);
            const cutBefore = state.cut !== undefined;
            const plan = planStoreAppend(state, fresh, now);
            // A cut's start leaves a placeholder row at the marker's position: reads that meet it ask the state.
            if (state.cut && !cutBefore) await insertLines(client, requestId, state.cut.at, [CUT_PLACEHOLDER]);
            for (const { first, end } of plan.drop) {
              await client.query(`DELETE FROM ${chunks} WHERE request_id = $1 AND first >= $2 AND first < $3`, [
                requestId,
                first,
                end,
              ]);
            }
            for (const run of plan.runs) await insertLines(client, requestId, run.first, run.lines);
            // The record is read (and written) only for an append holding a marker.
            let sections: LogSections | undefined;
            for (const run of plan.runs) {
              if (foldSections(undefined, run.lines, run.first) === undefined) continue;
              sections = foldSections(sections ?? (await lockedSections(client, requestId)), run.lines, run.first)!;
            }
            if (sections) await saveSections(client, requestId, sections);
            await saveJob(client, state, sections);
            return state;
          });
        },

        async finish(requestId: string, result: JobResult, finishOptions: { at?: number } = {}) {
          const was = known.get(requestId);
          if (was && (finishOptions.at === undefined || finishOptions.at === was.state.committed)) {
            const state = cloneJobState(was.state);
            if (applyFinish(state, result, finishOptions.at)) {
              try {
                await db.ready();
                if (await swapFinish(was, state)) return { state: cloneJobState(state), first: true };
              } catch (error) {
                known.delete(requestId);
                throw unavailable(error);
              }
            }
          }
          return tx(async (client) => {
            const state = await lockOrCreate(client, requestId, new Date(result.endedAt));
            const first = applyFinish(state, result, finishOptions.at);
            if (first) await saveJob(client, state);
            return { state, first };
          });
        },

        async read(requestId: string, from = 0, limit?: number, options?: LogReadOptions) {
          const maxBytes = maxBytesOf(options);
          const budget = pageBudget(options);
          const rows = await readRows(requestId, from, limit, maxBytes);
          // Rows that hold a cut's placeholder: the dropped range is in reach, the state says where (log-tail.ts).
          if (!rows.some(holdsCutPlaceholder)) return decodeRows(rows, from, limit, budget);
          const state = await groupGet(requestId);
          if (!state) return [];
          return readKept(
            state,
            from,
            limit ?? Number.MAX_SAFE_INTEGER,
            async (a, b) => decodeRows(await readRows(requestId, a, b - a, maxBytes), a, b - a, budget),
            budget,
          );
        },

        async sections(requestId: string) {
          // O(sections) on the primary keys: the job row says whether the job exists, its sections row what it has.
          const rows = await run<{ record: LogSections | null }>(
            `SELECT s.record FROM ${jobs} j LEFT JOIN ${sectionsTable} s ON s.request_id = j.request_id
             WHERE j.request_id = $1`,
            [requestId],
          );
          if (rows.length === 0) return null;
          return rows[0]!.record ?? emptySections();
        },

        async readRaw(requestId: string, from: number, limit: number, options?: LogReadOptions) {
          return rawRows(await readRows(requestId, from, limit, maxBytesOf(options)), from, limit, pageBudget(options));
        },

        async stale(before: Date) {
          const rows = await run<{ state: JobState }>(
            // The column is at most SEEN_STEP behind the state (never ahead): it narrows, the state decides.
            `SELECT state FROM ${jobs} WHERE status = 'open' AND last_seen_at < $1 AND (state->>'lastSeenAt')::timestamptz < $1
         ORDER BY last_seen_at`,
            [before],
          );
          return rows.map((r) => r.state);
        },

        async list(query: JobListQuery) {
          // O(limit) on the (status,) created_at, request_id indexes; the ORDER BY matches them.
          const params: unknown[] = [query.limit];
          const where: string[] = [];
          if (query.status) {
            params.push(query.status);
            where.push(`status = ANY($${params.length}::text[])`);
          }
          if (query.before) {
            params.push(query.before.createdAt, query.before.requestId);
            where.push(`(created_at, request_id) < ($${params.length - 1}::timestamptz, $${params.length})`);
          }
          const rows = await run<{ state: JobState; created_at: Date }>(
            `SELECT state, created_at FROM ${jobs} ${where.length ? `WHERE ${where.join(" AND ")}` : ""}
         ORDER BY created_at DESC, request_id DESC LIMIT $1`,
            params,
          );
          // The column is the key (rows from before it existed have none in their JSON).
          return rows.map((r) => ({ ...r.state, createdAt: r.created_at.toISOString() }));
        },

        async prune(before: Date) {
          return tx(async (client) => {
            const out = await client.query(
              `DELETE FROM ${jobs} WHERE status <> 'open' AND ended_at < $1 RETURNING request_id`,
              [before],
            );
            const ids = out.rows.map((r: { request_id: string }) => r.request_id);
            for (const id of ids) known.delete(id);
            if (ids.length > 0) {
              await client.query(`DELETE FROM ${chunks} WHERE request_id = ANY($1::text[])`, [ids]);
              await client.query(`DELETE FROM ${lines} WHERE request_id = ANY($1::text[])`, [ids]);
              await client.query(`DELETE FROM ${sectionsTable} WHERE request_id = ANY($1::text[])`, [ids]);
            }
            return ids.length;
          });
        },

        async close() {
          known.clear();
          await db.close();
        },
      },
      options,
    ),
  );
}
