/**
 * The runner on real backends: results survive a RabbitMQ restart, and two runner
 * servers sharing one PostgreSQL log store hand a job over without loss or duplicates.
 */
import { randomUUID } from "node:crypto";
import { drainQueue } from "../fixtures/queue-drain.js";
import { describe, expect, it } from "vitest";
import { createRabbitMqQueue } from "../../src/adapters/rabbitmq/index.js";
import { createPostgresLogStore } from "../../src/adapters/postgres/index.js";
import { createMemoryLogStore } from "../../src/adapters/memory/index.js";
import { createRunnerService, startRunnerServer } from "../../src/runner/index.js";
import { createRunnerClient } from "../../src/runner/client/runner-client.js";
import type { JobResult } from "../../src/runner/ports.js";
import {
  BROKER_CONTROL_MISSING,
  brokerConnections,
  createTestSchema,
  needs,
  RABBITMQ_URL,
  rabbitmqctl,
  startTcpProxy,
  acquireBrokerOutage,
} from "../fixtures/backends.js";

needs("postgres", "rabbitmq");

/** Runs `work` over `items` with at most `limit` at a time. */
async function pool<T>(items: T[], limit: number, work: (item: T, index: number) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: limit }, async () => {
      while (next < items.length) {
        const i = next++;
        await work(items[i]!, i);
      }
    }),
  );
}

async function waitFor(check: () => boolean | Promise<boolean>, what: string, tries = 600): Promise<void> {
  for (let i = 0; i < tries; i++) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`timed out waiting for ${what}`);
}

describe("runner on RabbitMQ: a broker restart loses no result", () => {
  it("1 000 jobs end while RabbitMQ stops and starts: every result arrives, at most once more (default timeouts)", async ({
    skip,
  }) => {
    skip(BROKER_CONTROL_MISSING !== null, BROKER_CONTROL_MISSING ?? undefined);
    const queueName = `rd-test-restart-${randomUUID()}`;
    const errors: unknown[] = [];
    // The shipped defaults: the adapter's publishTimeoutMs (8 s) below the service's publish
    // bound (publishRetry.maxMs, 10 s). The outage outlasts the bound, so calls end
    // UNAVAILABLE while publishes may still be in flight, and the replayed ends must not
    // start second ones.
    const queue = createRabbitMqQueue({
      url: RABBITMQ_URL,
      queue: queueName,
      queueArguments: { "x-expires": 600_000 },
      reconnectDelayMs: { initial: 100, max: 1_000 },
      onError: (e) => errors.push(e),
    });
    const runner = createRunnerService(queue, { logs: createMemoryLogStore() });
    const server = await startRunnerServer(runner, { port: 0 });
    const jobs = Array.from({ length: 1000 }, () => randomUUID());
    let ended = 0;
    let endsInFlight = 0;
    let endsInFlightAtOutage = -1;
    const unavailable = { count: 0 };
    // Every retry's code, so a run that never sees UNAVAILABLE says what it saw instead.
    const retryCodes = new Map<string, number>();
    let outage: Promise<void> | null = null;
    // Resolves once the adapter saw the stopped broker go away (or the outage is over).
    let markDown!: () => void;
    const brokerDown = new Promise<void>((resolve) => (markDown = resolve));
    // The broker is ours from before the first job: the outage must land while jobs run.
    const releaseBroker = await acquireBrokerOutage();
    try {
      await queue.ready();
      await pool(jobs, 40, async (requestId, i) => {
        if (ended === 250 && !outage) {
          outage = (async () => {
            expect(await brokerConnections()).toBeGreaterThan(0);
            try {
              await rabbitmqctl("stop_app");
              // stop_app really closes client connections: the adapter sees its own drop.
              await waitFor(() => !queue.connected, "the adapter to see the broker go away");
              endsInFlightAtOutage = endsInFlight;
              markDown();
              // Stay down until runners got UNAVAILABLE (publish bound spent) and retry.
              // The service answers UNAVAILABLE 10 s after an end reached it; a loaded CI
              // machine stretches that, so the wait is generous (the test's own bound is 240 s).
              await waitFor(() => unavailable.count > 0, "a call to end UNAVAILABLE", 2400).catch((error: Error) => {
                throw new Error(
                  `${error.message}; ends in flight ${endsInFlight}, ended ${ended}, retries seen ${JSON.stringify([...retryCodes])}`,
                );
              });
            } finally {
              markDown();
              await rabbitmqctl("start_app");
            }
          })();
          outage.catch(() => {});
        }
        const client = createRunnerClient({
          endpoint: server.url,
          requestId,
          backoff: { initialMs: 50, maxMs: 1_000 },
          onRetry: (error) => {
            retryCodes.set(error.code, (retryCodes.get(error.code) ?? 0) + 1);
            if (error.code === "UNAVAILABLE") unavailable.count++;
          },
        });
        try {
          client.log(`job ${i} starting`);
          client.log(`job ${i} building`, true);
          client.log(`job ${i} done`);
          endsInFlight++;
          // The last 40 jobs (one per worker) hold their ends, once a stop is under way, until
          // the broker is down: however slow rabbitmqctl is beside the jobs on a loaded
          // machine, the run cannot end all its jobs before the stop takes effect (no end
          // would then meet the outage). Counted as in flight: they wait on the stopped broker.
          if (outage && jobs.length - i <= 40) await brokerDown;
          await client.end({
            exitCode: i % 7,
            success: i % 7 === 0,
            repoUrl: "https://git.example.com/app.git",
            commitSha: "abc123",
          });
          endsInFlight--;
        } finally {
          await client.close();
        }
        ended++;
      });
      expect(outage).not.toBeNull();
      await outage;
    } finally {
      await releaseBroker();
      await server.close();
      await runner.close();
      await queue.close();
    }
    const messages = await drainQueue(queueName);
    const perJob = new Map<string, number>();
    for (const m of messages) perJob.set(m.messageId, (perJob.get(m.messageId) ?? 0) + 1);
    expect([...perJob.keys()].sort()).toEqual([...jobs].sort());
    // At least once; at most once more (a confirm lost with the connection is retried by
    // the adapter, so the broker may hold that one result twice).
    const counts = [...perJob.values()];
    expect(Math.min(...counts)).toBe(1);
    expect(Math.max(...counts)).toBeLessThanOrEqual(2);
    const repeats = messages.length - jobs.length;
    console.info(`RabbitMQ restart: ${messages.length} messages for ${jobs.length} jobs (${repeats} repeated)`);
    for (const m of messages) {
      expect(m.body.requestId).toBe(m.messageId);
      expect(m.body).toMatchObject({ outcome: "finished", lines: { stdout: 2, stderr: 1 } });
    }
    // The outage was real: the adapter saw its connection drop, job ends were waiting on
    // the stopped broker, and runners got UNAVAILABLE and replayed their ends.
    expect(errors.length).toBeGreaterThan(0);
    expect(endsInFlightAtOutage).toBeGreaterThan(0);
    expect(unavailable.count).toBeGreaterThan(0);
    // Longer than the default 60 s: the broker lock is taken inside the test and may first
    // wait for another file's use of the broker (the adapter suite, the example) to finish.
  }, 240_000);
});

describe("runner on PostgreSQL: two servers share one log store", () => {
  it("a runner cut off mid-job resumes on the other server: no line lost or duplicated, one result", async () => {
    const db = await createTestSchema();
    const queueName = `rd-test-handover-${randomUUID()}`;
    const queues = [0, 1].map(() =>
      createRabbitMqQueue({ url: RABBITMQ_URL, queue: queueName, queueArguments: { "x-expires": 120_000 } }),
    );
    const logs = [0, 1].map(() => createPostgresLogStore({ pool: db.pool, schema: db.schema }));
    const runners = [0, 1].map((i) => createRunnerService(queues[i]!, { logs: logs[i]! }));
    const servers = await Promise.all(runners.map((r) => startRunnerServer(r, { port: 0 })));
    const proxy = await startTcpProxy("127.0.0.1", servers[0]!.port);
    const requestId = randomUUID();
    const total = 3000;
    const client = createRunnerClient({
      endpoint: `http://127.0.0.1:${proxy.port}`,
      requestId,
      maxCallMs: 100,
      backoff: { initialMs: 20, maxMs: 200 },
    });
    try {
      let cuts = 0;
      for (let i = 0; i < total; i++) {
        client.log(`line ${i}`, i % 5 === 0);
        if (i % 50 === 49) await new Promise((r) => setTimeout(r, 2));
        // Hand the runner over while a call is in flight: 1 → 2 at a third, 2 → 1 at two thirds.
        if (i === 1000 || i === 2000) {
          await waitFor(() => client.stats.committed > 0, "a first commit");
          proxy.retarget(servers[cuts % 2 === 0 ? 1 : 0]!.port);
          await proxy.break();
          await proxy.heal();
          cuts++;
        }
      }
      await client.end({ exitCode: 0, success: true, repoUrl: "r", commitSha: "c" });
      expect(cuts).toBe(2);
      expect(client.stats.retries).toBeGreaterThan(0);

      const state = await logs[0]!.get(requestId);
      expect(state).toMatchObject({ status: "finished", committed: total + 1, storedLines: total });
      expect(state?.lines).toEqual({ stdout: total - total / 5, stderr: total / 5 });
      const lines = await logs[1]!.read(requestId);
      expect(lines.map((l) => l.line)).toEqual(Array.from({ length: total }, (_, i) => `line ${i}`));
      expect(lines.map((l) => l.stderr)).toEqual(Array.from({ length: total }, (_, i) => i % 5 === 0));
    } finally {
      await client.close();
      await proxy.close();
      for (const s of servers) await s.close();
      for (const r of runners) await r.close();
      for (const q of queues) await q.close();
      for (const l of logs) await l.close?.();
    }
    try {
      const messages = (await drainQueue(queueName)).filter((m) => m.messageId === requestId);
      expect(messages).toHaveLength(1);
      expect(messages[0]!.body).toMatchObject({
        requestId,
        outcome: "finished",
        lines: { stdout: total - total / 5, stderr: total / 5 },
      });
    } finally {
      await db.drop();
    }
  });
});
