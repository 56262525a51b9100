/**
 * Two runner server processes on one PostgreSQL schema (test/fixtures/runner-replica-server.ts),
 * publishing to one RabbitMQ queue, an agent reaching them through a TCP proxy (the load
 * balancer). A stream cut and resumed on the other replica, and a replica killed with SIGKILL
 * mid-stream: every line stored exactly once, in order, and one result published.
 * (test/backends/runner-on-rabbitmq-postgres.test.ts hands a job over between two services
 * in one process; here each replica is its own process, and one dies without closing.)
 */
import { randomUUID } from "node:crypto";
import { drainQueue } from "../../fixtures/queue-drain.js";
import { describe, expect, it } from "vitest";
import { createPostgresLogStore } from "../../../src/adapters/postgres/index.js";
import { createRunnerClient } from "../../../src/runner/client/runner-client.js";
import { createTestSchema, needs, RABBITMQ_URL, startTcpProxy } from "../../fixtures/backends.js";
import { startRunnerReplica, type RunnerReplica } from "../../fixtures/runner-replicas.js";

needs("postgres", "rabbitmq");

async function waitFor(check: () => boolean | Promise<boolean>, what: string, tries = 1200): Promise<void> {
  for (let i = 0; i < tries; i++) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error(`timed out waiting for ${what}`);
}

/** Two replica processes on a fresh schema and queue, a proxy to the first, and a cleanup. */
async function twoReplicas() {
  const db = await createTestSchema();
  const queue = `rd-test-replicas-${randomUUID()}`;
  const replicas: RunnerReplica[] = await Promise.all(
    [0, 1].map(() => startRunnerReplica({ schema: db.schema, rabbitmq: { url: RABBITMQ_URL, queue } })),
  );
  const proxy = await startTcpProxy("127.0.0.1", replicas[0]!.port);
  const logs = createPostgresLogStore({ pool: db.pool, schema: db.schema });
  return {
    replicas,
    proxy,
    logs,
    queue,
    async close() {
      await proxy.close();
      for (const r of replicas) await r.stop();
      await logs.close?.();
      await db.drop();
    },
  };
}

const lineOf = (i: number) => `line ${i} ${"x".repeat(i % 97)}`;

describe("runner replicas in two processes on one PostgreSQL schema", () => {
  it("a stream cut and resumed on the other replica: every line stored once, one result", async () => {
    const set = await twoReplicas();
    const [a, b] = set.replicas as [RunnerReplica, RunnerReplica];
    const requestId = randomUUID();
    const total = 3000;
    const client = createRunnerClient({
      endpoint: `http://127.0.0.1:${set.proxy.port}`,
      requestId,
      backoff: { initialMs: 20, maxMs: 200 },
    });
    try {
      for (let i = 0; i < total; i++) {
        client.log(lineOf(i), i % 7 === 0);
        if (i % 100 === 99) await new Promise((r) => setTimeout(r, 2));
        if (i === 1500) {
          // A's store has lines of this call, and the cut comes while it is still open.
          await waitFor(async () => (await a.stats()).lines > 0, "replica A to store lines");
          set.proxy.retarget(b.port);
          await set.proxy.break();
          await set.proxy.heal();
        }
      }
      await client.end({ exitCode: 0, success: true, repoUrl: "r", commitSha: "c" });
      expect(client.stats.retries).toBeGreaterThan(0);
      const [sa, sb] = await Promise.all([a.stats(), b.stats()]);
      // Both replicas stored part of the job: it really resumed on the other one.
      expect(sa.lines).toBeGreaterThan(0);
      expect(sb.lines).toBeGreaterThan(0);
      expect(sa.results + sb.results).toBe(1);

      const state = await set.logs.get(requestId);
      expect(state).toMatchObject({ status: "finished", committed: total + 1, storedLines: total });
      const lines = await set.logs.read(requestId, 0);
      expect(lines.map((l) => l.line)).toEqual(Array.from({ length: total }, (_, i) => lineOf(i)));
      expect(lines.map((l) => l.stderr)).toEqual(Array.from({ length: total }, (_, i) => i % 7 === 0));
    } finally {
      await client.close();
      await set.close();
    }
    expect((await drainQueue(set.queue)).map((m) => m.messageId)).toEqual([requestId]);
  }, 60_000);

  it("a replica killed (SIGKILL) mid-stream: the agent resumes on the other; nothing acknowledged lost, nothing stored twice", async () => {
    const set = await twoReplicas();
    const [a, b] = set.replicas as [RunnerReplica, RunnerReplica];
    const requestId = randomUUID();
    const total = 4000;
    const client = createRunnerClient({
      endpoint: `http://127.0.0.1:${set.proxy.port}`,
      requestId,
      backoff: { initialMs: 20, maxMs: 200 },
    });
    let ackedAtKill = -1;
    let storedAtKill = -1;
    try {
      for (let i = 0; i < total; i++) {
        client.log(lineOf(i), i % 7 === 0);
        if (i % 100 === 99) await new Promise((r) => setTimeout(r, 2));
        if (i === 999) await client.flush();
        if (i === 2000) {
          // Killed while its call is open and holds lines stored but not yet acknowledged:
          // those the agent replays to B must not be stored a second time.
          await waitFor(
            async () => (await a.stats()).lines > client.stats.committed,
            "replica A to store lines past the last ack",
          );
          storedAtKill = (await a.stats()).lines;
          ackedAtKill = client.stats.committed;
          set.proxy.retarget(b.port);
          await a.kill();
        }
      }
      await client.end({ exitCode: 0, success: true, repoUrl: "r", commitSha: "c" });
      expect(a.child.signalCode).toBe("SIGKILL");
      expect(ackedAtKill).toBeGreaterThanOrEqual(1000);
      expect(storedAtKill).toBeGreaterThan(ackedAtKill);
      expect(client.stats.retries).toBeGreaterThan(0);
      const sb = await b.stats();
      expect(sb.lines).toBeGreaterThan(0);
      // B stored only what A had not: the lines A stored past the ack are not stored again.
      expect(sb.lines).toBeLessThanOrEqual(total - storedAtKill);
      expect(sb.results).toBe(1);

      const state = await set.logs.get(requestId);
      expect(state).toMatchObject({ status: "finished", committed: total + 1, storedLines: total });
      const lines = await set.logs.read(requestId, 0);
      expect(lines.map((l) => l.line)).toEqual(Array.from({ length: total }, (_, i) => lineOf(i)));
    } finally {
      await client.close();
      await set.close();
    }
    expect((await drainQueue(set.queue)).map((m) => m.messageId)).toEqual([requestId]);
  }, 60_000);
});
