/**
 * The LISTEN connection runs one statement at a time on its client: the owner's NOTIFYs,
 * its LISTEN and its pings share one pg.Client, and pg deprecates a query() while another
 * is running ("will be removed in pg@9.0"), which CI's output showed.
 */
import { randomUUID } from "node:crypto";
import pg from "pg";
import { describe, expect, it } from "vitest";
import { createPostgresLogNotifier } from "../../../src/adapters/postgres/log-notify.js";
import { needs, POSTGRES_URL } from "../../fixtures/backends.js";

/** A pg.Client whose statements running at once are counted (its query() wrapped). */
function countingClient(): { client: pg.Client; active: () => number; most: () => number } {
  const client = new pg.Client({ connectionString: POSTGRES_URL });
  const original = client.query.bind(client) as (...args: unknown[]) => Promise<unknown>;
  let active = 0;
  let most = 0;
  (client as unknown as { query: (...args: unknown[]) => Promise<unknown> }).query = (...args) => {
    most = Math.max(most, ++active);
    const running = original(...args);
    running.then(
      () => active--,
      () => active--,
    );
    return running;
  };
  return { client, active: () => active, most: () => most };
}

const tick = () => new Promise((resolve) => setImmediate(resolve));

describe.skipIf(!needs("postgres"))("postgres LISTEN connection: one statement at a time", () => {
  it("a watcher's LISTEN while a NOTIFY is in flight waits for it", async () => {
    const clients: ReturnType<typeof countingClient>[] = [];
    const notifier = createPostgresLogNotifier(() => {
      const c = countingClient();
      clients.push(c);
      return c.client;
    }, `rd_serial_${process.pid}`);
    try {
      // Connect: the first publish opens the connection and sends once it is up.
      notifier.publish(randomUUID(), 1, false);
      for (let i = 0; i < 2000 && !(clients[0]?.most() ?? 0); i++) await new Promise((r) => setTimeout(r, 5));
      for (let i = 0; i < 2000 && clients[0]!.active() > 0; i++) await tick();
      // Now a NOTIFY in flight, and a watcher arriving meanwhile (its LISTEN on the same client).
      notifier.publish(randomUUID(), 2, false);
      for (let i = 0; i < 2000 && clients[0]!.active() === 0; i++) await tick();
      expect(clients[0]!.active()).toBe(1);
      const stop = notifier.watch(() => {});
      for (let i = 0; i < 2000 && clients[0]!.active() > 0; i++) await new Promise((r) => setTimeout(r, 5));
      stop();
      expect(clients).toHaveLength(1);
      expect(clients[0]!.most()).toBe(1);
    } finally {
      await notifier.close();
    }
  });
});
