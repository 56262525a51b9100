/**
 * Runner fleet benchmark (issue 13 item 2): 1,000 concurrent jobs streaming into one runner
 * server on PostgreSQL. The agents run in a few child processes (bench/runner-fleet-agents.ts),
 * each agent a createRunnerClient with its own HTTP/2 connection, at a mixed rate: most jobs
 * quiet, some busy, a few bursting, as a CI fleet's logs are. The server (bench/runner-fleet-server.ts)
 * follows a sample of the jobs with follow() and times each line from the agent's write to its
 * delivery; at the end every job is read back and checked whole.
 *
 * Figures: aggregate lines/s, server RSS per open stream, server CPU per million lines,
 * write → follow() latency p50 / p99, and "nothing lost".
 *
 * Size: BENCH_FLEET_SCALE or `--scale=<f>` (e.g. `npm run bench -- runner-fleet --scale=0.1`)
 * scales the job count (1,000 × f) and the run (30 s × max(f, 1/2)). Before the main run, a
 * run of 10 jobs (same tiers) gives the cost of one request with few jobs open, to set
 * against the same with all of them (BENCH_FLEET_COMPARE=0 skips it). BENCH_FLEET_STORE=memory
 * runs the server on the memory log store instead (to tell the store's share from the rest).
 */
import { fork, type ChildProcess } from "node:child_process";
import { randomUUID } from "node:crypto";
import { once } from "node:events";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { POSTGRES_URL } from "../test/backends-fixtures.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const SECRET = "fleet-secret";

function scaleOption(): number {
  // `--scale=0.1` (bench/run.ts takes any argument without `--` as a module name).
  const arg = process.argv.find((a) => a.startsWith("--scale="));
  const raw = arg ? arg.slice("--scale=".length) : process.env.BENCH_FLEET_SCALE;
  const f = Number(raw ?? 1);
  return Number.isFinite(f) && f > 0 ? f : 1;
}

const SCALE = scaleOption();
const JOBS = Math.max(10, Math.round(1000 * SCALE));
const DURATION_MS = Math.round(30_000 * Math.max(SCALE, 1 / 2));
const RAMP_MS = 5_000;
const AGENT_PROCESSES = Number(process.env.BENCH_FLEET_PROCESSES ?? 4);
/** Every FOLLOW_EVERY-th job is followed (100 followers at 1,000 jobs). */
const FOLLOW_EVERY = Number(process.env.BENCH_FLEET_FOLLOW_EVERY ?? 10);
/** Lines per second by tier: 80 % quiet, 15 % busy, 5 % bursting (36,500 lines/s for 1,000 jobs). */
const RATES = { quiet: 5, busy: 50, burst: 500 };

function rateOf(i: number): number {
  const k = i % 20;
  return k === 0 ? RATES.burst : k <= 3 ? RATES.busy : RATES.quiet;
}

function child(file: string): ChildProcess {
  return fork(path.join(here, file), [], {
    execArgv: ["--import", "tsx", "--max-old-space-size=1024", ...(process.env.BENCH_FLEET_PROF && file.includes(process.env.BENCH_FLEET_PROF) ? ["--cpu-prof", "--cpu-prof-dir=/tmp/prof/fleet"] : [])],
    env: { ...process.env, BENCH_SECRET: SECRET, BENCH_POSTGRES_URL: POSTGRES_URL },
    stdio: ["ignore", "inherit", "inherit", "ipc"],
  });
}

async function ask<T>(c: ChildProcess, message: unknown): Promise<T> {
  const answer = once(c, "message") as Promise<[T]>;
  c.send(message as object);
  return (await answer)[0];
}

interface Sample {
  rss: number;
  heap: number;
  cpuMs: number;
  stored: number;
  results: number;
  active: number;
}

const fmt = (n: number) => Math.round(n).toLocaleString("en-US");
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? NaN;

interface AgentReport {
  sent: { id: string; lines: number }[];
  failed: number;
  calls: number;
  retries: Record<string, number>;
  lag: number;
  cpuMs: number;
}

/** What one fleet run measured. */
interface FleetRun {
  jobs: number;
  durationMs: number;
  peak: Sample;
  base: Sample;
  seconds: number;
  lines: number;
  cpuPerMillion: number;
  latency: { lines: number; p50: number; p99: number; max: number; followErrors: number; stored: { p50: number; p99: number } };
  followProbe: number[];
  reports: AgentReport[];
  totalSent: number;
  check: { jobs: number; whole: number; problems: string[] };
  results: number;
}

/** One fleet run: `jobCount` agents for `durationMs` into a fresh server process. */
async function fleet(jobCount: number, durationMs: number): Promise<FleetRun> {
  const server = child("runner-fleet-server.ts");
  const [{ port }] = (await once(server, "message")) as [{ port: number }];
  try {
    const jobs = Array.from({ length: jobCount }, (_, i) => ({ id: randomUUID(), rate: rateOf(i), startMs: Math.round((i / jobCount) * RAMP_MS) }));
    await ask(server, { follow: jobs.filter((_, i) => i % FOLLOW_EVERY === 0).map((j) => j.id) });
    const base = await ask<Sample>(server, "sample");
    const agents = Array.from({ length: Math.min(AGENT_PROCESSES, jobCount) }, () => child("runner-fleet-agents.ts"));
    // Loading a child (tsx compiling) takes seconds on a busy machine: start the clock when all are in.
    await Promise.all(agents.map((a) => once(a, "message")));
    const finished = agents.map((a, k) => {
      const mine = jobs.filter((_, i) => i % agents.length === k);
      a.send({ port, secret: SECRET, jobs: mine, durationMs });
      return once(a, "message") as Promise<[AgentReport]>;
    });
    // Steady state: every job has started; measured over the middle of the run.
    await new Promise((r) => setTimeout(r, RAMP_MS + 2_000));
    const s0 = await ask<Sample>(server, "sample");
    const t0 = performance.now();
    let peak = s0;
    const window = durationMs - RAMP_MS - 4_000;
    const samples = Math.max(1, Math.floor(window / 1000));
    for (let i = 0; i < samples; i++) {
      await new Promise((r) => setTimeout(r, window / samples));
      const s = await ask<Sample>(server, "sample");
      if (s.rss > peak.rss) peak = s;
    }
    const s1 = await ask<Sample>(server, "sample");
    const seconds = (performance.now() - t0) / 1000;
    // One follow() at a time on live jobs (not the followed ones), while every job streams.
    const followProbe = await ask<number[]>(server, { probeFollow: jobs.filter((_, i) => i % FOLLOW_EVERY === 1).slice(0, 20).map((j) => j.id) });
    const reports = (await Promise.all(finished)).map(([r]) => r);
    const sent = reports.flatMap((r) => r.sent);
    const latency = await ask<FleetRun["latency"]>(server, { delays: true });
    const end = await ask<Sample>(server, "sample");
    const check = await ask<FleetRun["check"]>(server, { verify: sent });
    for (const a of agents) a.kill();
    const lines = s1.stored - s0.stored;
    return {
      jobs: jobCount,
      durationMs,
      peak,
      base,
      seconds,
      lines,
      cpuPerMillion: ((s1.cpuMs - s0.cpuMs) / 1000 / Math.max(1, lines)) * 1e6,
      latency,
      followProbe,
      reports,
      totalSent: sent.reduce((n, j) => n + j.lines, 0),
      check,
      results: end.results,
    };
  } finally {
    const exited = once(server, "exit");
    server.send("exit");
    const t = setTimeout(() => server.kill("SIGKILL"), 10_000);
    await exited;
    clearTimeout(t);
  }
}

/** Runs the fleet benchmark and returns its Markdown section. */
export async function run(): Promise<string> {
  const few = JOBS > 10 && process.env.BENCH_FLEET_COMPARE !== "0" ? await fleet(10, 15_000) : null;
  const r = await fleet(JOBS, DURATION_MS);
  const { peak, base, latency, check, reports } = r;
  const failed = reports.reduce((n, x) => n + x.failed, 0);
  const retries = new Map<string, number>();
  for (const x of reports) for (const [k, n] of Object.entries(x.retries)) retries.set(k, (retries.get(k) ?? 0) + n);
  const retried = [...retries].map(([k, n]) => `${n} × ${k}`).join("; ") || "none";
  const perStream = (peak.rss - base.rss) / Math.max(1, peak.active);
  const lost = check.whole === check.jobs && failed === 0 && r.results === JOBS && latency.followErrors === 0;
  const store = process.env.BENCH_FLEET_STORE === "memory" ? "createMemoryLogStore (BENCH_FLEET_STORE=memory)" : `createPostgresLogStore on the local PostgreSQL, pool of ${process.env.BENCH_FLEET_POOL ?? 20}`;
  const calls = (x: FleetRun) => x.reports.reduce((n, y) => n + y.calls, 0);
  const costRows = (x: FleetRun) =>
    `| ${fmt(x.jobs)} | ${fmt(x.lines / x.seconds)} | ${(x.cpuPerMillion).toFixed(1)} µs | ${x.latency.stored.p50.toFixed(1)} / ${x.latency.stored.p99.toFixed(1)} ms | ` +
    `${median(x.followProbe).toFixed(1)} ms (${x.followProbe.length}) | ${fmt(calls(x))} over ${fmt(x.jobs)} jobs |`;
  return [
    "## Runner fleet: 1,000 concurrent jobs on PostgreSQL",
    "",
    `Method: ${fmt(JOBS)} jobs${SCALE !== 1 ? ` (scale ${SCALE})` : ""}, each an agent (\`createRunnerClient\` with its defaults, its own HTTP/2 connection) in one of ` +
      `${AGENT_PROCESSES} agent processes, started over ${RAMP_MS / 1000} s and writing for ${DURATION_MS / 1000} s at a mixed rate ` +
      `(80 % at ${RATES.quiet} lines/s, 15 % at ${RATES.busy}, 5 % at ${RATES.burst}: ${fmt(JOBS * (0.8 * RATES.quiet + 0.15 * RATES.busy + 0.05 * RATES.burst))} lines/s offered), ` +
      `lines of 40–200 bytes carrying the agent's clock, then each job's end. One server process (startRunnerServer, ${store}, memory queue, token check on). ` +
      `Every ${FOLLOW_EVERY}th job is followed with \`follow()\` in the server process from before its first line; latency is from the agent's write to that follower's delivery. ` +
      "Rates, RSS and CPU are measured over the middle of the run (every job started); RSS per stream = (peak RSS − RSS before any agent) ÷ open streams. " +
      "Afterwards every job is read back from the store and checked line by line. Agents, server and PostgreSQL share the machine.",
    "",
    "| measure | value |",
    "|---|---:|",
    `| jobs streaming at once (open calls at the RSS peak) | ${fmt(peak.active)} |`,
    `| aggregate lines/s stored (steady window, ${r.seconds.toFixed(1)} s) | ${fmt(r.lines / r.seconds)} |`,
    `| server RSS per open stream | ${(perStream / 1024).toFixed(1)} KiB (aim ≤ 64 KiB) |`,
    // Every agent holds its connection for the whole run, open call or not (calls are cut and
    // replayed under overload): per job connected is the bound that does not depend on that.
    `| server RSS per job connected ((peak − before) ÷ ${fmt(JOBS)}) | ${((peak.rss - base.rss) / JOBS / 1024).toFixed(1)} KiB |`,
    `| server RSS before agents → peak | ${(base.rss / 2 ** 20).toFixed(0)} → ${(peak.rss / 2 ** 20).toFixed(0)} MiB |`,
    `| server CPU per million lines | ${r.cpuPerMillion.toFixed(1)} CPU-s |`,
    `| write → follow() latency p50 / p99 / max (${fmt(latency.lines)} lines on ${fmt(Math.ceil(JOBS / FOLLOW_EVERY))} followed jobs) | ${latency.p50.toFixed(1)} / ${latency.p99.toFixed(1)} / ${latency.max.toFixed(0)} ms (aim p99 < 100 ms) |`,
    `| write → stored (append returned; every job) p50 / p99 | ${latency.stored.p50.toFixed(1)} / ${latency.stored.p99.toFixed(1)} ms |`,
    `| lines sent / jobs read back whole / results | ${fmt(r.totalSent)} / ${fmt(check.whole)} of ${fmt(check.jobs)} / ${fmt(r.results)} |`,
    `| StreamLogs calls started by the agents | ${fmt(calls(r))} |`,
    `| agent processes: CPU, worst timer lag | ${reports.map((x) => `${(x.cpuMs / 1000).toFixed(1)} s`).join(", ")}; ${Math.max(...reports.map((x) => x.lag)).toFixed(0)} ms |`,
    `| agent calls retried | ${retried} |`,
    `| nothing lost | ${lost ? "**held**" : `**did not hold** (${failed} agents failed, follow order errors ${latency.followErrors}; ${check.problems.join("; ")})`} |`,
    ...(few
      ? [
          "",
          `Cost per request with few and with all jobs open (a run of 10 jobs, same tiers, ${few.durationMs / 1000} s, just before the main one): ` +
            "one StreamLogs item = server CPU per stored line over the steady window (it includes the follow() deliveries and the job-row work of the store); " +
            "one follow() = a new follow() of a live job from line 0 until its first line arrives (a store read and the follower's set-up), one at a time, median.",
          "",
          "| open jobs | lines/s | server CPU per item | write → stored p50 / p99 | one follow() (probes) | calls started |",
          "|---:|---:|---:|---:|---:|---:|",
          costRows(few),
          costRows(r),
        ]
      : []),
  ].join("\n");
}
