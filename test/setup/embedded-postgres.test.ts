/**
 * The embedded PostgreSQL that `npm test` starts on a machine without one
 * (test/setup/embedded-postgres.ts): PGlite is one session, so these tests attack the
 * multiplexer in front of it over real sockets with node-postgres. CI has a real server
 * and would otherwise never run this path, so one is started here (or this run's own is
 * reused when the run is already on the embedded one).
 */
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SERVICES } from "../fixtures/backends.js";
import { startEmbeddedPostgres } from "./service-ways.js";
import type { Started } from "./services.js";

let embedded: Started | null = null;
let url: string;
let pool: pg.Pool;

beforeAll(async () => {
  if (SERVICES.postgres.how === "embedded" && SERVICES.postgres.url) {
    url = SERVICES.postgres.url;
  } else {
    embedded = await startEmbeddedPostgres();
    url = embedded.url;
  }
  pool = new pg.Pool({ connectionString: url, max: 16 });
  pool.on("error", () => {});
  await pool.query("CREATE TABLE IF NOT EXISTS embedded_probe (k text PRIMARY KEY, v int NOT NULL)");
}, 240_000);
afterAll(async () => {
  await pool?.end();
  await embedded?.stop();
});

async function connect(): Promise<pg.Client> {
  const client = new pg.Client({ connectionString: url });
  client.on("error", () => {});
  await client.connect();
  return client;
}

describe("embedded PostgreSQL: one PGlite session behind many connections", () => {
  it("200 parameterised queries from 16 connections at once each get their own answer", async () => {
    // Each is Parse/Bind/Describe/Execute/Sync on the unnamed portal: interleaved by
    // message, one connection's Execute would run another's portal.
    const answers = await Promise.all(
      Array.from({ length: 200 }, (_, i) =>
        pool.query<{ n: number; s: string }>("SELECT $1::int * 2 AS n, $2::text AS s", [i, `q${i}`]),
      ),
    );
    expect(answers.map((r) => r.rows[0])).toEqual(Array.from({ length: 200 }, (_, i) => ({ n: i * 2, s: `q${i}` })));
  });

  it("an open transaction runs alone: another connection's statement waits for its commit and never sees it half-done", async () => {
    const key = `tx-${Date.now()}`;
    const a = await connect();
    const b = await connect();
    try {
      const events: string[] = [];
      await a.query("BEGIN");
      await a.query("INSERT INTO embedded_probe (k, v) VALUES ($1, 1)", [key]);
      const read = b.query<{ v: number }>("SELECT v FROM embedded_probe WHERE k = $1", [key]).then((r) => {
        events.push("b read");
        return r.rows;
      });
      // a keeps working inside its transaction while b's statement is queued.
      await a.query("UPDATE embedded_probe SET v = 2 WHERE k = $1", [key]);
      events.push("a updated");
      await a.query("COMMIT");
      events.push("a committed");
      expect(await read).toEqual([{ v: 2 }]);
      expect(events).toEqual(["a updated", "a committed", "b read"]);
    } finally {
      await a.end();
      await b.end();
    }
  });

  it("a connection that drops inside its transaction is rolled back and the others go on", async () => {
    const key = `drop-${Date.now()}`;
    const a = await connect();
    await a.query("BEGIN");
    await a.query("INSERT INTO embedded_probe (k, v) VALUES ($1, 1)", [key]);
    const waiting = pool.query<{ count: string }>("SELECT count(*) FROM embedded_probe WHERE k = $1", [key]);
    // Cut the socket without a Terminate message, as a crashed client would.
    (a as unknown as { connection: { stream: { destroy(): void } } }).connection.stream.destroy();
    expect((await waiting).rows).toEqual([{ count: "0" }]);
    expect((await pool.query("SELECT 1 AS ok")).rows).toEqual([{ ok: 1 }]);
  });

  it("a failed statement inside a transaction leaves that transaction aborted until rollback, and nobody else affected", async () => {
    const a = await connect();
    try {
      await a.query("BEGIN");
      await expect(a.query("SELECT * FROM no_such_table")).rejects.toThrow(/no_such_table/);
      const other = pool.query("SELECT 2 AS two");
      await expect(a.query("SELECT 1")).rejects.toThrow(/aborted/);
      await a.query("ROLLBACK");
      expect((await other).rows).toEqual([{ two: 2 }]);
      expect((await a.query("SELECT 3 AS three")).rows).toEqual([{ three: 3 }]);
    } finally {
      await a.end();
    }
  });

  it("a compare-and-swap race of 24 writers has exactly one winner", async () => {
    const key = `cas-${Date.now()}`;
    await pool.query("INSERT INTO embedded_probe (k, v) VALUES ($1, 0)", [key]);
    const results = await Promise.all(
      Array.from({ length: 24 }, async (_, i) => {
        const client = await pool.connect();
        try {
          await client.query("BEGIN");
          const { rows } = await client.query<{ v: number }>("SELECT v FROM embedded_probe WHERE k = $1 FOR UPDATE", [
            key,
          ]);
          const won = rows[0]!.v === 0;
          if (won) await client.query("UPDATE embedded_probe SET v = $2 WHERE k = $1", [key, i + 1]);
          await client.query("COMMIT");
          return won;
        } finally {
          client.release();
        }
      }),
    );
    expect(results.filter(Boolean)).toHaveLength(1);
    const { rows } = await pool.query<{ v: number }>("SELECT v FROM embedded_probe WHERE k = $1", [key]);
    expect(rows[0]!.v).toBe(results.indexOf(true) + 1);
  });
});
