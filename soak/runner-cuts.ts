/**
 * Soak: random connection cuts during one job (issue 9). One agent (createRunnerClient)
 * streams a job through a TCP proxy that cuts every connection at random moments (every
 * 2–20 ms, 1,000 cuts at scale 1) while the job writes lines; then the job ends. Run on
 * the fs log store and on the PostgreSQL log store. Wanted: every line stored exactly
 * once, in order (lost 0, duplicated 0) and one result for the job.
 */
import { randomUUID } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { createFsLogStore } from "../src/adapters/fs/index.js";
import { createMemoryQueue } from "../src/adapters/memory/index.js";
import { createPostgresLogStore } from "../src/adapters/postgres/index.js";
import {
  createRunnerClient,
  createRunnerService,
  mintJobToken,
  startRunnerServer,
  type JobLogStore,
} from "../src/runner/index.js";
import { createTestSchema, startTcpProxy } from "../test/fixtures/backends.js";

const SECRET = "soak-cuts-secret";
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** What one store's run came to. */
interface Outcome {
  store: string;
  cuts: number;
  lines: number;
  stored: number;
  lost: number;
  duplicated: number;
  outOfOrder: number;
  results: number;
  calls: number;
  retries: number;
  seconds: number;
}

async function cutsOn(store: string, logs: JobLogStore, targetCuts: number): Promise<Outcome> {
  const queue = createMemoryQueue();
  const runner = createRunnerService(queue, { secret: SECRET, logs });
  const server = await startRunnerServer(runner, { port: 0 });
  const proxy = await startTcpProxy("127.0.0.1", server.port);
  const requestId = randomUUID();
  const client = createRunnerClient({
    endpoint: `http://127.0.0.1:${proxy.port}`,
    requestId,
    token: mintJobToken(SECRET, requestId),
    // Short calls and quick retries, so cuts land in the middle of calls.
    maxCallMs: 200,
    backoff: { initialMs: 1, maxMs: 50 },
    connectTimeoutMs: 2_000,
    responseTimeoutMs: 5_000,
    deadlineMs: 600_000,
  });
  const started = Date.now();
  let cuts = 0;
  let written = 0;
  let writing = true;
  const cutter = (async () => {
    while (cuts < targetCuts) {
      await sleep(2 + Math.random() * 18);
      await proxy.break();
      await proxy.heal();
      cuts++;
    }
    writing = false;
  })();
  try {
    while (writing) {
      for (let i = 0; i < 20; i++) {
        written++;
        if (!client.log(`line ${String(written).padStart(7, "0")} of the job`, written % 5 === 0))
          await client.drained();
      }
      await sleep(1);
    }
    await cutter;
    await client.end({ exitCode: 0, success: true });
  } finally {
    await client.close();
  }
  const stored = (await readAll(logs, requestId)).filter((l) => !l.marker).map((l) => l.line);
  const seen = new Map<string, number>();
  for (const line of stored) seen.set(line, (seen.get(line) ?? 0) + 1);
  let lost = 0;
  for (let i = 1; i <= written; i++) if (!seen.has(`line ${String(i).padStart(7, "0")} of the job`)) lost++;
  let duplicated = 0;
  for (const n of seen.values()) duplicated += n - 1;
  let outOfOrder = 0;
  for (let i = 1; i < stored.length; i++) if (stored[i]! <= stored[i - 1]!) outOfOrder++;
  const outcome: Outcome = {
    store,
    cuts,
    lines: written,
    stored: stored.length,
    lost,
    duplicated,
    outOfOrder,
    results: queue.results.filter((r) => r.requestId === requestId).length,
    calls: client.stats.calls,
    retries: client.stats.retries,
    seconds: (Date.now() - started) / 1000,
  };
  await proxy.close();
  await server.close();
  await runner.close();
  return outcome;
}

async function readAll(logs: JobLogStore, id: string) {
  const out = [];
  for (let from = 0; ;) {
    const page = await logs.read(id, from, 10_000);
    out.push(...page);
    from += page.length;
    if (page.length < 10_000) return out;
  }
}

/** Runs the soak on both stores and returns its RELIABILITY.md section. */
export async function run({ scale = 1 }: { scale?: number } = {}): Promise<string> {
  const target = Math.max(1, Math.round(1000 * scale));
  const rows: Outcome[] = [];
  const dir = await mkdtemp(path.join(os.tmpdir(), "soak-cuts-"));
  try {
    const logs = createFsLogStore(dir);
    rows.push(await cutsOn("fs", logs, target));
    await logs.close?.();
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
  const schema = await createTestSchema();
  try {
    const logs = createPostgresLogStore({ pool: schema.pool, schema: schema.schema });
    rows.push(await cutsOn("PostgreSQL", logs, target));
    await logs.close?.();
  } finally {
    await schema.drop();
  }
  const held = rows.every(
    (r) => r.lost === 0 && r.duplicated === 0 && r.outOfOrder === 0 && r.results === 1 && r.cuts === target,
  );
  return [
    "## Runner: random connection cuts during one job",
    "",
    `One agent streams one job through a TCP proxy that resets every connection every 2–20 ms (${target} cuts) while the job writes lines; then the job ends. Calls are cut by the agent every 200 ms too. ${held ? "**Held**: no line lost or duplicated, one result." : "**DID NOT HOLD** (see the table)."}`,
    "",
    "| log store | cuts | lines written | stored | lost | duplicated | out of order | results | calls | retries | seconds |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
    ...rows.map(
      (r) =>
        `| ${r.store} | ${r.cuts} | ${r.lines} | ${r.stored} | ${r.lost} | ${r.duplicated} | ${r.outOfOrder} | ${r.results} | ${r.calls} | ${r.retries} | ${r.seconds.toFixed(1)} |`,
    ),
  ].join("\n");
}
