/**
 * Soak: stalled backends under a job fleet (issue 31, items 3 and 4). Agents stream jobs
 * to a runner server whose log store is PostgreSQL and whose result queue is RabbitMQ,
 * each behind a TCP proxy (test/fixtures/tcp-proxy.ts). Mid-fleet PostgreSQL is
 * black-holed (connections accepted, bytes dropped) for some seconds, then RabbitMQ is
 * paused (TCP open, nothing read) for some seconds. Wanted: the server acknowledges lines
 * again by itself within RECOVERY_BOUND_MS of the link coming back, no acknowledged line
 * lost or doubled, and one result message per job.
 */
import { randomUUID } from "node:crypto";
import { drainQueue } from "../test/fixtures/queue-drain.js";
import { createPostgresLogStore } from "../src/adapters/postgres/index.js";
import { createRabbitMqQueue } from "../src/adapters/rabbitmq/index.js";
import { createRunnerClient, createRunnerService, startRunnerServer, type JobLogStore } from "../src/runner/index.js";
import { createTestSchema, POSTGRES_URL, RABBITMQ_URL, withBrokerInUse } from "../test/fixtures/backends.js";
import { startProxyFor, type TcpProxy } from "../test/fixtures/tcp-proxy.js";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** The stated bound: from the database link coming back to the fleet's next acknowledged line. */
const RECOVERY_BOUND_MS = 30_000;

/** The fleet's size and the outages, by scale. */
function plan(scale: number) {
  return {
    workers: Math.max(10, Math.round(100 * scale)),
    linesPerJob: Math.max(40, Math.round(200 * scale)),
    blackholeMs: scale >= 0.5 ? 10_000 : 5_000,
    // Below the adapter's heartbeat death (two silent 5 s heartbeats): the connection lives through it.
    stallMs: 5_000,
  };
}

interface Job {
  id: string;
  n: number;
  written: number;
  /** Lines the server acknowledged (its runner-committed, without the end item). */
  acked: number;
  ended: boolean;
}

/** Stored lines of a job, read straight from the database (not through the proxy). */
async function storedLines(logs: JobLogStore, id: string): Promise<string[]> {
  const out: string[] = [];
  for (let from = 0; ;) {
    const page = await logs.read(id, from, 10_000);
    for (const l of page) if (!l.marker) out.push(l.line);
    from += page.length;
    if (page.length < 10_000) return out;
  }
}

/** Runs the soak and returns its RELIABILITY.md section. */
export async function run({ scale = 1 }: { scale?: number } = {}): Promise<string> {
  return withBrokerInUse(() => soak(scale));
}

async function soak(scale: number): Promise<string> {
  const p = plan(scale);
  const db = await createTestSchema();
  const pgProxy: TcpProxy = await startProxyFor(POSTGRES_URL, 5432);
  const mqProxy: TcpProxy = await startProxyFor(RABBITMQ_URL, 5672);
  const queueName = `rd-soak-stalls-${randomUUID()}`;
  // The shipped defaults (timeouts, heartbeat) except a shorter publish bound, so the stall
  // makes publishes time out and the agents replay their ends: the case that doubled results.
  const logs = createPostgresLogStore({ connectionString: pgProxy.url(POSTGRES_URL), schema: db.schema });
  const queue = createRabbitMqQueue({
    url: mqProxy.url(RABBITMQ_URL),
    queue: queueName,
    queueArguments: { "x-expires": 600_000 },
    publishTimeoutMs: 2_000,
  });
  const runner = createRunnerService(queue, { logs });
  const server = await startRunnerServer(runner, { port: 0 });
  const jobs: Job[] = [];
  const live = new Set<{ job: Job; stats: () => number }>();
  let lastAckAt = 0;
  let unavailable = 0;
  let gaveUp = 0;
  let outagesDone = false;
  let recoveredMs = Number.NaN;
  const started = Date.now();

  // Watches the agents' acknowledged positions: the time of the latest ack anywhere.
  const watcher = setInterval(() => {
    for (const l of live) {
      const acked = Math.min(l.stats(), l.job.written);
      if (acked > l.job.acked) {
        l.job.acked = acked;
        lastAckAt = Date.now();
      }
    }
  }, 20);

  const outages = (async () => {
    await sleep(3_000);
    pgProxy.mode("blackhole");
    await sleep(p.blackholeMs);
    pgProxy.mode("pass");
    const healed = Date.now();
    while (lastAckAt < healed && Date.now() - healed < 120_000) await sleep(20);
    recoveredMs = lastAckAt >= healed ? lastAckAt - healed : Number.POSITIVE_INFINITY;
    await sleep(3_000);
    mqProxy.mode("pause");
    await sleep(p.stallMs);
    mqProxy.mode("pass");
    await sleep(3_000);
    outagesDone = true;
  })();

  async function oneJob(n: number): Promise<void> {
    const job: Job = { id: randomUUID(), n, written: 0, acked: 0, ended: false };
    jobs.push(job);
    const client = createRunnerClient({
      endpoint: server.url,
      requestId: job.id,
      backoff: { initialMs: 50, maxMs: 1_000 },
      deadlineMs: 600_000,
      onRetry: (error) => {
        if (error.code === "UNAVAILABLE") unavailable++;
      },
    });
    const watched = { job, stats: () => client.stats.committed };
    live.add(watched);
    try {
      for (let k = 1; k <= p.linesPerJob; k++) {
        job.written = k;
        if (!client.log(`job ${n} line ${k}`, k % 5 === 0)) await client.drained();
        if (k % 10 === 0) await sleep(50);
      }
      await client.end({ exitCode: 0, success: true });
      // An agent's acked position shows at its call's end: the job's end is its last ack.
      job.acked = job.written;
      lastAckAt = Date.now();
      job.ended = true;
    } catch {
      gaveUp++;
    } finally {
      job.acked = Math.max(job.acked, Math.min(client.stats.committed, job.written));
      live.delete(watched);
      await client.close();
    }
  }

  let next = 0;
  try {
    await queue.ready();
    await Promise.all(
      Array.from({ length: p.workers }, async () => {
        while (!outagesDone) await oneJob(next++);
      }),
    );
    await outages;
  } finally {
    clearInterval(watcher);
    await server.close();
    await runner.close();
    await queue.close();
    await logs.close?.();
  }

  // Every acknowledged line stored once, in order, read without the proxy.
  const direct = createPostgresLogStore({ pool: db.pool, schema: db.schema, notify: false });
  let lost = 0;
  let doubled = 0;
  for (const job of jobs) {
    const lines = await storedLines(direct, job.id);
    for (let k = 1; k <= job.acked; k++) if (lines[k - 1] !== `job ${job.n} line ${k}`) lost++;
    doubled += Math.max(0, lines.length - job.written);
  }
  await direct.close?.();
  await pgProxy.close();
  await mqProxy.close();
  await db.drop();

  const perJob = new Map<string, number>();
  for (const id of (await drainQueue(queueName)).map((m) => m.messageId)) perJob.set(id, (perJob.get(id) ?? 0) + 1);
  const ended = jobs.filter((j) => j.ended);
  const missing = ended.filter((j) => !perJob.has(j.id)).length;
  const repeated = jobs.filter((j) => (perJob.get(j.id) ?? 0) > 1).length;
  const messages = [...perJob.values()].reduce((a, b) => a + b, 0);
  const strangers = [...perJob.keys()].filter((id) => !jobs.some((j) => j.id === id)).length;
  const acked = jobs.reduce((a, j) => a + j.acked, 0);
  const held =
    recoveredMs <= RECOVERY_BOUND_MS &&
    lost === 0 &&
    doubled === 0 &&
    gaveUp === 0 &&
    missing === 0 &&
    repeated === 0 &&
    strangers === 0 &&
    ended.length === jobs.length;
  return [
    "## Runner: stalled PostgreSQL and RabbitMQ under a job fleet",
    "",
    `At scale ${scale}: ${p.workers} agents stream jobs of ${p.linesPerJob} lines to a runner server on PostgreSQL (log store) and RabbitMQ (results), each behind a TCP proxy; mid-fleet PostgreSQL is black-holed (connections accepted, bytes dropped) for ${p.blackholeMs / 1000} s, then RabbitMQ is paused (TCP open, nothing read) for ${p.stallMs / 1000} s. Adapter defaults (PostgreSQL timeouts, RabbitMQ heartbeat 5 s) except \`publishTimeoutMs: 2000\`, so publishes time out during the stall and are tried again (the case that doubled results). Wanted: lines acknowledged again within ${RECOVERY_BOUND_MS / 1000} s of PostgreSQL coming back, no acknowledged line lost or doubled, one result message per job. ${held ? "**Held.**" : "**Did not hold** (see the table)."}`,
    "",
    "| jobs | ended | lines acknowledged | lost | doubled | first ack after PostgreSQL came back (s) | results on the queue | jobs without a result | jobs with a repeated result | agents' UNAVAILABLE retries | agents that gave up | seconds |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|",
    `| ${jobs.length} | ${ended.length} | ${acked} | ${lost} | ${doubled} | ${(recoveredMs / 1000).toFixed(1)} | ${messages} | ${missing} | ${repeated} | ${unavailable} | ${gaveUp} | ${((Date.now() - started) / 1000).toFixed(1)} |`,
    "",
    "A repeated result would be a second copy of a job's result; the adapter sends one copy per connection, and the connection outlives this stall (docs/runner-protocol.md §8).",
  ].join("\n");
}
