/**
 * Announced depot record writes between processes sharing one PostgreSQL schema (see
 * `WriteCondition.announce` and `RecordStore.watchRecords` in src/depot/ports.ts).
 * Why: docs/decisions/backends.md, "record-notify.ts: why the write itself notifies".
 */
import type { Client } from "pg";
import { createListenConnection } from "./listen-connection.js";

/** The channel of a schema's record announcements (an identifier of at most 63 bytes). */
export function recordChannelOf(schemaName: string): string {
  return `rdrec_${schemaName}`.slice(0, 63);
}

/** Keys longer than this are never announced, and a longer payload is not ours. */
export const MAX_ANNOUNCED_KEY = 1024;

/** One store's listening end. */
interface RecordWatch {
  watch(listener: (key: string | null) => void): () => void;
  close(): Promise<void>;
}

/**
 * Creates the listening end of a records store; nothing connects until the first watcher.
 *
 * @example
 * const watch = createRecordWatch(() => new pg.Client(pool.options), "runner_depot");
 * const stop = watch.watch((key) => console.log(key ?? "look again"));
 */
export function createRecordWatch(
  connect: () => Client,
  schemaName: string,
  options: { reconnectMaxMs?: number } = {},
): RecordWatch {
  const listeners = new Set<(key: string | null) => void>();

  function emit(key: string | null) {
    for (const listener of listeners) {
      try {
        listener(key);
      } catch {
        // A broken watcher must not break the others or the connection.
      }
    }
  }

  const connection = createListenConnection(connect, recordChannelOf(schemaName), {
    onPayload(payload) {
      if (payload.length > MAX_ANNOUNCED_KEY) return;
      emit(payload);
    },
    onConnected: () => emit(null),
    onLost: () => emit(null),
    reconnectMaxMs: options.reconnectMaxMs,
  });

  return {
    watch(listener) {
      listeners.add(listener);
      // Until the connection listens the watcher looks for itself; `null` says so.
      listener(null);
      void connection.open();
      return () => void listeners.delete(listener);
    },
    async close() {
      // Twice is harmless: the connection's close is idempotent and the set stays empty.
      listeners.clear();
      await connection.close();
    },
  };
}
