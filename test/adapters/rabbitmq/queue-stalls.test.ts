/** RabbitMQ queue behind a proxy that stalls or black-holes the broker: no extra copies, dead links noticed. */
import { randomUUID } from "node:crypto";
import { describe, expect, it } from "vitest";
import { createRabbitMqQueue } from "../../../src/adapters/rabbitmq/index.js";
import type { RabbitMqQueue, RabbitMqQueueOptions } from "../../../src/adapters/rabbitmq/index.js";
import type { JobResult } from "../../../src/runner/ports.js";
import { sampleJobResult } from "../../../src/testing/index.js";
import { RABBITMQ_URL } from "../../fixtures/backends.js";
import { useBrokerBehindProxy } from "../../fixtures/broker-behind-proxy.js";

const broker = useBrokerBehindProxy();

function make(queue: string, extra: Partial<RabbitMqQueueOptions> = {}): RabbitMqQueue {
  return createRabbitMqQueue({
    url: broker.proxy.url(RABBITMQ_URL),
    queue,
    queueArguments: { "x-expires": 120_000 },
    reconnectDelayMs: { initial: 50, max: 500 },
    publishTimeoutMs: 1_000,
    ...extra,
  });
}

/** Message IDs on the queue, in order (consumed). */
async function drainIds(queue: string): Promise<string[]> {
  const ids: string[] = [];
  for (;;) {
    const msg = await broker.channel.get(queue, { noAck: true });
    if (!msg) return ids;
    ids.push(String(msg.properties.messageId));
  }
}

/** Counts per message ID. */
function counts(ids: string[]): Map<string, number> {
  const out = new Map<string, number>();
  for (const id of ids) out.set(id, (out.get(id) ?? 0) + 1);
  return out;
}

const code = (error: unknown) => String((error as { code?: unknown }).code ?? error);
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Polls `check` every 100 ms; false when it never held within `ms` (a hang guard, not a speed bound). */
async function eventually(check: () => boolean, ms = 60_000): Promise<boolean> {
  const until = Date.now() + ms;
  while (Date.now() < until) {
    if (check()) return true;
    await sleep(100);
  }
  return check();
}

describe("rabbitmq queue: a stalled or black-holed broker", () => {
  it("a result retried while the broker stalls (TCP alive) reaches the queue once", async () => {
    const queue = `rd-test-${randomUUID()}`;
    // A heartbeat longer than the stall: the connection lives through it (the case of issue 31).
    const adapter = make(queue, { heartbeatSeconds: 20 });
    try {
      await adapter.ready();
      const results = Array.from({ length: 5 }, () => sampleJobResult());
      broker.proxy.mode("pause");
      // Each result is tried three times during the stall, as a service and its agent retry
      // (a replayed end makes the result again: a later endedAt).
      const during: string[] = [];
      const again = (r: JobResult) => ({ ...r, endedAt: new Date().toISOString() });
      for (let round = 0; round < 3; round++) {
        const outs = await Promise.allSettled(results.map((r) => adapter.publishJobResult(again(r))));
        for (const o of outs) during.push(o.status === "fulfilled" ? "ok" : code(o.reason));
      }
      expect(during).toEqual(during.map(() => "UNAVAILABLE"));
      broker.proxy.mode("pass");
      await Promise.all(results.map((r) => adapter.publishJobResult(again(r))));

      await sleep(500);
      const got = counts(await drainIds(queue));
      console.log(
        `rabbitmq pause: ${[...got.values()].reduce((a, b) => a + b, 0)} messages for ${results.length} jobs`,
      );
      expect(Object.fromEntries(got)).toEqual(Object.fromEntries(results.map((r) => [r.requestId, 1])));
    } finally {
      broker.proxy.mode("pass");
      await adapter.close();
    }
  }, 120_000);

  it("a result retried after the stalled broker confirmed it late is not sent again", async () => {
    const queue = `rd-test-${randomUUID()}`;
    const adapter = make(queue, { heartbeatSeconds: 20 });
    try {
      await adapter.ready();
      const results = Array.from({ length: 5 }, () => sampleJobResult());
      broker.proxy.mode("pause");
      const during = await Promise.allSettled(results.map((r) => adapter.publishJobResult(r)));
      expect(during.map((o) => (o.status === "fulfilled" ? "ok" : code(o.reason)))).toEqual(
        results.map(() => "UNAVAILABLE"),
      );
      broker.proxy.mode("pass");
      // The broker confirms the first copies now, before the callers retry (their back-off).
      await eventually(() => false, 1_000);
      await Promise.all(results.map((r) => adapter.publishJobResult({ ...r, endedAt: new Date().toISOString() })));

      await sleep(500);
      const got = counts(await drainIds(queue));
      expect(Object.fromEntries(got)).toEqual(Object.fromEntries(results.map((r) => [r.requestId, 1])));
    } finally {
      broker.proxy.mode("pass");
      await adapter.close();
    }
  }, 120_000);

  it("a link that drops bytes is noticed by the default heartbeat, and publishing recovers", async () => {
    const queue = `rd-test-${randomUUID()}`;
    const adapter = make(queue);
    try {
      await adapter.ready();
      const results = Array.from({ length: 5 }, () => sampleJobResult());
      broker.proxy.mode("blackhole");
      const during = await Promise.allSettled(results.map((r) => adapter.publishJobResult(r)));
      expect(during.map((o) => (o.status === "fulfilled" ? "ok" : code(o.reason)))).toEqual(
        results.map(() => "UNAVAILABLE"),
      );
      const started = Date.now();
      // No heartbeat in the URL: the adapter's default must still find the connection dead.
      const noticed = await eventually(() => !adapter.connected);
      const noticedIn = Date.now() - started;
      expect(noticed).toBe(true);

      broker.proxy.mode("pass");
      const healed = Date.now();
      for (const r of results) {
        let ok = false;
        for (let attempt = 0; attempt < 60 && !ok; attempt++) {
          ok = await adapter.publishJobResult(r).then(
            () => true,
            () => false,
          );
        }
        expect(ok).toBe(true);
      }
      console.log(
        `rabbitmq blackhole: dead connection noticed ${noticedIn} ms after the publishes failed; ` +
          `all published again ${Date.now() - healed} ms after the link came back`,
      );
      await sleep(500);
      const got = counts(await drainIds(queue));
      expect(Object.fromEntries(got)).toEqual(Object.fromEntries(results.map((r) => [r.requestId, 1])));
    } finally {
      broker.proxy.mode("pass");
      await adapter.close();
    }
  }, 180_000);
});
