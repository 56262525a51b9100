/** PostgreSQL adapters: the records and job-log conformance suites against a real server. */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { composeStore } from "../src/depot/compose.js";
import { createPostgresLogStore, createPostgresRecords, migrate } from "../src/adapters/postgres/index.js";
import { createMemoryStore } from "../src/adapters/memory/store.js";
import { describeJobLogStore, describePackageStore, logEntry } from "../src/testing/index.js";
import { createTestSchema, POSTGRES_URL, startTcpProxy } from "./backends-fixtures.js";
import type { TcpProxy } from "./backends-fixtures.js";

let db: Awaited<ReturnType<typeof createTestSchema>>;
let proxy: TcpProxy;

beforeAll(async () => {
  db = await createTestSchema();
  proxy = await startTcpProxy("127.0.0.1", 5432);
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
      expect(tables.rows.map((r) => r.table_name)).toEqual(["job_lines", "jobs", "records"]);
    } finally {
      await other.drop();
    }
  });

  it("refuses a schema name that is not a plain identifier", () => {
    expect(() => createPostgresRecords({ connectionString: POSTGRES_URL, schema: 'x"; DROP TABLE y; --' })).toThrow(/schema/);
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
    const count = await db.pool.query(`SELECT count(*)::int AS n FROM "${db.schema}".job_lines WHERE request_id = $1`, [id]);
    expect(count.rows[0].n).toBe(n);
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
