/**
 * What the PostgreSQL log store adds to its core (log-store.ts) for fan-out and archiving:
 * change events between replicas (log-notify.ts), the archive sweep's query and the
 * atomic "lines moved to the archive" step. Kept apart so the append path stays one file.
 */
import pg from "pg";
import { applyArchived } from "../../runner/service/job-state.js";
import type { ArchivedLog, JobLogStore, JobState } from "../../runner/ports.js";
import { createPostgresLogNotifier } from "./log-notify.js";
import { inTransaction, unavailable, type PostgresHandle } from "./schema.js";

/** Options of the extras (part of PostgresLogStoreOptions). */
export interface PostgresLogExtrasOptions {
  /** Send NOTIFY after each append and finish so followers on other replicas wake at once; default true. */
  notify?: boolean;
  /** Failures of the notification channel (followers fall back to polling meanwhile). */
  onNotifyError?: (error: unknown) => void;
}

/**
 * Wraps the core store: appends and finishes notify, plus `watch`, `archivable` and
 * `markArchived`.
 *
 * @example
 * return withPostgresLogExtras(db, schemaName, coreStore, options);
 */
export function withPostgresLogExtras(
  db: PostgresHandle,
  schemaName: string,
  core: JobLogStore,
  options: PostgresLogExtrasOptions = {},
): JobLogStore {
  const jobs = `${db.schema}.jobs`;
  const lines = `${db.schema}.job_lines`;
  const chunks = `${db.schema}.job_chunks`;
  // Its own connection, from the pool's settings: NOTIFYs never take a pool round trip.
  const notifier = createPostgresLogNotifier(() => new pg.Client(db.pool.options), schemaName, {
    onError: options.onNotifyError,
  });
  const notify = options.notify !== false;

  return {
    ...core,
    async append(requestId, at, entries, now) {
      const state = await core.append(requestId, at, entries, now);
      // After the commit: a follower woken by it reads committed lines.
      if (notify) notifier.publish(requestId, state.storedLines, state.status !== "open");
      return state;
    },
    async finish(requestId, result, finishOptions) {
      const out = await core.finish(requestId, result, finishOptions);
      if (notify && out.first) notifier.publish(requestId, out.state.storedLines, true);
      return out;
    },
    watch(listener) {
      return notifier.watch(listener);
    },
    async archivable(endedBefore: Date, limit: number) {
      // O(limit) on the partial index jobs_to_archive (ended, not archived).
      try {
        await db.ready();
        const out = await db.pool.query(
          `SELECT state FROM ${jobs} WHERE status <> 'open' AND NOT archived AND ended_at < $1
           ORDER BY ended_at LIMIT $2`,
          [endedBefore, limit],
        );
        return out.rows.map((r: { state: JobState }) => r.state);
      } catch (error) {
        throw unavailable(error);
      }
    },
    async markArchived(requestId: string, archived: ArchivedLog) {
      return inTransaction(db, async (client) => {
        const found = await client.query(`SELECT state FROM ${jobs} WHERE request_id = $1 FOR UPDATE`, [requestId]);
        const state = found.rows[0]?.state as JobState | undefined;
        if (!state) return null;
        if (!applyArchived(state, archived)) return state;
        await client.query(`UPDATE ${jobs} SET state = $2, archived = true WHERE request_id = $1`, [
          requestId,
          JSON.stringify(state),
        ]);
        // O(chunk rows of the job) on their (request_id, …) key; job_lines holds rows of
        // jobs stored before chunk rows existed.
        await client.query(`DELETE FROM ${chunks} WHERE request_id = $1`, [requestId]);
        await client.query(`DELETE FROM ${lines} WHERE request_id = $1`, [requestId]);
        return state;
      });
    },
    async close() {
      await notifier.close();
      await core.close?.();
    },
  };
}
