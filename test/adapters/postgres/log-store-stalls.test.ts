/** PostgreSQL log store behind a proxy that black-holes or freezes: calls answer UNAVAILABLE, then recover alone. */
import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createPostgresLogStore } from "../../../src/adapters/postgres/index.js";
import type { JobLogStore } from "../../../src/runner/ports.js";
import { logEntry } from "../../../src/testing/index.js";
import { createTestSchema, needs, POSTGRES_URL } from "../../fixtures/backends.js";
import { startProxyFor, type ProxyMode, type TcpProxy } from "../../fixtures/tcp-proxy.js";

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

/** A call's outcome, or "hung" when it has none after `ms` (a hang, not a speed bound). */
async function settle<T>(call: Promise<T>, ms = 60_000): Promise<{ ok: true; value: T } | { ok: false; code: string }> {
  let timer: NodeJS.Timeout | undefined;
  const hung = new Promise<{ ok: false; code: string }>((resolve) => {
    timer = setTimeout(() => resolve({ ok: false, code: "hung" }), ms);
  });
  const out = call.then(
    (value) => ({ ok: true as const, value }),
    (error: unknown) => ({ ok: false as const, code: String((error as { code?: unknown }).code ?? error) }),
  );
  try {
    return await Promise.race([out, hung]);
  } finally {
    clearTimeout(timer);
  }
}

/** Retries `call` until it succeeds (the store recovering by itself); the attempts it took. */
async function untilOk(call: () => Promise<unknown>, attempts = 60): Promise<number> {
  for (let i = 1; i <= attempts; i++) {
    const out = await settle(call());
    if (out.ok) return i;
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
  throw new Error(`no success in ${attempts} attempts`);
}

function makeStore(): JobLogStore {
  // The adapter's own pool with its default timeouts (schema.ts POSTGRES_TIMEOUTS): what a host gets.
  return createPostgresLogStore({ schema: db.schema, connectionString: proxy.url(POSTGRES_URL) });
}

describe.each<ProxyMode>(["blackhole", "pause"])("postgres log store: database %s", (mode) => {
  it("answers UNAVAILABLE while the database is gone, recovers by itself and loses no acknowledged line", async () => {
    const store = makeStore();
    try {
      const ids = Array.from({ length: 10 }, () => randomUUID());
      const acked = new Map<string, string[]>();
      for (const id of ids) {
        await store.open(id);
        await store.append(id, 0, [logEntry(`${id} 0`)]);
        acked.set(id, [`${id} 0`]);
      }

      proxy.mode(mode);
      const started = performance.now();
      // More calls than the group slots (4 appends, 4 reads) and the pool (10): every one must still get an answer.
      const during = await Promise.all([
        ...ids.map((id) => settle(store.append(id, 1, [logEntry(`${id} 1`)]))),
        ...ids.map((id) => settle(store.get(id))),
        settle(store.open(randomUUID())),
      ]);
      const answeredIn = performance.now() - started;
      expect(during.map((o) => (o.ok ? "ok" : o.code))).toEqual(during.map(() => "UNAVAILABLE"));

      proxy.mode("pass");
      const healed = performance.now();
      // Each job's next append retries from its acknowledged position, as an agent does.
      for (const id of ids) {
        await untilOk(() => store.append(id, 1, [logEntry(`${id} 1`)]));
        acked.get(id)!.push(`${id} 1`);
      }
      const recoveredIn = performance.now() - healed;
      console.log(
        `postgres ${mode}: ${during.length} calls answered UNAVAILABLE within ${Math.round(answeredIn)} ms; ` +
          `all ${ids.length} jobs appending again ${Math.round(recoveredIn)} ms after the link came back`,
      );

      for (const id of ids) {
        const lines = (await store.read(id)).map((l) => l.line);
        expect(lines).toEqual(acked.get(id));
      }
    } finally {
      proxy.mode("pass");
      await store.close?.();
    }
  }, 240_000);
});
