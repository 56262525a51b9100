/**
 * Cancel racing a stalled end (issue 31), on a real RabbitMQ behind a proxy that stalls it
 * (TCP alive, nothing read): the end's publish times out in the adapter and stays on its
 * channel awaiting the confirm; the host's cancel then publishes the end's result again, never
 * a cancelled one, so the queue holds one result for the job once the broker resumes.
 */
import { randomUUID } from "node:crypto";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { describe, expect, it } from "vitest";
import { createRabbitMqQueue } from "../../../src/adapters/rabbitmq/index.js";
import { Runner } from "../../../src/gen/runner/v1/runner_pb.js";
import { createRunnerService, startRunnerServer } from "../../../src/runner/index.js";
import type { JobResult, JobResultQueue } from "../../../src/runner/ports.js";
import { RABBITMQ_URL } from "../../fixtures/backends.js";
import { useBrokerBehindProxy } from "../../fixtures/broker-behind-proxy.js";
import { end, line, send, until } from "../../fixtures/runner-service.js";

const broker = useBrokerBehindProxy();

/** Messages on `queue` (consumed), as results. */
async function drain(queue: string): Promise<JobResult[]> {
  const out: JobResult[] = [];
  for (;;) {
    const msg = await broker.channel.get(queue, { noAck: true });
    if (!msg) return out;
    out.push(JSON.parse(msg.content.toString("utf8")) as JobResult);
  }
}

describe("cancel racing a stalled end, on RabbitMQ", () => {
  it("one job, one result: the cancel publishes the end's result, the broker gets it once", async () => {
    const queueName = `rd-test-${randomUUID()}`;
    const adapter = createRabbitMqQueue({
      url: broker.proxy.url(RABBITMQ_URL),
      queue: queueName,
      queueArguments: { "x-expires": 120_000 },
      reconnectDelayMs: { initial: 50, max: 500 },
      publishTimeoutMs: 1_000,
      // Longer than the stall: the connection lives through it (the case of the issue).
      heartbeatSeconds: 20,
    });
    let publishes = 0;
    const counted: JobResultQueue = {
      publishJobResult: (result) => {
        publishes++;
        return adapter.publishJobResult(result);
      },
    };
    const runner = createRunnerService(counted, {
      publishRetry: { maxMs: 300, initialDelayMs: 50, maxDelayMs: 200, attemptTimeoutMs: 5_000 },
    });
    const server = await startRunnerServer(runner, { port: 0 });
    const client = createClient(Runner, createGrpcTransport({ baseUrl: server.url }));
    try {
      await adapter.ready();
      const id = randomUUID();
      expect(await send(client, [line(id, "a")])).toMatchObject({ ok: true, committed: "1" });
      broker.proxy.mode("pause");
      expect(await send(client, [end(id, 0)], { offset: 1 })).toMatchObject({ code: "Unavailable", committed: "1" });
      const cancelled = runner.cancelJob(id);
      // The end's publish timed out in the adapter, and the cancel has published during the stall.
      await until(() => publishes >= 2, "the cancel's publish during the stall");
      broker.proxy.mode("pass");
      expect(await cancelled).toBeNull();
      expect(await runner.logs.get(id)).toMatchObject({ status: "finished", committed: 2 });
      // Before: two messages under one messageId, "finished" (the stalled end, confirmed late) and "cancelled".
      await new Promise((resolve) => setTimeout(resolve, 500));
      const got = (await drain(queueName)).filter((r) => r.requestId === id);
      expect(got.map((r) => r.outcome)).toEqual(["finished"]);
    } finally {
      broker.proxy.mode("pass");
      await server.close();
      await runner.close();
      await adapter.close();
    }
  }, 60_000);
});
