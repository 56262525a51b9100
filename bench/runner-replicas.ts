/**
 * Runner replicas (issue 28 item 5): 1 and 2 `startRunnerServer` processes on ONE PostgreSQL
 * schema (test/fixtures/runner-replica-server.ts: the fleet bench's store, pool of 20 and
 * memory queue), the fleet's agents (bench/runner-fleet-agents.ts, 4 processes) with each job
 * assigned to the next replica in turn. Per mix, runs of 1 and 2 processes in the same module
 * run (realistic: 1, 2; flood: 1, 2, 2, 1, as load drifts); the ratio is 2 ÷ 1, runs pooled.
 *
 * Figures over the steady window (every job started, none ended): lines/s stored, write →
 * stored p50 / p99 (a line's ack is its call's `runner-committed`, which covers it from the
 * moment it is stored), CPU per line in the server processes, in PostgreSQL (every backend's,
 * /proc) and in the agents, the machine's busy share and load average; after the run every
 * job is read back whole and every result counted.
 *
 * BENCH_REPLICAS_JOBS (default 1,000), BENCH_REPLICAS_DURATION_MS (default 20,000),
 * BENCH_REPLICAS_MIX (default "realistic,flood"; also "heavy"); BENCH_REPLICAS_PROF=1 writes the servers'
 * CPU profiles to /tmp/prof/replicas (what bounds 2 processes on 2 cores).
 */
import { fork, type ChildProcess } from "node:child_process";
import { randomUUID } from "node:crypto";
import { once } from "node:events";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { createPostgresLogStore } from "../src/adapters/postgres/index.js";
import { createTestSchema } from "../test/fixtures/backends.js";
import { cpuBetween, machineCpu } from "../test/fixtures/depot-replicas.js";
import { startRunnerReplica, type RunnerReplica } from "../test/fixtures/runner-replicas.js";
import type { RunnerReplicaStats } from "../test/fixtures/runner-replica-server.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const SECRET = "replicas-secret";
const JOBS = Number(process.env.BENCH_REPLICAS_JOBS ?? 1000);
const DURATION_MS = Number(process.env.BENCH_REPLICAS_DURATION_MS ?? 20_000);
const RAMP_MS = 5_000;
const AGENT_PROCESSES = 4;
const PROF = process.env.BENCH_REPLICAS_PROF === "1";

/** Lines per second by tier, as in bench/runner-fleet.ts: 80 % quiet, 15 % busy, 5 % bursting. */
interface Mix {
  name: string;
  quiet: number;
  busy: number;
  burst: number;
  /** Server processes of each run, in run order (1, 2, 2, 1: load that drifts weighs on both alike). */
  order: number[];
}
const MIXES: Record<string, Mix> = {
  realistic: { name: "realistic", quiet: 1, busy: 10, burst: 100, order: [1, 2] },
  heavy: { name: "heavy", quiet: 5, busy: 50, burst: 500, order: [1, 2, 2, 1] },
  // Twice the heavy mix: more than the machine can take with the agents on it, so lines/s
  // stored is what 1 or 2 server processes can store here (the fleet's heavy mix fits in one).
  flood: { name: "flood", quiet: 10, busy: 100, burst: 1000, order: [1, 2, 2, 1] },
};
const MIX_NAMES = (process.env.BENCH_REPLICAS_MIX ?? "realistic,flood").split(",").filter((m) => m in MIXES);
const rateOf = (mix: Mix, i: number) => (i % 20 === 0 ? mix.burst : i % 20 <= 3 ? mix.busy : mix.quiet);
const offered = (mix: Mix, jobs: number) => jobs * (0.8 * mix.quiet + 0.15 * mix.busy + 0.05 * mix.burst);
/**
 * The replica of job i: the next in turn, shifted by one every 20 jobs. The tiers repeat
 * every 20 jobs (an even number), so plain i mod 2 would send every bursting job to replica
 * 0; the shift splits each tier evenly. O(1).
 */
const replicaOf = (i: number, n: number) => (i + Math.floor(i / 20)) % n;

const fmt = (n: number) => Math.round(n).toLocaleString("en-US");
const f1 = (n: number) => n.toFixed(1);
const loadNow = () => os.loadavg()[0]!;

interface AgentReport {
  sent: { id: string; lines: number }[];
  failed: number;
  calls: number;
  retries: Record<string, number>;
  cpuMs: number;
}

/** One agents process of the fleet bench, loaded (tsx compiles it) before the clock starts. */
async function agentProcess(): Promise<ChildProcess> {
  const c = fork(path.join(here, "runner-fleet-agents.ts"), [], {
    execArgv: ["--import", "tsx", "--max-old-space-size=1024"],
    stdio: ["ignore", "inherit", "inherit", "ipc"],
  });
  await once(c, "message");
  return c;
}

/** p-quantile of merged delay buckets (bucket upper edge in ms → count). O(buckets log buckets). */
function quantile(buckets: Map<number, number>, q: number): number {
  const edges = [...buckets.keys()].sort((a, b) => a - b);
  const total = [...buckets.values()].reduce((a, b) => a + b, 0);
  let rank = Math.floor(q * total);
  for (const edge of edges) if ((rank -= buckets.get(edge)!) < 0) return edge;
  return edges[edges.length - 1] ?? NaN;
}

/** The delays stored between two stats readings, merged over the replicas. */
function delaysBetween(before: RunnerReplicaStats[], after: RunnerReplicaStats[]): Map<number, number> {
  const out = new Map<number, number>();
  after.forEach((a, k) => {
    for (const [edge, n] of Object.entries(a.stored ?? {})) {
      const d = n - (before[k]!.stored?.[edge] ?? 0);
      if (d > 0) out.set(Number(edge), (out.get(Number(edge)) ?? 0) + d);
    }
  });
  return out;
}

/** What one run (a mix on n replicas) measured. */
interface Cell {
  mix: Mix;
  replicas: number;
  seconds: number;
  lines: number;
  perReplica: { lines: number; cpuMs: number; waitMs: number }[];
  /** Write → stored delays of the lines stored in the window (bucket upper edge, ms → count). */
  delays: Map<number, number>;
  postgresMs: number;
  busyShare: number;
  load: [number, number];
  agentsCpuMs: number;
  sent: number;
  whole: number;
  results: number;
  retries: number;
}

/** Reads every job back from the shared schema: finished, every line once and in order. */
async function verify(schema: string, sent: { id: string; lines: number }[]): Promise<number> {
  const db = await createTestSchema();
  const logs = createPostgresLogStore({ pool: db.pool, schema });
  let whole = 0;
  try {
    for (const { id, lines } of sent) {
      const state = await logs.get(id);
      const got = await logs.read(id, 0);
      let ok = state?.status === "finished" && state.committed === lines + 1 && got.length === lines;
      for (let i = 0; ok && i < got.length; i++) if (!got[i]!.line.startsWith(`${i} `)) ok = false;
      if (ok) whole++;
    }
  } finally {
    await logs.close?.();
    await db.pool.end();
  }
  return whole;
}

/** One run: JOBS agents for DURATION_MS into `n` fresh replica processes on one fresh schema. */
async function measure(mix: Mix, n: number): Promise<Cell> {
  const db = await createTestSchema();
  const replicas: RunnerReplica[] = [];
  const agents: ChildProcess[] = [];
  try {
    const flags = PROF ? ["--cpu-prof", `--cpu-prof-dir=/tmp/prof/replicas/${mix.name}-${n}`] : [];
    for (let k = 0; k < n; k++)
      replicas.push(await startRunnerReplica({ schema: db.schema, secret: SECRET, timeLines: true }, flags));
    // Tables made once up front, not by the first appends of both replicas at once.
    await Promise.all(replicas.map((r) => r.stats()));
    for (let k = 0; k < AGENT_PROCESSES; k++) agents.push(await agentProcess());
    const jobs = Array.from({ length: JOBS }, (_, i) => ({
      id: randomUUID(),
      rate: rateOf(mix, i),
      startMs: Math.round((i / JOBS) * RAMP_MS),
      replica: replicaOf(i, n),
    }));
    // Each agents process serves one replica: AGENT_PROCESSES ÷ n processes per replica.
    const perReplica = AGENT_PROCESSES / n;
    const finished = agents.map((a, p) => {
      const r = Math.floor(p / perReplica);
      const mine = jobs.filter((j, i) => j.replica === r && Math.floor(i / n) % perReplica === p % perReplica);
      a.send({ port: replicas[r]!.port, secret: SECRET, jobs: mine, durationMs: DURATION_MS });
      return once(a, "message") as Promise<[AgentReport]>;
    });
    await new Promise((r) => setTimeout(r, RAMP_MS + 2_000));
    const s0 = await Promise.all(replicas.map((r) => r.stats()));
    const cpu0 = await machineCpu();
    const load0 = loadNow();
    const t0 = performance.now();
    await new Promise((r) => setTimeout(r, DURATION_MS - RAMP_MS - 4_000));
    const s1 = await Promise.all(replicas.map((r) => r.stats()));
    const cpu1 = await machineCpu();
    const seconds = (performance.now() - t0) / 1000;
    const load1 = loadNow();
    const reports = (await Promise.all(finished)).map(([r]) => r);
    const sent = reports.flatMap((r) => r.sent);
    // Every result published: the last ends may still be on their way when the agents report.
    let end = await Promise.all(replicas.map((r) => r.stats()));
    for (let i = 0; i < 100 && end.reduce((a, s) => a + s.results, 0) < JOBS; i++) {
      await new Promise((r) => setTimeout(r, 100));
      end = await Promise.all(replicas.map((r) => r.stats()));
    }
    const whole = await verify(db.schema, sent);
    const delays = delaysBetween(s0, s1);
    const used = cpu0 && cpu1 ? cpuBetween(cpu0, cpu1) : null;
    const perReplicaFigures = s1.map((s, k) => ({
      lines: s.lines - s0[k]!.lines,
      cpuMs: s.cpuMs - s0[k]!.cpuMs,
      waitMs: s.runQueueMs - s0[k]!.runQueueMs,
    }));
    return {
      mix,
      replicas: n,
      seconds,
      lines: perReplicaFigures.reduce((a, r) => a + r.lines, 0),
      perReplica: perReplicaFigures,
      delays,
      postgresMs: used?.postgresMs ?? NaN,
      busyShare: used ? used.busyMs / (seconds * 1000) / os.cpus().length : NaN,
      load: [load0, load1],
      agentsCpuMs: reports.reduce((a, r) => a + r.cpuMs, 0),
      sent: sent.reduce((a, j) => a + j.lines, 0),
      whole,
      results: end.reduce((a, s) => a + s.results, 0),
      retries: reports.reduce((a, r) => a + Object.values(r.retries).reduce((x, y) => x + y, 0), 0),
    };
  } finally {
    for (const a of agents) if (a.exitCode === null) a.kill();
    for (const r of replicas) await r.stop();
    await db.drop();
  }
}

const usPerLine = (ms: number, lines: number) => f1((ms * 1000) / Math.max(1, lines));

/** Several runs as one: their sums, and their delays merged. O(runs × buckets). */
function pooled(cells: Cell[]): Cell {
  const delays = new Map<number, number>();
  for (const c of cells) for (const [edge, n] of c.delays) delays.set(edge, (delays.get(edge) ?? 0) + n);
  const sum = (f: (c: Cell) => number) => cells.reduce((a, c) => a + f(c), 0);
  return {
    ...cells[0]!,
    seconds: sum((c) => c.seconds),
    lines: sum((c) => c.lines),
    perReplica: [
      {
        lines: sum((c) => c.lines),
        cpuMs: sum((c) => c.perReplica.reduce((a, r) => a + r.cpuMs, 0)),
        waitMs: sum((c) => c.perReplica.reduce((a, r) => a + r.waitMs, 0)),
      },
    ],
    delays,
    postgresMs: sum((c) => c.postgresMs),
  };
}

/** Rows of one mix: each run in run order, then 2 ÷ 1 over the runs pooled by process count. */
function rows(cells: Cell[]): string[] {
  const row = (c: Cell) => {
    const servers = c.perReplica.map((r) => usPerLine(r.cpuMs, r.lines)).join(" + ");
    const serverTotal = c.perReplica.reduce((a, r) => a + r.cpuMs, 0);
    const share = (ms: number) => fmt(ms / (c.seconds * 10));
    const cores = c.perReplica.map((r) => `${share(r.cpuMs)} / ${share(r.waitMs)}`).join("; ");
    return `| ${c.replicas} | ${fmt(c.lines / c.seconds)} | ${quantile(c.delays, 0.5).toFixed(1)} / ${fmt(quantile(c.delays, 0.99))} | ${c.replicas > 1 ? `${servers} = ` : ""}${usPerLine(serverTotal, c.lines)} | ${cores} | ${usPerLine(c.postgresMs, c.lines)} | ${usPerLine(c.agentsCpuMs, c.sent)} | ${fmt(100 * c.busyShare)} % | ${f1(c.load[0])} → ${f1(c.load[1])} | ${c.whole} of ${JOBS} / ${c.results} / ${c.retries} |`;
  };
  const one = pooled(cells.filter((c) => c.replicas === 1));
  const two = pooled(cells.filter((c) => c.replicas === 2));
  const ratio = (a: number, b: number) => (a / b).toFixed(2);
  const perLine = (c: Cell) => c.perReplica[0]!.cpuMs / Math.max(1, c.lines);
  const q = (c: Cell, p: number) => quantile(c.delays, p);
  return [
    ...cells.map(row),
    `| 2 ÷ 1${cells.length > 2 ? " (runs pooled)" : ""} | ${ratio(two.lines / two.seconds, one.lines / one.seconds)} | ${ratio(q(two, 0.5), q(one, 0.5))} / ${ratio(q(two, 0.99), q(one, 0.99))} | ${ratio(perLine(two), perLine(one))} | — | ${ratio(two.postgresMs / two.lines, one.postgresMs / one.lines)} | — | — | — | — |`,
  ];
}

/** Runs the benchmark; returns its Markdown section. */
export async function run(): Promise<string> {
  const started = Date.now();
  const sections: string[] = [];
  for (const name of MIX_NAMES) {
    const mix = MIXES[name]!;
    const cells: Cell[] = [];
    for (const n of mix.order) cells.push(await measure(mix, n));
    sections.push(
      "",
      `### ${mix.name} mix (${fmt(offered(mix, JOBS))} lines/s offered)`,
      "",
      "| server processes (runs in order) | lines/s stored | write → stored p50 / p99 (ms) | server CPU µs per line (by process = total) | each server: CPU used / waiting for a CPU (% of a core) | PostgreSQL CPU µs per line | agents' CPU µs per line | machine busy | load average (1 min) | jobs read back whole / results / agent retries |",
      "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
      ...rows(cells),
    );
  }
  const minutes = (Date.now() - started) / 60_000;
  return [
    "## Runner replicas: 1 and 2 server processes on one PostgreSQL schema",
    "",
    `Method: ${fmt(JOBS)} jobs, each an agent (\`createRunnerClient\`, its own HTTP/2 connection, token checked) in one of ${AGENT_PROCESSES} agent processes (bench/runner-fleet-agents.ts), started over ${RAMP_MS / 1000} s and writing for ${DURATION_MS / 1000} s at the fleet bench's mixed rates (80 % quiet, 15 % busy, 5 % bursting), lines of 40–200 bytes carrying the agent's clock, then each job's end. Server: 1 or 2 processes of \`startRunnerServer\` (test/fixtures/runner-replica-server.ts: \`createPostgresLogStore\` on the local PostgreSQL, pool of 20 each, memory queue), all on one fresh schema; job i goes to replica (i + ⌊i/20⌋) mod n, the next in turn with a shift every 20 jobs so each rate tier is split evenly, and its agent process serves that replica only. Per mix, the runs in the order of its table (${MIX_NAMES.map((m) => `${m}: ${MIXES[m]!.order.join(", ")} processes`).join("; ")}), each into fresh processes and a fresh schema; 2 ÷ 1 pools the runs of each count (lines and CPU summed, delays merged). Measured over the steady window (every job started, none ended; ${(DURATION_MS - RAMP_MS - 4_000) / 1000} s): lines stored (the servers' onLog), write → stored delay of every line stored in the window (0.1 ms buckets; a line's ack is its call's \`runner-committed\`, sent when the call ends, so it covers the line from this moment), CPU per line stored: the server processes' own (process.cpuUsage; and each one's CPU used and time runnable but waiting for a CPU, Linux schedstat, as a share of a core over the window), PostgreSQL's (every postgres process on the machine, /proc: other engineers' queries are in it), the agents' (whole run ÷ lines sent); the machine's busy share of its ${os.cpus().length} cores and the load average at the window's start → end. Afterwards every job is read back from the shared schema and checked line by line, and the results published are counted. Module ${f1(minutes)} min.`,
    ...sections,
    "",
    "Why 2 processes store no more than 1 on this 2-core machine (the CPU per line of every part, each server's CPU profile): [docs/decisions/runner-replicas.md](docs/decisions/runner-replicas.md).",
  ].join("\n");
}
