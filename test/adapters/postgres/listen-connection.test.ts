/** The PostgreSQL LISTEN connection behind a black-holing proxy: found lost by its ping, reconnected by itself. */
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createListenConnection } from "../../../src/adapters/postgres/listen-connection.js";
import { needs, POSTGRES_URL } from "../../fixtures/backends.js";
import { startProxyFor, type TcpProxy } from "../../fixtures/tcp-proxy.js";

let proxy: TcpProxy;
const haveDatabase = needs("postgres");

beforeAll(async () => {
  if (!haveDatabase) return;
  proxy = await startProxyFor(POSTGRES_URL, 5432);
});
afterAll(async () => {
  await proxy?.close();
});

/** Polls `check` every 50 ms; false when it never held within `ms` (a hang guard, not a speed bound). */
async function eventually(check: () => boolean, ms = 30_000): Promise<boolean> {
  const until = Date.now() + ms;
  while (Date.now() < until) {
    if (check()) return true;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  return check();
}

describe("postgres LISTEN connection: a link that drops bytes", () => {
  it("is found lost by its ping, its owner told to look again, and it comes back by itself", async () => {
    let connected = 0;
    let lost = 0;
    const payloads: string[] = [];
    const channel = `rd_test_listen_${process.pid}`;
    const conn = createListenConnection(
      () => new pg.Client({ connectionString: proxy.url(POSTGRES_URL), connectionTimeoutMillis: 1_000 }),
      channel,
      {
        onPayload: (p) => payloads.push(p),
        onConnected: () => connected++,
        onLost: () => lost++,
        reconnectMaxMs: 500,
        pingMs: { every: 200, timeout: 1_000 },
      },
    );
    const direct = new pg.Client({ connectionString: POSTGRES_URL });
    await direct.connect();
    try {
      await conn.open();
      expect(connected).toBe(1);

      proxy.mode("blackhole");
      // Nothing is sent to a LISTEN connection that nobody notifies: only the ping can tell.
      expect(await eventually(() => lost > 0)).toBe(true);

      proxy.mode("pass");
      expect(await eventually(() => connected > 1)).toBe(true);
      // Listening again: a notification sent now arrives.
      await direct.query(`SELECT pg_notify($1, 'after')`, [channel]);
      expect(await eventually(() => payloads.includes("after"))).toBe(true);
    } finally {
      proxy.mode("pass");
      await conn.close();
      await direct.end();
    }
  }, 90_000);
});
