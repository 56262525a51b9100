/**
 * What hostile jobs make the service hold through `::add-mask::` lines (issue 23, and the server-wide bound of
 * runner/service/job-maskers.ts): live jobs that each print crafted values until their own 8 MiB of forms is
 * reached, against a server with the default `limits.addMaskFormBytes` and a peer with it off, in the same run.
 */
import { fork, type ChildProcess } from "node:child_process";
import { randomUUID } from "node:crypto";
import { once } from "node:events";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { createRunnerClient, type RunnerClient } from "../src/runner/client/runner-client.js";
import { mintJobToken } from "../src/runner/protocol/token.js";
import { DEFAULT_RUNNER_LIMITS } from "../src/runner/service/contract.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const SECRET = "bench-secret";
/** Live hostile jobs on each server, and on ours alone (the peer would hold over 8 MiB each). */
const PEER_JOBS = Number(process.env.BENCH_MASK_BUDGET_PEER_JOBS ?? 100);
const JOBS = Number(process.env.BENCH_MASK_BUDGET_JOBS ?? 1_000);
/** Values a job prints: 13 fit in its own 8 MiB of forms (~600 KiB each), the 14th does not. */
const VALUES = 14;
const MiB = 1024 * 1024;
const fmt = (n: number) => Math.round(n).toLocaleString("en-US");

/** A value whose every encoding differs (~150× its bytes of forms; docs/decisions/log-masking.md, "Limits"). */
const crafted = (job: number, i: number) => `${job.toString(36)}-${i}:${"\x1f".repeat(4_000)} ~*/é<`;

interface Memory {
  rss: number;
  heapUsed: number;
  external: number;
}

/** The server (bench/runner-worker.ts, memory store) with `limits`, able to report its memory after a full GC. */
async function startWorker(limits: Record<string, number>) {
  const child: ChildProcess = fork(path.join(here, "runner-worker.ts"), ["ours"], {
    execArgv: ["--import", "tsx", "--expose-gc"],
    env: { ...process.env, BENCH_SECRET: SECRET, BENCH_LOG_STORE: "memory", BENCH_LIMITS: JSON.stringify(limits) },
    stdio: ["ignore", "inherit", "inherit", "ipc"],
  });
  const [first] = (await once(child, "message")) as [{ port: number }];
  return {
    port: first.port,
    async memory(): Promise<Memory> {
      child.send("mem");
      return ((await once(child, "message")) as [Memory])[0];
    },
    async stop() {
      const exited = once(child, "exit");
      child.send("exit");
      await exited;
    },
  };
}

/** `jobs` live jobs, each printing its crafted values (then left open: the service keeps a live job's masker). */
async function hostile(port: number, jobs: number): Promise<RunnerClient[]> {
  const clients: RunnerClient[] = [];
  for (let j = 0; j < jobs; j++) {
    const requestId = randomUUID();
    const client = createRunnerClient({
      endpoint: `http://127.0.0.1:${port}`,
      requestId,
      token: mintJobToken(SECRET, requestId),
    });
    for (let i = 0; i < VALUES; i++) client.log(`::add-mask::${crafted(j, i)}`);
    await client.flush();
    clients.push(client);
  }
  return clients;
}

/** The server's memory before and after `jobs` hostile jobs, and the seconds they took. */
async function measure(limits: Record<string, number>, jobs: number) {
  const worker = await startWorker(limits);
  try {
    const before = await worker.memory();
    const t0 = performance.now();
    const clients = await hostile(worker.port, jobs);
    const seconds = (performance.now() - t0) / 1000;
    const after = await worker.memory();
    await Promise.all(clients.map((c) => c.close()));
    return { before, after, seconds };
  } finally {
    await worker.stop();
  }
}

/** Runs the benchmark and returns its Markdown section. */
export async function run(): Promise<string> {
  const bound = DEFAULT_RUNNER_LIMITS.addMaskFormBytes;
  const rows: { name: string; jobs: number; limits: Record<string, number> }[] = [
    { name: `ours (\`addMaskFormBytes\` ${bound / MiB} MiB, the default)`, jobs: PEER_JOBS, limits: {} },
    {
      name: "peer: the server-wide bound off (each job's own 8 MiB only)",
      jobs: PEER_JOBS,
      limits: { addMaskFormBytes: 1e15 },
    },
    { name: `ours (\`addMaskFormBytes\` ${bound / MiB} MiB, the default)`, jobs: JOBS, limits: {} },
  ];
  const lines: string[] = [];
  for (const row of rows) {
    const { before, after, seconds } = await measure(row.limits, row.jobs);
    const grown = (k: keyof Memory) => (after[k] - before[k]) / MiB;
    lines.push(
      `| ${row.name} | ${fmt(row.jobs)} | ${grown("rss").toFixed(0)} | ${grown("external").toFixed(0)} | ` +
        `${grown("heapUsed").toFixed(0)} | ${(grown("rss") / row.jobs).toFixed(2)} | ${seconds.toFixed(1)} |`,
    );
  }
  return [
    "## Runner: hostile `::add-mask::` jobs, the service's memory",
    "",
    `Method: live jobs on one server (bench/runner-worker.ts, memory store, token check) in a child process; each job ` +
      `prints ${VALUES} \`::add-mask::\` lines of a crafted ~4 KiB value whose every encoding differs (~600 KiB of ` +
      "forms each; 13 fit in a job's own 8 MiB of forms), waits for the Ack and stays open (the service keeps a live " +
      "job's masker). Through `createRunnerClient`, which does not mask: the service registers every value. The " +
      "server's memory after two full GCs (`--expose-gc`), before the jobs and after them; MiB grown. Peer: the same " +
      "jobs against a server with the server-wide bound off, in the same run (not at the larger count, where it would hold every job's 8 MiB of forms and more).",
    "",
    "| server | live hostile jobs | RSS grown (MiB) | external (MiB) | heap used (MiB) | RSS a job (MiB) | seconds |",
    "|---|---:|---:|---:|---:|---:|---:|",
    ...lines,
  ].join("\n");
}
