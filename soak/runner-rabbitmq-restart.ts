/**
 * Soak: a RabbitMQ restart during 1,000 job ends (issue 9). 1,000 jobs (40 at a time) each
 * stream three lines and their end through the runner service onto a RabbitMQ queue; when
 * a quarter of them have ended, the broker is stopped (`rabbitmqctl stop_app`, under the
 * machine-wide broker lock the tests share) until some agent got UNAVAILABLE, then started
 * again. Wanted: 0 results lost (every job's result on the queue), repeats counted.
 * It stops the shared broker: run it when no other test needs RabbitMQ.
 */
import { randomUUID } from "node:crypto";
import { drainQueue } from "../test/fixtures/queue-drain.js";
import { createMemoryLogStore } from "../src/adapters/memory/index.js";
import { createRabbitMqQueue } from "../src/adapters/rabbitmq/index.js";
import { createRunnerClient, createRunnerService, startRunnerServer, type JobResult } from "../src/runner/index.js";
import { RABBITMQ_URL, rabbitmqctl, withBrokerLock } from "../test/fixtures/backends.js";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function waitFor(check: () => boolean, what: string, ms = 60_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`gave up waiting for ${what}`);
    await sleep(50);
  }
}

/** Runs the soak and returns its RELIABILITY.md section. */
export async function run({ scale = 1 }: { scale?: number } = {}): Promise<string> {
  // At least 400 even in CI's tenth: the stop must land while ends are still arriving (with
  // 100 jobs the last ones ended before stop_app took effect, and nothing was provoked).
  const total = Math.max(400, Math.round(1000 * scale));
  const queueName = `rd-soak-restart-${randomUUID()}`;
  let adapterErrors = 0;
  const queue = createRabbitMqQueue({
    url: RABBITMQ_URL,
    queue: queueName,
    queueArguments: { "x-expires": 600_000 },
    reconnectDelayMs: { initial: 100, max: 1_000 },
    onError: () => adapterErrors++,
  });
  const runner = createRunnerService(queue, { logs: createMemoryLogStore() });
  const server = await startRunnerServer(runner, { port: 0 });
  const jobs = Array.from({ length: total }, () => randomUUID());
  let ended = 0;
  let endsInFlight = 0;
  let endsInFlightAtOutage = 0;
  let unavailable = 0;
  let gaveUp = 0;
  let outage: Promise<void> | null = null;
  // Resolves once the adapter saw the stopped broker go away (or the outage is over).
  let markDown!: () => void;
  const brokerDown = new Promise<void>((resolve) => (markDown = resolve));
  let downMs = 0;
  const started = Date.now();
  try {
    await queue.ready();
    let next = 0;
    await Promise.all(
      Array.from({ length: 40 }, async () => {
        while (next < jobs.length) {
          const i = next++;
          const requestId = jobs[i]!;
          if (ended >= Math.floor(total / 4) && !outage) {
            outage = withBrokerLock(async () => {
              const down = Date.now();
              try {
                await rabbitmqctl("stop_app");
                await waitFor(() => !queue.connected, "the adapter to see the broker go away");
                endsInFlightAtOutage = endsInFlight;
                markDown();
                // Down until agents got UNAVAILABLE (the service's publish bound spent) and retry.
                await waitFor(() => unavailable > 0, "an agent to get UNAVAILABLE");
              } finally {
                markDown();
                await rabbitmqctl("start_app");
                downMs = Date.now() - down;
              }
            });
            outage.catch(() => {});
          }
          const client = createRunnerClient({
            endpoint: server.url,
            requestId,
            backoff: { initialMs: 50, maxMs: 1_000 },
            onRetry: (error) => {
              if (error.code === "UNAVAILABLE") unavailable++;
            },
          });
          try {
            client.log(`job ${i} starting`);
            client.log(`job ${i} building`, true);
            client.log(`job ${i} done`);
            endsInFlight++;
            // The last 40 jobs (one per worker) hold their ends, once a stop is under way,
            // until the broker is down: in CI's tenth 300 jobs follow the trigger, and a loaded
            // machine's slow rabbitmqctl could let them all end first (nothing would meet the
            // outage, and the wait for UNAVAILABLE would fail). Counted as waiting at the stop.
            if (outage && jobs.length - i <= 40) await brokerDown;
            await client.end({ exitCode: i % 7, success: i % 7 === 0 });
          } catch {
            gaveUp++;
          } finally {
            endsInFlight--;
            await client.close();
          }
          ended++;
        }
      }),
    );
    if (outage) await outage;
  } finally {
    await server.close();
    await runner.close();
    await queue.close();
  }
  const messages = await drainQueue(queueName);
  const perJob = new Map<string, number>();
  for (const m of messages) perJob.set(m.messageId, (perJob.get(m.messageId) ?? 0) + 1);
  const lost = jobs.filter((id) => !perJob.has(id)).length;
  const repeated = jobs.filter((id) => (perJob.get(id) ?? 0) > 1).length;
  const wrong = messages.filter(
    (m) => m.body.requestId !== m.messageId || m.body.lines.stdout !== 2 || m.body.lines.stderr !== 1,
  ).length;
  const held = outage !== null && lost === 0 && gaveUp === 0 && wrong === 0;
  return [
    "## Runner: a RabbitMQ restart during job ends",
    "",
    `${total} jobs (40 at a time) stream three lines and their end onto a RabbitMQ queue (the shipped adapter and service defaults); after ${Math.floor(total / 4)} ends the broker is stopped (\`rabbitmqctl stop_app\`) until agents get UNAVAILABLE, then started. ${held ? "**Held**: no result lost." : "**DID NOT HOLD** (see the table)."}`,
    "",
    "| jobs | results lost | jobs with a repeated result | results on the queue | wrong results | broker down (s) | ends waiting at the stop | agents' UNAVAILABLE retries | agents that gave up | seconds |",
    "|---|---|---|---|---|---|---|---|---|---|",
    `| ${total} | ${lost} | ${repeated} | ${messages.length} | ${wrong} | ${(downMs / 1000).toFixed(1)} | ${endsInFlightAtOutage} | ${unavailable} | ${gaveUp} | ${((Date.now() - started) / 1000).toFixed(1)} |`,
    "",
    "A repeated result is a publish whose confirm was lost with the connection and that the adapter sent again (at least once; consumers deduplicate on `messageId`).",
    `Adapter errors reported to onError during the outage: ${adapterErrors}.`,
  ].join("\n");
}
