/** RabbitMQ queue: the queue conformance suite against the real broker. */
import { randomUUID } from "node:crypto";
import { Writable } from "node:stream";
import { pino } from "pino";
import { describe, expect, it } from "vitest";
import { createRabbitMqQueue } from "../../../src/adapters/rabbitmq/index.js";
import type { RabbitMqQueue, RabbitMqQueueOptions } from "../../../src/adapters/rabbitmq/index.js";
import { describeQueueAdapter, sampleJobResult } from "../../../src/testing/index.js";
import type { ConsumedMessage } from "../../../src/testing/index.js";
import { RABBITMQ_URL } from "../../fixtures/backends.js";
import { useBrokerBehindProxy } from "../../fixtures/broker-behind-proxy.js";

const queueNames = new WeakMap<RabbitMqQueue, string>();
const broker = useBrokerBehindProxy();

/** A queue adapter on its own throw-away broker queue (deleted by the broker when unused). */
function make(extra: Partial<RabbitMqQueueOptions> = {}): RabbitMqQueue {
  const queue = `rd-test-${randomUUID()}`;
  const adapter = createRabbitMqQueue({
    url: broker.proxy.url(RABBITMQ_URL),
    queue,
    queueArguments: { "x-expires": 120_000 },
    reconnectDelayMs: { initial: 50, max: 500 },
    ...extra,
  });
  queueNames.set(adapter, extra.queue ?? queue);
  return adapter;
}

async function drain(queue: string): Promise<ConsumedMessage[]> {
  const out: ConsumedMessage[] = [];
  for (;;) {
    const msg = await broker.channel.get(queue, { noAck: true });
    if (!msg) return out;
    out.push({
      body: JSON.parse(msg.content.toString("utf8")),
      messageId: msg.properties.messageId,
      contentType: msg.properties.contentType,
      type: msg.properties.type,
      persistent: msg.properties.deliveryMode === 2,
    });
  }
}

describeQueueAdapter("rabbitmq", () => make(), {
  consume: (q) => drain(queueNames.get(q)!),
  properties: true,
  outage: {
    break: () => broker.proxy.break(),
    heal: () => broker.proxy.heal(),
    impatient: () => make({ publishTimeoutMs: 1000 }),
  },
});

describe("rabbitmq queue: extra cases", () => {
  it("declares a durable queue and binds it to a named exchange with the routing key", async () => {
    const queue = `rd-test-${randomUUID()}`;
    const exchange = `rd-test-x-${randomUUID()}`;
    const adapter = createRabbitMqQueue({
      url: RABBITMQ_URL,
      exchange,
      routingKey: "job.results",
      queue,
      queueArguments: { "x-expires": 60_000 },
    });
    try {
      const result = sampleJobResult();
      await adapter.publishJobResult(result);
      const declared = await broker.channel.checkQueue(queue);
      expect(declared.messageCount).toBe(1);
      const msg = await broker.channel.get(queue, { noAck: true });
      expect(msg && msg.fields.exchange).toBe(exchange);
      expect(msg && msg.fields.routingKey).toBe("job.results");
      expect(msg && JSON.parse(msg.content.toString())).toEqual(result);
    } finally {
      await adapter.close();
      await broker.channel.deleteExchange(exchange).catch(() => {});
    }
  });

  it("an unroutable result is not taken as accepted: UNAVAILABLE after the bound", async () => {
    const exchange = `rd-test-x-${randomUUID()}`;
    const adapter = createRabbitMqQueue({
      url: RABBITMQ_URL,
      exchange,
      queue: null,
      routingKey: "nowhere",
      publishTimeoutMs: 800,
    });
    try {
      await expect(adapter.publishJobResult(sampleJobResult())).rejects.toMatchObject({ code: "UNAVAILABLE" });
    } finally {
      await adapter.close();
      await broker.channel.deleteExchange(exchange).catch(() => {});
    }
  });

  it("a broker-side channel error never crashes the process: reported, then UNAVAILABLE after the bound", async () => {
    const exchange = `rd-test-x-${randomUUID()}`;
    await broker.channel.assertExchange(exchange, "fanout", { durable: false, autoDelete: false });
    const errors: unknown[] = [];
    // The adapter declares the exchange as `direct`: the broker closes its channel (406).
    const adapter = createRabbitMqQueue({
      url: RABBITMQ_URL,
      exchange,
      queue: null,
      routingKey: "x",
      publishTimeoutMs: 800,
      reconnectDelayMs: { initial: 50, max: 200 },
      onError: (e) => errors.push(e),
    });
    try {
      await expect(adapter.publishJobResult(sampleJobResult())).rejects.toMatchObject({ code: "UNAVAILABLE" });
      expect(errors.length).toBeGreaterThan(0);
      expect(String(errors[0])).toMatch(/PRECONDITION_FAILED|406/);
    } finally {
      await adapter.close();
      await broker.channel.deleteExchange(exchange).catch(() => {});
    }
  });

  it("reconnects in the background after the connection drops", async () => {
    const adapter = make();
    try {
      await adapter.ready();
      expect(adapter.connected).toBe(true);
      await broker.proxy.break();
      // expect.poll's default bound is 1 s: too short for a loaded machine to see the drop.
      await expect.poll(() => adapter.connected, { timeout: 30_000 }).toBe(false);
      await broker.proxy.heal();
      await expect.poll(() => adapter.connected, { timeout: 30_000 }).toBe(true);
      const result = sampleJobResult();
      await adapter.publishJobResult(result);
      expect((await drain(queueNames.get(adapter)!)).map((m) => m.body)).toEqual([result]);
    } finally {
      await broker.proxy.heal();
      await adapter.close();
    }
  });

  it("logs the lost connection and the reconnect (with the failed attempts between), never the URL's password", async () => {
    const lines: string[] = [];
    const logger = pino(
      { level: "debug" },
      new Writable({
        write(chunk: Buffer, _encoding, done) {
          lines.push(
            ...chunk
              .toString("utf8")
              .split("\n")
              .filter((l) => l.length > 0),
          );
          done();
        },
      }),
    );
    const parsed = () => lines.map((l) => JSON.parse(l) as Record<string, unknown>);
    const adapter = make({ logger });
    const queue = queueNames.get(adapter)!;
    try {
      await adapter.ready();
      expect(lines).toEqual([]);
      // The proxy resets the live connection and refuses new ones: the broker itself stays up.
      await broker.proxy.break();
      await expect.poll(() => parsed().some((l) => l.msg === "queue connection lost"), { timeout: 30_000 }).toBe(true);
      expect(parsed()[0]).toMatchObject({ level: 40, msg: "queue connection lost", queue });
      // Let at least one reconnect fail against the broken proxy before healing it.
      await expect.poll(() => parsed().some((l) => l.msg === "queue connect failed"), { timeout: 30_000 }).toBe(true);
      await broker.proxy.heal();
      await expect.poll(() => parsed().some((l) => l.msg === "queue reconnected"), { timeout: 30_000 }).toBe(true);
      expect(adapter.connected).toBe(true);

      const events = parsed();
      expect(events.map((l) => l.msg)).toEqual([
        "queue connection lost",
        ...events.slice(1, -1).map(() => "queue connect failed"),
        "queue reconnected",
      ]);
      const failed = events.slice(1, -1);
      expect(failed.length).toBeGreaterThanOrEqual(1);
      failed.forEach((l, i) =>
        expect(l).toMatchObject({ level: 40, queue, attempt: i + 1, error: expect.any(String) }),
      );
      expect(events.at(-1)).toMatchObject({ level: 40, queue, attempts: failed.length + 1 });
      // Only these fields: never the URL (a connect error's message names host and port, not the URL).
      for (const l of events)
        expect(
          Object.keys(l)
            .filter((k) => !["level", "time", "pid", "hostname", "msg"].includes(k))
            .sort(),
        ).toEqual(
          l.msg === "queue connect failed"
            ? ["attempt", "error", "queue"]
            : l.msg === "queue reconnected"
              ? ["attempts", "queue"]
              : ["queue"],
        );
      const url = new URL(RABBITMQ_URL);
      const all = lines.join("\n");
      expect(all).not.toContain(`${url.username}:${url.password}@`);
      if (url.password) expect(all).not.toContain(`:${decodeURIComponent(url.password)}`);

      // And the reconnected adapter publishes.
      const result = sampleJobResult();
      await adapter.publishJobResult(result);
      expect((await drain(queue)).map((m) => m.body)).toEqual([result]);
    } finally {
      await broker.proxy.heal();
      await adapter.close();
    }
  });

  it("publish after close rejects with UNAVAILABLE; close twice is harmless", async () => {
    const adapter = make();
    await adapter.publishJobResult(sampleJobResult());
    await adapter.close();
    await adapter.close();
    await expect(adapter.publishJobResult(sampleJobResult())).rejects.toMatchObject({ code: "UNAVAILABLE" });
  });
});
