/** PostgreSQL adapters: the records and job-log conformance suites against a real server. */
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { composeStore } from "../../../src/depot/store/compose.js";
import { createPostgresLogStore, createPostgresRecords, migrate } from "../../../src/adapters/postgres/index.js";
import { createMemoryStore } from "../../../src/adapters/memory/store.js";
import { describeJobLogStore, describePackageStore, logEntry, sampleJobResult } from "../../../src/testing/index.js";
import { createTestSchema, needs, POSTGRES_URL, startProxyFor } from "../../fixtures/backends.js";
import type { TcpProxy } from "../../fixtures/backends.js";

let db: Awaited<ReturnType<typeof createTestSchema>>;
let proxy: TcpProxy;
const haveDatabase = needs("postgres");

beforeAll(async () => {
  if (!haveDatabase) return;
  db = await createTestSchema();
  proxy = await startProxyFor(POSTGRES_URL, 5432);
});
afterAll(async () => {
  await proxy?.close();
  await db?.drop();
});

// Every store goes through the proxy, so the outage cases can cut the database off.
const viaProxy = () => ({ connectionString: proxy.url(POSTGRES_URL), schema: db.schema, poolConfig: undefined });

describeJobLogStore("postgres", () => createPostgresLogStore(viaProxy()), {
  reopen: () => createPostgresLogStore(viaProxy()),
  outage: { break: () => proxy.break(), heal: () => proxy.heal() },
});

// Records only: the blob half runs against S3 in adapter-s3 and backends-depot.
describePackageStore(
  "postgres records",
  () => composeStore({ blobs: createMemoryStore(), records: createPostgresRecords(viaProxy()) }),
  {
    reopen: () => composeStore({ blobs: createMemoryStore(), records: createPostgresRecords(viaProxy()) }),
    racers: 24,
    only: "records",
    outage: { break: () => proxy.break(), heal: () => proxy.heal() },
  },
);

describe("postgres adapters: extra cases", () => {
  it("migrate is idempotent and safe to run concurrently", async () => {
    const other = await createTestSchema();
    try {
      await Promise.all([migrate(other.pool, { schema: other.schema }), migrate(other.pool, { schema: other.schema })]);
      await migrate(other.pool, { schema: other.schema });
      const tables = await other.pool.query(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = $1 ORDER BY table_name",
        [other.schema],
      );
      expect(tables.rows.map((r) => r.table_name)).toEqual([
        "job_chunks",
        "job_lines",
        "job_sections",
        "jobs",
        "records",
        "small_blobs",
        "sync_points",
      ]);
    } finally {
      await other.drop();
    }
  });

  it("a jobs table from before created_at gains the column and its jobs are listed", async () => {
    const other = await createTestSchema();
    const s = `"${other.schema}"`;
    try {
      // The table as earlier releases created it, with one job in it.
      await other.pool.query(`CREATE SCHEMA IF NOT EXISTS ${s}`);
      await other.pool.query(
        `CREATE TABLE ${s}.jobs (request_id text PRIMARY KEY, status text NOT NULL, last_seen_at timestamptz NOT NULL, ended_at timestamptz, state json NOT NULL)`,
      );
      const id = "0b6f0c9e-4a8e-4c41-9d7e-1f1f1f1f1f1f";
      const oldState = {
        requestId: id,
        status: "open",
        committed: 0,
        storedLines: 0,
        storedBytes: 0,
        lines: { stdout: 0, stderr: 0 },
        logTruncated: false,
        expected: true,
        info: {},
        startedAt: null,
        lastSeenAt: "2024-01-01T00:00:00.000Z",
        result: null,
      };
      await other.pool.query(
        `INSERT INTO ${s}.jobs (request_id, status, last_seen_at, state) VALUES ($1, 'open', $2, $3)`,
        [id, oldState.lastSeenAt, JSON.stringify(oldState)],
      );
      const logs = createPostgresLogStore({ pool: other.pool, schema: other.schema });
      const fresh = "1b6f0c9e-4a8e-4c41-9d7e-1f1f1f1f1f1f";
      await logs.open(fresh);
      const listed = await logs.list!({ limit: 10 });
      expect(listed.map((j) => j.requestId).sort()).toEqual([id, fresh]);
      expect(listed.every((j) => typeof j.createdAt === "string")).toBe(true);
    } finally {
      await other.drop();
    }
  });

  it("a lazy or deferSync write commits asynchronously for itself alone; syncRecords writes one flush point", async () => {
    // One connection and no pipelined ones (pipelineConnections 0), so every statement below runs in the
    // session the asynchronous writes used; the pipelined case is in pipeline.test.ts.
    const pool = new pg.Pool({ connectionString: POSTGRES_URL, max: 1 });
    pool.on("error", () => {});
    const records = createPostgresRecords({ pool, schema: db.schema, pipelineConnections: 0 });
    try {
      const key = `async/${Date.now()}`;
      const r1 = await records.putRecord(key, { n: 1 }, { ifRevision: null, deferSync: true });
      const r2 = await records.putRecord(key, { n: 2 }, { ifRevision: r1, lazy: true });
      expect(r2).not.toBeNull();
      expect(await records.putRecord(key, { n: 3 }, { ifRevision: r1, lazy: true })).toBeNull();
      // The session is back to its own setting: the next durable write waits for its flush.
      expect((await pool.query("SHOW synchronous_commit")).rows[0].synchronous_commit).toBe("on");
      const before = await pool.query(`SELECT sum(n)::int AS n FROM "${db.schema}".sync_points`);
      await records.syncRecords!();
      const after = await pool.query(`SELECT sum(n)::int AS n FROM "${db.schema}".sync_points`);
      expect(after.rows[0].n).toBe(before.rows[0].n + 1);
      expect(await records.getRecord(key)).toEqual({ value: { n: 2 }, revision: r2 });
      expect(await records.deleteRecord(key, { ifRevision: r2, lazy: true })).toBe(true);
      expect((await pool.query("SHOW synchronous_commit")).rows[0].synchronous_commit).toBe("on");
      expect(await records.getRecord(key)).toBeNull();
    } finally {
      await records.close?.();
      await pool.end();
    }
  });

  it("composeStore offers the records' syncRecords over S3-like blobs, never over a blob store that syncs itself", () => {
    const records = createPostgresRecords({ pool: db.pool, schema: db.schema });
    expect(typeof composeStore({ blobs: createMemoryStore(), records }).syncRecords).toBe("function");
    const syncing = { ...createMemoryStore(), syncRecords: async () => {} };
    expect(composeStore({ blobs: syncing, records }).syncRecords).toBeUndefined();
  });

  it("refuses a schema name that is not a plain identifier", () => {
    expect(() => createPostgresRecords({ connectionString: POSTGRES_URL, schema: 'x"; DROP TABLE y; --' })).toThrow(
      /schema/,
    );
  });

  it("a job of 100 000 lines is stored and read back in order", async () => {
    const logs = createPostgresLogStore({ pool: db.pool, schema: db.schema });
    const id = crypto.randomUUID();
    const n = 100_000;
    const entries = Array.from({ length: n }, (_, i) => logEntry(`line ${i} of a long build log`, i % 10 === 0));
    for (let at = 0; at < n; at += 25_000) await logs.append(id, at, entries.slice(at, at + 25_000));
    const state = await logs.get(id);
    expect(state).toMatchObject({ committed: n, storedLines: n, lines: { stdout: 90_000, stderr: 10_000 } });
    const tail = await logs.read(id, n - 2);
    expect(tail).toEqual([
      { line: `line ${n - 2} of a long build log`, stderr: false },
      { line: `line ${n - 1} of a long build log`, stderr: false },
    ]);
    const count = await db.pool.query(
      `SELECT sum(count)::int AS n, count(*)::int AS rows FROM "${db.schema}".job_chunks WHERE request_id = $1`,
      [id],
    );
    // Lines go in chunk rows of up to 4096 lines: 100 000 lines take a few dozen rows, not 100 000.
    expect(count.rows[0].n).toBe(n);
    expect(count.rows[0].rows).toBeLessThanOrEqual(Math.ceil(n / 4096) + 4);
    // A window in the middle of a chunk starts at the right line.
    expect((await logs.read(id, 50_001, 3)).map((l) => l.line)).toEqual(
      [50_001, 50_002, 50_003].map((i) => `line ${i} of a long build log`),
    );
    await logs.close?.();
  });

  it("a job whose first lines are in the row-per-line table of earlier releases reads as one log, and prune removes both", async () => {
    const logs = createPostgresLogStore({ pool: db.pool, schema: db.schema });
    const id = crypto.randomUUID();
    await logs.open(id);
    // What an earlier release left: two items, one line each, a row per line, the job row counting them.
    await db.pool.query(
      `INSERT INTO "${db.schema}".job_lines (request_id, position, line, stderr, marker) VALUES ($1, 0, $2, false, false), ($1, 1, $3, true, true)`,
      [id, Buffer.from("old ✓"), Buffer.from("old marker")],
    );
    const state = (await logs.get(id))!;
    await db.pool.query(`UPDATE "${db.schema}".jobs SET state = $2 WHERE request_id = $1`, [
      id,
      JSON.stringify({ ...state, committed: 2, storedLines: 2, lines: { stdout: 1, stderr: 1 } }),
    ]);
    await logs.append(id, 2, [logEntry("new one"), logEntry("new two", true)]);
    expect(await logs.read(id)).toEqual([
      { line: "old ✓", stderr: false },
      { line: "old marker", stderr: true, marker: true },
      { line: "new one", stderr: false },
      { line: "new two", stderr: true },
    ]);
    expect((await logs.read(id, 1, 2)).map((l) => l.line)).toEqual(["old marker", "new one"]);
    await logs.finish(id, sampleJobResult({ requestId: id, endedAt: new Date(Date.now() - 60_000).toISOString() }), {
      at: 4,
    });
    expect(await logs.prune!(new Date())).toBeGreaterThanOrEqual(1);
    for (const table of ["job_lines", "job_chunks"]) {
      const left = await db.pool.query(`SELECT count(*)::int AS n FROM "${db.schema}".${table} WHERE request_id = $1`, [
        id,
      ]);
      expect(left.rows[0].n).toBe(0);
    }
    await logs.close?.();
  });

  it("two stores on one schema take turns on a job: each item once, in order, the other's changes kept, refusals from the row", async () => {
    // Each store remembers the row it last wrote; the other's writes make that memory stale,
    // so these appends go through the locking transaction and must still follow the rules.
    const a = createPostgresLogStore({ pool: db.pool, schema: db.schema });
    const b = createPostgresLogStore({ pool: db.pool, schema: db.schema });
    const id = crypto.randomUUID();
    const item = (i: number) => logEntry(`item ${i} ✓`, i % 3 === 0);
    const items = (from: number, to: number) => Array.from({ length: to - from }, (_, k) => item(from + k));
    await a.open(id);
    await a.append(id, 0, items(0, 10));
    await a.append(id, 10, items(10, 20)); // a's own row: the one-statement path
    await b.append(id, 15, items(15, 30)); // overlap: 15..19 skipped
    await b.open(id, { expect: true, info: { repoUrl: "https://git.example/r.git" } });
    await a.append(id, 25, items(25, 40)); // stale memory in a; overlap 25..29
    await expect(a.append(id, 45, items(45, 50))).rejects.toMatchObject({ code: "FAILED_PRECONDITION" });
    await expect(b.append(id, 41, items(41, 42))).rejects.toMatchObject({ code: "FAILED_PRECONDITION" });
    await b.append(id, 40, items(40, 50));
    const ended = await b.finish(id, sampleJobResult({ requestId: id }), { at: 50 });
    expect(ended.first).toBe(true);
    // a still remembers the job open: its append and finish are refused by the row.
    await expect(a.append(id, 40, items(40, 51))).rejects.toMatchObject({ code: "FAILED_PRECONDITION" });
    expect((await a.finish(id, sampleJobResult({ requestId: id, outcome: "lost" }))).first).toBe(false);
    const state = await a.get(id);
    expect(state).toMatchObject({
      status: "finished",
      committed: 51,
      storedLines: 50,
      expected: true,
      info: { repoUrl: "https://git.example/r.git" },
    });
    expect(state!.lines).toEqual({ stdout: 33, stderr: 17 });
    expect(await a.read(id)).toEqual(items(0, 50).map((e) => e.stored[0]));
    await a.close?.();
    await b.close?.();
  });

  it("an append to a job this store wrote last is one statement: no transaction, one query", async () => {
    let queries = 0;
    let checkouts = 0;
    const pool = new pg.Pool({ connectionString: POSTGRES_URL, max: 2 });
    pool.on("error", () => undefined);
    const query = pool.query.bind(pool) as (...args: unknown[]) => unknown;
    pool.query = ((...args: unknown[]) => (queries++, query(...args))) as typeof pool.query;
    const connect = pool.connect.bind(pool) as (...args: unknown[]) => unknown;
    // pool.query checks out with a callback; a transaction awaits connect() with none.
    pool.connect = ((...args: unknown[]) => (
      args.length === 0 && checkouts++,
      connect(...args)
    )) as typeof pool.connect;
    const logs = createPostgresLogStore({ pool, schema: db.schema });
    const id = crypto.randomUUID();
    try {
      await logs.open(id);
      await logs.append(id, 0, [logEntry("warm")]);
      queries = 0;
      checkouts = 0;
      for (let at = 1; at < 101; at += 10) {
        await logs.append(
          id,
          at,
          Array.from({ length: 10 }, (_, k) => logEntry(`line ${at + k}`, k === 0)),
        );
      }
      expect({ queries, checkouts }).toEqual({ queries: 10, checkouts: 0 });
      const done = await logs.finish(id, sampleJobResult({ requestId: id }), { at: 101 });
      expect(done.first).toBe(true);
      expect({ queries, checkouts }).toEqual({ queries: 11, checkouts: 0 });
      expect((await logs.read(id, 95)).map((l) => l.line)).toEqual([
        "line 95",
        "line 96",
        "line 97",
        "line 98",
        "line 99",
        "line 100",
      ]);
    } finally {
      await logs.close?.();
      await pool.end();
    }
  });

  it("appends of many jobs at once go out in a few statements (group commit), each job whole; one job's bad row fails only that job", async () => {
    let queries = 0;
    const pool = new pg.Pool({ connectionString: POSTGRES_URL, max: 6 });
    pool.on("error", () => undefined);
    const query = pool.query.bind(pool) as (...args: unknown[]) => unknown;
    pool.query = ((...args: unknown[]) => (queries++, query(...args))) as typeof pool.query;
    const logs = createPostgresLogStore({ pool, schema: db.schema, groupStatements: 2 });
    const ids = Array.from({ length: 60 }, () => crypto.randomUUID());
    try {
      for (const id of ids) await logs.open(id);
      // Job states carrying quotes, backslashes, braces, commas and non-ASCII travel as JSON
      // arrays in the group statement; each must compare equal to its stored row.
      const odd = {
        repoUrl: 'https://example.com/"a\\b",{c}',
        commitSha: "é 😀 \\n \" ' \u00e9",
        note: ["x,y", "{z}", "\\"],
      };
      for (const id of ids.slice(0, 10)) await logs.open(id, { expect: true, info: odd });
      queries = 0;
      for (let round = 0; round < 3; round++) {
        await Promise.all(
          ids.map((id, j) =>
            logs.append(id, round * 2, [logEntry(`${j} r${round} a`), logEntry(`${j} r${round} b`, true)]),
          ),
        );
      }
      // 180 appends; at most 2 statements in flight, so the rest wait and share.
      expect(queries).toBeLessThan(60);
      for (const [j, id] of ids.entries()) {
        expect((await logs.read(id)).map((l) => l.line)).toEqual(
          [0, 1, 2].flatMap((r) => [`${j} r${r} a`, `${j} r${r} b`]),
        );
      }
      for (const id of ids.slice(0, 10)) expect(await logs.get(id)).toMatchObject({ committed: 6, info: odd });
      // A chunk already at the position the next append of ids[0] takes (a row no release writes):
      // that job's append fails, the others in the same group are stored.
      await pool.query(
        `INSERT INTO "${db.schema}".job_chunks (request_id, first, count, bytes, ends, flags) VALUES ($1, 6, 1, '\\x41', '\\x00000001', '\\x00')`,
        [ids[0]],
      );
      const results = await Promise.allSettled(ids.map((id) => logs.append(id, 6, [logEntry("last")])));
      expect(results[0]!.status).toBe("rejected");
      expect(results.slice(1).every((r) => r.status === "fulfilled")).toBe(true);
      expect((await logs.get(ids[1]!))?.committed).toBe(7);
      expect((await logs.read(ids[59]!, 6)).map((l) => l.line)).toEqual(["last"]);
    } finally {
      await logs.close?.();
      await pool.end();
    }
  });

  it("an append's update of the job row is HOT (no index reads state), counted in pg_stat_user_tables", async () => {
    const other = await createTestSchema();
    // One connection: the statistics it flushes are those of our updates only.
    const pool = new pg.Pool({ connectionString: POSTGRES_URL, max: 1 });
    pool.on("error", () => undefined);
    const logs = createPostgresLogStore({ pool, schema: other.schema });
    const id = crypto.randomUUID();
    const t = Date.parse("2030-01-01T00:00:00.000Z");
    try {
      await logs.open(id, { now: new Date(t) });
      // Few enough versions to fit the row's page without pruning (another session's
      // snapshot may hold back pruning on a shared database); the same 10-second step of
      // last_seen_at, so no indexed column changes.
      for (let at = 0; at < 10; at++) await logs.append(id, at, [logEntry(`line ${at}`)], new Date(t + at * 100));
      // The backend sends its counters when it next goes idle; force that flush, then read.
      await pool.query("SELECT pg_stat_force_next_flush()");
      await pool.query("SELECT 1");
      const stats = await other.pool.query(
        `SELECT n_tup_upd::int AS upd, n_tup_hot_upd::int AS hot FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'jobs'`,
        [other.schema],
      );
      expect(stats.rows[0]).toEqual({ upd: 10, hot: 10 });
      expect((await logs.read(id)).map((l) => l.line)).toEqual(Array.from({ length: 10 }, (_, k) => `line ${k}`));
    } finally {
      await logs.close?.();
      await pool.end();
      await other.drop();
    }
  });

  it("a jobs table with the state-expression archive index of earlier releases gains the archived column, filled from the state", async () => {
    const other = await createTestSchema();
    const s = `"${other.schema}"`;
    try {
      const logs = createPostgresLogStore({ pool: other.pool, schema: other.schema });
      const [archived, kept] = [crypto.randomUUID(), crypto.randomUUID()];
      for (const id of [archived, kept]) {
        await logs.open(id);
        await logs.append(id, 0, [logEntry("x")]);
        await logs.finish(id, sampleJobResult({ requestId: id, endedAt: "2030-01-01T00:00:00.000Z" }), { at: 1 });
      }
      await logs.close?.();
      // Back to the earlier layout: no column, the expression index, one job archived in its state only.
      await other.pool.query(`ALTER TABLE ${s}.jobs DROP COLUMN archived`);
      await other.pool.query(
        `CREATE INDEX jobs_unarchived ON ${s}.jobs (ended_at) WHERE status <> 'open' AND (state->>'archived') IS NULL`,
      );
      await other.pool.query(
        `UPDATE ${s}.jobs SET state = (state::jsonb || '{"archived": {"key": "k"}}')::json WHERE request_id = $1`,
        [archived],
      );
      const again = createPostgresLogStore({ pool: other.pool, schema: other.schema });
      const due = await again.archivable!(new Date("2031-01-01T00:00:00.000Z"), 10);
      expect(due.map((j) => j.requestId)).toEqual([kept]);
      const indexes = await other.pool.query(
        `SELECT indexname FROM pg_indexes WHERE schemaname = $1 AND tablename = 'jobs' ORDER BY 1`,
        [other.schema],
      );
      expect(indexes.rows.map((r) => r.indexname)).toContain("jobs_to_archive");
      expect(indexes.rows.map((r) => r.indexname)).not.toContain("jobs_unarchived");
      await again.close?.();
    } finally {
      await other.drop();
    }
  });

  it("stale() is exact although the indexed last_seen_at column moves in 10-second steps", async () => {
    const logs = createPostgresLogStore({ pool: db.pool, schema: db.schema });
    const id = crypto.randomUUID();
    const t = Date.parse("2030-01-01T00:00:00.000Z");
    await logs.open(id, { now: new Date(t) });
    await logs.append(id, 0, [logEntry("a")], new Date(t + 1_000));
    await logs.append(id, 1, [logEntry("b")], new Date(t + 5_000)); // the column stays at t (open)
    const column = await db.pool.query(`SELECT last_seen_at FROM "${db.schema}".jobs WHERE request_id = $1`, [id]);
    expect((column.rows[0].last_seen_at as Date).getTime()).toBe(t);
    const staleIds = async (ms: number) =>
      (await logs.stale(new Date(t + ms))).map((s) => s.requestId).filter((x) => x === id);
    expect(await staleIds(3_000)).toEqual([]);
    expect(await staleIds(5_001)).toEqual([id]);
    await logs.append(id, 2, [logEntry("c")], new Date(t + 12_000)); // a step: the column follows
    const moved = await db.pool.query(`SELECT last_seen_at FROM "${db.schema}".jobs WHERE request_id = $1`, [id]);
    expect((moved.rows[0].last_seen_at as Date).getTime()).toBe(t + 12_000);
    await logs.close?.();
  });

  it("a revision string that is not a bigint loses the compare-and-swap instead of failing the store", async () => {
    const records = createPostgresRecords({ pool: db.pool, schema: db.schema });
    const key = `rev-${Date.now()}`;
    const first = await records.putRecord(key, { n: 1 }, { ifRevision: null });
    expect(first).not.toBeNull();
    for (const stale of ["99999999999999999999", "9223372036854775808", "-1", "1e3"]) {
      expect(await records.putRecord(key, { n: 2 }, { ifRevision: stale })).toBeNull();
      expect(await records.deleteRecord(key, { ifRevision: stale })).toBe(false);
    }
    expect(await records.getRecord(key)).toEqual({ value: { n: 1 }, revision: first });
    await records.close?.();
  });

  it("a pool given by the host is not ended on close", async () => {
    const records = createPostgresRecords({ pool: db.pool, schema: db.schema });
    await records.putRecord(`k-${crypto.randomUUID()}`, 1, { ifRevision: null });
    await records.close?.();
    await records.close?.();
    expect((await db.pool.query("SELECT 1 AS one")).rows[0].one).toBe(1);
  });

  it("a database outage surfaces as UNAVAILABLE / STORE_UNAVAILABLE, never a crash", async () => {
    const logs = createPostgresLogStore(viaProxy());
    const records = createPostgresRecords(viaProxy());
    await logs.open(crypto.randomUUID());
    await records.getRecord("warm");
    await proxy.break();
    try {
      await expect(logs.open(crypto.randomUUID())).rejects.toMatchObject({ code: "UNAVAILABLE" });
      await expect(records.getRecord("x")).rejects.toMatchObject({ code: "STORE_UNAVAILABLE" });
    } finally {
      await proxy.heal();
    }
    expect(await records.getRecord("absent-after-heal")).toBeNull();
    await logs.close?.();
    await records.close?.();
  });
});
