/**
 * Soak: kill -9 of the runner server mid-stream (issue 9). A server process
 * (soak/runner-server-child.ts: fs log store, a results file fsync'd per publish) is killed
 * with SIGKILL at random moments (every 100–400 ms, 200 kills at scale 1) and started again
 * on the same store and port, while agents (createRunnerClient, 4 jobs at a time) run
 * jobs: each job's program writes numbered lines then ends. Wanted: each stored log equals
 * the program's output, and one result per job (the contract allows one more only after a
 * crash between publish and record; consumers deduplicate on the request ID).
 */
import { spawn, type ChildProcess } from "node:child_process";
import { randomUUID } from "node:crypto";
import { once } from "node:events";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";
import { createFsLogStore } from "../src/adapters/fs/index.js";
import { createRunnerClient, mintJobToken, type JobResult } from "../src/runner/index.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const SECRET = "soak-kill-secret";
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function freePort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as net.AddressInfo).port;
  await new Promise((resolve) => server.close(resolve));
  return port;
}

/** The program of job `n`: its output lines. */
function programOutput(n: number): string[] {
  const count = 200 + ((n * 37) % 400);
  return Array.from({ length: count }, (_, i) => `job ${n} line ${i} ${"·".repeat(i % 50)}`);
}

/** Runs the soak and returns its RELIABILITY.md section. */
export async function run({ scale = 1 }: { scale?: number } = {}): Promise<string> {
  const targetKills = Math.max(1, Math.round(200 * scale));
  const work = await mkdtemp(path.join(os.tmpdir(), "soak-kill-"));
  // Bundled once: a server restart then costs node's start-up, not a TypeScript loader's.
  // Inside the project, so its bare imports resolve to node_modules.
  const bundle = path.join(
    here,
    "..",
    "node_modules",
    ".cache",
    "runner-depot-soak",
    `runner-server-${process.pid}.mjs`,
  );
  await build({
    entryPoints: [path.join(here, "runner-server-child.ts")],
    bundle: true,
    platform: "node",
    format: "esm",
    outfile: bundle,
    packages: "external",
    absWorkingDir: path.join(here, ".."),
    logLevel: "silent",
  });
  const storeDir = path.join(work, "store");
  const resultsFile = path.join(work, "results.jsonl");
  const port = await freePort();
  let child: ChildProcess | null = null;

  async function startServer(): Promise<void> {
    const proc = spawn(process.execPath, [bundle, storeDir, String(port), resultsFile, SECRET], {
      stdio: ["ignore", "pipe", "inherit"],
      cwd: path.join(here, ".."),
    });
    child = proc;
    let out = "";
    proc.stdout!.on("data", (d: Buffer) => (out += d));
    while (!out.includes("ready")) {
      if (proc.exitCode !== null) throw new Error(`the runner server exited with ${proc.exitCode}`);
      await sleep(5);
    }
  }

  const started = Date.now();
  await startServer();
  let kills = 0;
  let killing = true;
  const killer = (async () => {
    while (kills < targetKills) {
      await sleep(100 + Math.random() * 300);
      const victim = child!;
      victim.kill("SIGKILL");
      await once(victim, "exit");
      kills++;
      await startServer();
    }
    killing = false;
  })();

  const jobs: Array<{ id: string; n: number }> = [];
  let next = 0;
  let failures = 0;
  async function agent(): Promise<void> {
    while (killing) {
      const n = next++;
      const id = randomUUID();
      jobs.push({ id, n });
      const client = createRunnerClient({
        endpoint: `http://127.0.0.1:${port}`,
        requestId: id,
        token: mintJobToken(SECRET, id),
        maxCallMs: 100,
        backoff: { initialMs: 10, maxMs: 200 },
        connectTimeoutMs: 2_000,
        responseTimeoutMs: 5_000,
      });
      try {
        const lines = programOutput(n);
        for (let i = 0; i < lines.length; i++) {
          if (!client.log(lines[i]!, i % 7 === 0)) await client.drained();
          // The program takes its time: the stream spans kills.
          if (i % 25 === 0) await sleep(5);
        }
        await client.end({ exitCode: n % 3, success: n % 3 === 0 });
      } catch {
        failures++;
      } finally {
        await client.close();
      }
    }
  }
  await Promise.all([agent(), agent(), agent(), agent(), killer]);
  (child as ChildProcess | null)?.kill("SIGKILL");
  if (child) await once(child, "exit").catch(() => undefined);

  // Check against the store the server left behind, and the results file.
  const logs = createFsLogStore(storeDir);
  let equal = 0;
  const unequal: string[] = [];
  for (const job of jobs) {
    const stored = (await logs.read(job.id, 0, 1_000_000)).filter((l) => !l.marker).map((l) => l.line);
    const want = programOutput(job.n);
    if (stored.length === want.length && stored.every((l, i) => l === want[i])) equal++;
    else unequal.push(`${job.n}: ${stored.length}/${want.length} lines`);
  }
  await logs.close?.();
  const published = (await readFile(resultsFile, "utf8"))
    .split("\n")
    .filter(Boolean)
    .map((l) => JSON.parse(l) as JobResult);
  const perJob = new Map<string, number>();
  for (const r of published) perJob.set(r.requestId, (perJob.get(r.requestId) ?? 0) + 1);
  const exactlyOne = jobs.filter((j) => perJob.get(j.id) === 1).length;
  const repeated = jobs.filter((j) => (perJob.get(j.id) ?? 0) > 1).length;
  const missing = jobs.filter((j) => !perJob.has(j.id)).length;
  const most = Math.max(0, ...perJob.values());
  // A repeated result must be the same result (the same end, published again).
  const inconsistent = jobs.filter(
    (j) =>
      new Set(
        published
          .filter((r) => r.requestId === j.id)
          .map((r) => `${r.exitCode}/${r.success}/${r.lines.stdout}/${r.lines.stderr}`),
      ).size > 1,
  ).length;
  const wrongOutcome = published.filter((r) => r.outcome !== "finished").length;
  const seconds = (Date.now() - started) / 1000;
  await rm(work, { recursive: true, force: true });
  await rm(bundle, { force: true });

  const held = equal === jobs.length && missing === 0 && inconsistent === 0 && failures === 0 && wrongOutcome === 0;
  return [
    "## Runner: kill -9 of the runner server mid-stream",
    "",
    `The runner server (fs log store, results appended and fsync'd per publish) is killed with SIGKILL every 100–400 ms and restarted on the same store and port, ${kills} times, while 4 agents run jobs back to back (200–600 lines each, written over time, calls cut every 75–100 ms). ${held ? "**Held**: every stored log equals its program's output; every job has its result (one distinct result per job for a consumer that deduplicates on the request ID, as the protocol requires)." : "**DID NOT HOLD** (see below)."}`,
    "",
    "A result is published again only when the server died between the queue's acceptance and the store's record of it (the agent then replays the end); a job whose end straddles several kills can be published once per such crash. Exactly one publish per job would need an idempotent queue; the protocol's consumers deduplicate on `messageId` = request ID.",
    "",
    "| kills | jobs | logs equal to the output | jobs with exactly 1 publish | with repeated publishes (max per job) | repeats that differ | jobs without a result | agents that gave up | seconds |",
    "|---|---|---|---|---|---|---|---|---|",
    `| ${kills} | ${jobs.length} | ${equal} | ${exactlyOne} | ${repeated} (${most}) | ${inconsistent} | ${missing} | ${failures} | ${seconds.toFixed(1)} |`,
    ...(unequal.length > 0 ? ["", `Unequal logs: ${unequal.slice(0, 10).join("; ")}`] : []),
  ].join("\n");
}
