/**
 * The records store's pipelined connections (pipeline.ts): many statements at once on a few connections,
 * each still its own transaction; a failing statement fails alone; a broken connection is replaced.
 */
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createPostgresRecords } from "../../../src/adapters/postgres/index.js";
import { createPipeline } from "../../../src/adapters/postgres/pipeline.js";
import { ASYNC_COMMIT } from "../../../src/adapters/postgres/schema.js";
import { createTestSchema, needs, POSTGRES_URL } from "../../fixtures/backends.js";

let db: Awaited<ReturnType<typeof createTestSchema>>;
const haveDatabase = needs("postgres");

beforeAll(async () => {
  if (haveDatabase) db = await createTestSchema();
});
afterAll(async () => {
  await db?.drop();
});

/** Server sessions with this application_name. */
async function sessions(name: string): Promise<number[]> {
  const rows = await db.pool.query("SELECT pid FROM pg_stat_activity WHERE application_name = $1", [name]);
  return rows.rows.map((r: { pid: number }) => r.pid);
}

describe.skipIf(!haveDatabase)("postgres records: pipelined statements", () => {
  it("200 reads and asynchronous writes at once run on the store's 2 connections, not the host's pool", async () => {
    const name = `rd_pipe_${process.pid}_a`;
    const pool = new pg.Pool({ connectionString: POSTGRES_URL, max: 16, application_name: name });
    pool.on("error", () => {});
    const records = createPostgresRecords({ pool, schema: db.schema });
    try {
      await records.getRecord("warm"); // the migration's one pooled connection
      const keys = Array.from({ length: 100 }, (_, i) => `pipe/${i}`);
      const revisions = await Promise.all(
        keys.map((key, i) => records.putRecord(key, { i }, { ifRevision: null, deferSync: true })),
      );
      expect(revisions.every((r) => r !== null)).toBe(true);
      const read = await Promise.all(keys.map((key) => records.getRecord(key)));
      expect(read.map((r) => r?.value)).toEqual(keys.map((_, i) => ({ i })));
      expect(pool.totalCount).toBeLessThanOrEqual(1); // the migration's, unless it idled out
      expect((await sessions(name)).length - pool.totalCount).toBe(2); // the store's two
      // A write that waits for its flush goes through the pool, as syncRecords does.
      await records.putRecord("pipe/durable", 1, { ifRevision: null });
      await records.syncRecords!();
      expect(pool.totalCount).toBe(1);
      expect((await sessions(name)).length).toBe(3);
    } finally {
      await records.close?.();
      await pool.end();
    }
  });

  it("a statement that fails ends with its own Sync: the statements sent with it are answered", async () => {
    const records = createPostgresRecords({ pool: db.pool, schema: db.schema, pipelineConnections: 1 });
    try {
      const created = await records.putRecord("pipe/ok", "v", { ifRevision: null, lazy: true });
      // A NUL in a text parameter is refused by the server (22021) while the others run on the same connection.
      const outcomes = await Promise.allSettled([
        records.getRecord("pipe/ok"),
        records.getRecord("bad\u0000key"),
        records.putRecord("pipe/after", "w", { ifRevision: null, lazy: true }),
        records.getRecord("pipe/ok"),
      ]);
      expect(outcomes.map((o) => o.status)).toEqual(["fulfilled", "rejected", "fulfilled", "fulfilled"]);
      expect((outcomes[1] as PromiseRejectedResult).reason).toMatchObject({ code: "STORE_UNAVAILABLE" });
      expect((outcomes[3] as PromiseFulfilledResult<unknown>).value).toEqual({ value: "v", revision: created });
      expect((await records.getRecord("pipe/after"))?.value).toBe("w");
    } finally {
      await records.close?.();
    }
  });

  it("an asynchronous commit's setting ends with its statement: the next one on the connection commits synchronously", async () => {
    const pipeline = createPipeline(() => ({ connectionString: POSTGRES_URL }), 1);
    try {
      const [async, after] = await Promise.all([
        pipeline.query<{ s: string }>({
          text: `SELECT current_setting('synchronous_commit') AS s FROM ${ASYNC_COMMIT}`,
        }),
        pipeline.query<{ s: string }>({ text: "SELECT current_setting('synchronous_commit') AS s" }),
      ]);
      expect(async[0]!.s).toBe("off");
      expect(after[0]!.s).toBe("on");
    } finally {
      await pipeline.close();
    }
  });

  it("a connection the server ends fails what it carried as STORE_UNAVAILABLE and is replaced on next use", async () => {
    const name = `rd_pipe_${process.pid}_b`;
    const pool = new pg.Pool({ connectionString: POSTGRES_URL, max: 4, application_name: name });
    pool.on("error", () => {});
    const records = createPostgresRecords({ pool, schema: db.schema, pipelineConnections: 1 });
    try {
      await records.putRecord("pipe/k", 1, { ifRevision: null, lazy: true });
      const before = await sessions(name); // the store's one, and the pool's unless it idled out
      expect(before.length).toBeGreaterThanOrEqual(1);
      const inFlight = records.getRecord("pipe/k").catch((error: unknown) => error);
      for (const pid of before) await db.pool.query("SELECT pg_terminate_backend($1)", [pid]);
      // Answered before the end, or failed by it: never left hanging, never another kind of error.
      const outcome = await inFlight;
      if (outcome instanceof Error) expect(outcome).toMatchObject({ code: "STORE_UNAVAILABLE" });
      await new Promise((resolve) => setTimeout(resolve, 100)); // the ends reach the clients
      expect((await records.getRecord("pipe/k"))?.value).toBe(1);
      const after = await sessions(name);
      expect(after.some((pid) => before.includes(pid))).toBe(false);
    } finally {
      await records.close?.();
      await pool.end();
    }
  });

  it("with pipelineConnections 0 every statement goes through the pool", async () => {
    const name = `rd_pipe_${process.pid}_c`;
    const pool = new pg.Pool({ connectionString: POSTGRES_URL, max: 4, application_name: name });
    pool.on("error", () => {});
    const records = createPostgresRecords({ pool, schema: db.schema, pipelineConnections: 0 });
    try {
      await Promise.all(Array.from({ length: 20 }, (_, i) => records.getRecord(`none/${i}`)));
      expect(pool.totalCount).toBeGreaterThan(1);
      expect((await sessions(name)).length).toBe(pool.totalCount);
    } finally {
      await records.close?.();
      await pool.end();
    }
  });
});
