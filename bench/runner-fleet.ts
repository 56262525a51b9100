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
 * against the same with all of them (BENCH_FLEET_COMPARE=0 skips it). Each mix also runs at half the
 * jobs (same per-job rates and tiers) just before the full run, for the marginal memory per
 * open stream: what one more stream adds, apart from what the process holds whatever the
 * number of streams (see marginalRows; BENCH_FLEET_MARGINAL=0 skips the half runs). BENCH_FLEET_STORE=memory
 * runs the server on the memory log store instead (to tell the store's share from the rest).
 * BENCH_FLEET_MIX=heavy or =realistic runs one mix (default both, see MIXES);
 * BENCH_FLEET_SERVER_KEEPALIVE sets the server's keepAliveMs (0: off); BENCH_FLEET_QUEUED_BYTES the
 * service's limits.queuedBytes (the budget of items not yet stored); BENCH_FLEET_ALLOC=<file> writes
 * the server's sampled allocations over the run (a .heapprofile, collected objects included); BENCH_FLEET_GROUP_STATEMENTS
 * the PostgreSQL store's groupStatements and BENCH_FLEET_MAX_CALL_MS the agents' maxCallMs (to measure a setting; default
 * theirs); BENCH_FLEET_PROF=server (or =agents) writes CPU profiles of those processes to /tmp/prof/fleet; BENCH_FLEET_DEBUG=1
 * prints the server's state each second and every agent retry with its job's rate.
 */
import { fork, type ChildProcess } from "node:child_process";
import { randomUUID } from "node:crypto";
import { once } from "node:events";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { readFileSync } from "node:fs";
import { loadavg } from "node:os";
import pg from "pg";
import { POSTGRES_URL } from "../test/fixtures/backends.js";

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
// BENCH_FLEET_DURATION_MS: a shorter run for iteration (the default method is 30 s × scale).
const DURATION_MS = Number(process.env.BENCH_FLEET_DURATION_MS ?? Math.round(30_000 * Math.max(SCALE, 1 / 2)));
const RAMP_MS = 5_000;
const AGENT_PROCESSES = Number(process.env.BENCH_FLEET_PROCESSES ?? 4);
/** Every FOLLOW_EVERY-th job is followed (100 followers at 1,000 jobs). */
const FOLLOW_EVERY = Number(process.env.BENCH_FLEET_FOLLOW_EVERY ?? 10);
/** Lines per second by tier: 80 % quiet, 15 % busy, 5 % bursting. */
interface Mix {
  name: string;
  quiet: number;
  busy: number;
  burst: number;
}
/**
 * The heavy mix (36,500 lines/s for 1,000 jobs) is the issue's; it offers more than this
 * 2-core machine, shared with PostgreSQL and the agents, can store (see the section). The
 * realistic one (7,300 lines/s) is a CI fleet's: most jobs print a line a second or less,
 * a few compile loudly (docs/decisions/runner-throughput.md).
 */
const MIXES: Record<string, Mix> = {
  heavy: { name: "heavy", quiet: 5, busy: 50, burst: 500 },
  realistic: { name: "realistic", quiet: 1, busy: 10, burst: 100 },
  // Every job at 1 line/s: a load the server keeps up with here, so memory per open stream is
  // the streams' own and not a backlog's.
  idle: { name: "idle", quiet: 1, busy: 1, burst: 1 },
};
const MIX_NAMES = (process.env.BENCH_FLEET_MIX ?? "heavy,realistic,idle").split(",").filter((m) => m in MIXES);

function rateOf(mix: Mix, i: number): number {
  const k = i % 20;
  return k === 0 ? mix.burst : k <= 3 ? mix.busy : mix.quiet;
}

const offered = (mix: Mix, jobs: number) => jobs * (0.8 * mix.quiet + 0.15 * mix.busy + 0.05 * mix.burst);

function child(file: string): ChildProcess {
  return fork(path.join(here, file), [], {
    // BENCH_FLEET_SERVER_FLAGS: extra Node/V8 flags for the server process only (e.g. --max-semi-space-size=2), to measure a deployment's setting; none by default.
    execArgv: [
      "--import",
      "tsx",
      "--max-old-space-size=1024",
      ...(file.includes("server")
        ? ["--expose-gc", ...(process.env.BENCH_FLEET_SERVER_FLAGS?.split(" ").filter(Boolean) ?? [])]
        : []),
      ...(process.env.BENCH_FLEET_PROF && file.includes(process.env.BENCH_FLEET_PROF)
        ? ["--cpu-prof", "--cpu-prof-dir=/tmp/prof/fleet"]
        : []),
    ],
    // BENCH_FLEET_SERVER_ENV: extra environment for the server process only, "K=V K=V" (e.g. glibc's MALLOC_ARENA_MAX=2), to measure a host's setting; none by default.
    env: {
      ...process.env,
      ...(file.includes("server") ? serverEnv() : {}),
      BENCH_SECRET: SECRET,
      BENCH_POSTGRES_URL: POSTGRES_URL,
    },
    stdio: ["ignore", "inherit", "inherit", "ipc"],
  });
}

function serverEnv(): Record<string, string> {
  const pairs = (process.env.BENCH_FLEET_SERVER_ENV ?? "").split(" ").filter((kv) => kv.includes("="));
  return Object.fromEntries(pairs.map((kv) => [kv.slice(0, kv.indexOf("=")), kv.slice(kv.indexOf("=") + 1)]));
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
  /** The server's time runnable but not running (waiting for a CPU), ms. */
  runQueueMs: number;
  /** Bytes held unstored: queued for the store (within limits.queuedBytes) and of messages not fully arrived. */
  held: { backlog: number; reading: number; windows: number; widened: number };
}

interface LiveSample {
  rss: number;
  heap: number;
  external: number;
  active: number;
  gc: boolean;
  /** Committed bytes by V8 space, and `arrayBuffers`. */
  spaces: Record<string, number>;
}

/** Cumulative time (µs) some task waited for a CPU (Linux PSI), or NaN. */
function cpuPressureUs(): number {
  try {
    const some = readFileSync("/proc/pressure/cpu", "utf8").split("\n")[0]!;
    return Number(/total=(\d+)/.exec(some)?.[1]);
  } catch {
    return NaN;
  }
}

/** What PostgreSQL's backends were doing, sampled from pg_stat_activity during the window. */
interface PgActivity {
  samples: number;
  /** Mean backends per state / wait event ("active", "active: IO/WALSync", "idle in transaction"…). */
  mean: Record<string, number>;
  commitsPerSecond: number;
}

/** Samples pg_stat_activity of the bench database every 250 ms until stopped. O(backends) per sample. */
function samplePostgres(): { stop(): Promise<PgActivity> } {
  const client = new pg.Client({ connectionString: POSTGRES_URL });
  const counts = new Map<string, number>();
  let samples = 0;
  let stopped = false;
  let commits0 = NaN;
  let t0 = 0;
  const commits = async () =>
    Number(
      (await client.query("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")).rows[0]
        ?.xact_commit,
    );
  const loop = (async () => {
    await client.connect();
    commits0 = await commits();
    t0 = performance.now();
    while (!stopped) {
      const { rows } = await client.query<{ state: string | null; wait: string | null }>(
        `SELECT state, wait_event_type || '/' || wait_event AS wait FROM pg_stat_activity
          WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'`,
      );
      samples++;
      for (const r of rows) {
        const key =
          r.state === "active" && r.wait && !r.wait.startsWith("Client/") ? `active: ${r.wait}` : (r.state ?? "?");
        counts.set(key, (counts.get(key) ?? 0) + 1);
      }
      await new Promise((r) => setTimeout(r, 250));
    }
    const rate = ((await commits()) - commits0) / ((performance.now() - t0) / 1000);
    await client.end();
    return rate;
  })();
  return {
    async stop() {
      stopped = true;
      const rate = await loop.catch(() => NaN);
      const mean: Record<string, number> = {};
      for (const [k, n] of counts) mean[k] = n / Math.max(1, samples);
      return { samples, mean, commitsPerSecond: rate };
    },
  };
}

const mib1 = (bytes: number) => (bytes / 2 ** 20).toFixed(1);
const fmt = (n: number) => Math.round(n).toLocaleString("en-US");
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? NaN;

interface AgentReport {
  sent: { id: string; lines: number }[];
  failed: number;
  calls: number;
  retries: Record<string, number>;
  lag: number;
  cpuMs: number;
  runQueueMs: number;
  /** Round trips (ms) of the process's probe pings to the server. */
  pings: number[];
}

/** What one fleet run measured. */
interface FleetRun {
  mix: Mix;
  jobs: number;
  /** Mean and most calls open over the window's samples; RSS per stream at the sample with the most. */
  open: { mean: number; most: Sample };
  /** Every sample of the window (RSS, calls open), for the medians of the marginal figure. */
  window: { rss: number[]; active: number[]; backlog: number[]; windows: number[] };
  /** The window: server CPU and run-queue wait (ms), machine CPU pressure (share), load averages. */
  machine: { serverCpuMs: number; serverWaitMs: number; pressure: number; load: [number, number] };
  pg: PgActivity | null;
  /** Memory after a full GC, with the calls then open, and before the agents. */
  live: LiveSample;
  baseLive: LiveSample;
  durationMs: number;
  peak: Sample;
  base: Sample;
  seconds: number;
  lines: number;
  cpuPerMillion: number;
  latency: Latency & {
    followErrors: number;
    stored: { p50: number; p99: number };
    steady: Latency & { stored: { p50: number; p99: number } };
  };
  followProbe: number[];
  reports: AgentReport[];
  totalSent: number;
  check: { jobs: number; whole: number; problems: string[] };
  results: number;
}

/** Delays of the followed lines (ms): lines counted, p50, p99, max. */
interface Latency {
  lines: number;
  p50: number;
  p99: number;
  max: number;
}

/** One fleet run: `jobCount` agents for `durationMs` into a fresh server process. */
async function fleet(mix: Mix, jobCount: number, durationMs: number): Promise<FleetRun> {
  const server = child("runner-fleet-server.ts");
  const [{ port }] = (await once(server, "message")) as [{ port: number }];
  try {
    const jobs = Array.from({ length: jobCount }, (_, i) => ({
      id: randomUUID(),
      rate: rateOf(mix, i),
      startMs: Math.round((i / jobCount) * RAMP_MS),
    }));
    await ask(server, { follow: jobs.filter((_, i) => i % FOLLOW_EVERY === 0).map((j) => j.id) });
    const base = await ask<Sample>(server, "sample");
    // Then memory by kind after a full GC with no agent yet: the marginal breakdown's "before"
    // (after today's, which has always been taken without a GC).
    const baseLive = await ask<LiveSample>(server, "sampleGc");
    const diagBase = process.env.BENCH_FLEET_DIAG ? await ask<Record<string, number>>(server, "diag") : null;
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
    const pgActivity = process.env.BENCH_FLEET_STORE === "memory" ? null : samplePostgres();
    const s0 = await ask<Sample>(server, "sample");
    await ask(server, "steadyFrom");
    const t0 = performance.now();
    const psi0 = cpuPressureUs();
    const load0 = loadavg()[0]!;
    let peak = s0;
    let most = s0;
    let activeSum = 0;
    const windowRss: number[] = [];
    const windowActive: number[] = [];
    const windowBacklog: number[] = [];
    const windowHeld: number[] = [];
    const window = durationMs - RAMP_MS - 4_000;
    const samples = Math.max(1, Math.floor(window / 1000));
    for (let i = 0; i < samples; i++) {
      // Each sample at its own deadline from t0: sleeping a fixed step after each answer let
      // the window grow by every sample's round trip, towards the jobs' ends 2 s later.
      await new Promise((r) => setTimeout(r, Math.max(0, t0 + ((i + 1) * window) / samples - performance.now())));
      const s = await ask<Sample>(server, "sample");
      if (s.rss > peak.rss) peak = s;
      if (s.active > most.active) most = s;
      activeSum += s.active;
      windowRss.push(s.rss);
      windowActive.push(s.active);
      windowBacklog.push(s.held.backlog);
      windowHeld.push(s.held.windows);
    }
    await ask(server, "steadyTo");
    const s1 = await ask<Sample>(server, "sample");
    const seconds = (performance.now() - t0) / 1000;
    // Read before the forced GC below (and the diagnosis and snapshot): they are divided by
    // the window's seconds, and PostgreSQL's backends idle while the server is paused.
    const pressure = (cpuPressureUs() - psi0) / 1e6 / seconds;
    const load1 = loadavg()[0]!;
    const pgSeen = (await pgActivity?.stop()) ?? null;
    // Right after the window, every call still open (the first job ends 2 s later): live memory
    // after a full GC. A pause of the server the bench makes, so outside the steady window's
    // latency (inside it, it was the p99 of some runs: 300 ms of lines held by the measuring).
    const live = await ask<LiveSample>(server, "sampleGc");
    if (diagBase)
      printDiagnosis(mix, diagBase, { ...(await ask<Record<string, number>>(server, "diag")), jobs: jobCount });
    if (process.env.BENCH_FLEET_SNAPSHOT)
      console.error(
        "snapshot",
        await ask(server, { snapshot: `${process.env.BENCH_FLEET_SNAPSHOT}-${mix.name}.heapsnapshot` }),
      );
    // One follow() at a time on live jobs (not the followed ones), while every job streams.
    const followProbe = await ask<number[]>(server, {
      probeFollow: jobs
        .filter((_, i) => i % FOLLOW_EVERY === 1)
        .slice(0, 20)
        .map((j) => j.id),
    });
    const reports = (await Promise.all(finished)).map(([r]) => r);
    const sent = reports.flatMap((r) => r.sent);
    const latency = await ask<FleetRun["latency"]>(server, { delays: true });
    const end = await ask<Sample>(server, "sample");
    const check = await ask<FleetRun["check"]>(server, { verify: sent });
    for (const a of agents) a.kill();
    const lines = s1.stored - s0.stored;
    return {
      mix,
      open: { mean: activeSum / samples, most },
      window: { rss: windowRss, active: windowActive, backlog: windowBacklog, windows: windowHeld },
      machine: {
        serverCpuMs: s1.cpuMs - s0.cpuMs,
        serverWaitMs: s1.runQueueMs - s0.runQueueMs,
        pressure,
        load: [load0, load1],
      },
      pg: pgSeen,
      live,
      baseLive,
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

/** BENCH_FLEET_DIAG: each memory kind's growth from before the agents to the end of the window, per open call (stderr). */
function printDiagnosis(mix: Mix, before: Record<string, number>, now: Record<string, number>): void {
  const calls = Math.max(1, now.active ?? 1);
  const rows = Object.keys(now)
    .filter((k) => k !== "active" && k !== "jobs")
    .map(
      (k) =>
        `  ${k.padEnd(34)} ${((now[k]! - (before[k] ?? 0)) / calls / 1024).toFixed(1).padStart(8)} KiB/call  (${(now[k]! / 2 ** 20).toFixed(1)} MiB)`,
    );
  console.error(`diag ${mix.name} (${now.jobs} jobs): ${calls} calls open, after a full GC\n${rows.join("\n")}`);
}

function pingRow(reports: AgentReport[]): string {
  const all = reports.flatMap((x) => x.pings).sort((a, b) => a - b);
  const at = (q: number) => all[Math.min(all.length - 1, Math.floor(q * all.length))] ?? NaN;
  return `${at(0.5).toFixed(0)} / ${at(0.99).toFixed(0)} / ${(all[all.length - 1] ?? NaN).toFixed(0)} ms (${fmt(all.length)} answered)`;
}

/** Today's figure: (RSS − before) ÷ open calls at the window's sample with the most calls open, bytes. */
function perStreamAtMost(r: FleetRun): number {
  return (r.open.most.rss - r.base.rss) / Math.max(1, r.open.most.active);
}

/** A run's RSS growth over its own "before" and its calls open, each the median of the window's samples. */
function windowMedians(r: FleetRun): { growth: number; open: number } {
  return { growth: median(r.window.rss) - r.base.rss, open: median(r.window.active) };
}

/**
 * What one more open stream adds to the server's RSS, bytes: (growth₁₀₀₀ − growth₅₀₀) ÷
 * (open₁₀₀₀ − open₅₀₀) between the full run and the half one. Whatever the process holds
 * regardless of the number of streams (V8's young generation grown to its maximum under any
 * steady load, the store backlog's server-wide budget, code, the pool) is in both runs and
 * cancels out. Medians of the window rather than one sample each: a difference of two
 * single samples carries both runs' timing noise (when the last scavenge ran, which second
 * had the most calls open), the median of ~20 samples little of it.
 */
function marginalPerStream(half: FleetRun, full: FleetRun): number {
  const a = windowMedians(half);
  const b = windowMedians(full);
  return addedCalls(a.open, b.open, half.jobs) ? (b.growth - a.growth) / (b.open - a.open) : Number.NaN;
}

/**
 * True when the full run had enough more calls open than the half one for a difference per
 * call to mean something: at least a quarter of the half run's jobs more (a server so far
 * behind that its calls keep ending and reopening has few more open, and a few MiB of noise
 * divided by a handful of calls is no figure).
 */
function addedCalls(halfOpen: number, fullOpen: number, halfJobs: number): boolean {
  return fullOpen - halfOpen >= halfJobs / 4;
}

/** Memory after a full GC by kind, in the rows of the marginal breakdown: [label, bytes of a live sample]. */
const LIVE_KINDS: [string, (l: LiveSample) => number][] = [
  ["RSS", (l) => l.rss],
  ["V8 new space (young generation), committed", (l) => l.spaces.new_space ?? 0],
  ["V8 old space, committed", (l) => l.spaces.old_space ?? 0],
  [
    "V8 large objects (old and new), committed",
    (l) => (l.spaces.large_object_space ?? 0) + (l.spaces.new_large_object_space ?? 0),
  ],
  [
    "V8 code and other spaces, committed",
    (l) =>
      v8Committed(l) -
      (l.spaces.new_space ?? 0) -
      (l.spaces.old_space ?? 0) -
      (l.spaces.large_object_space ?? 0) -
      (l.spaces.new_large_object_space ?? 0),
  ],
  ["array buffers (Node's count)", (l) => l.spaces.arrayBuffers ?? 0],
  [
    "rest of RSS (native: nghttp2, sockets, malloc's heap; RSS − V8 − array buffers)",
    (l) => l.rss - v8Committed(l) - (l.spaces.arrayBuffers ?? 0),
  ],
];

function v8Committed(l: LiveSample): number {
  return Object.entries(l.spaces).reduce((n, [k, v]) => (k === "arrayBuffers" ? n : n + v), 0);
}

/** The marginal section: per mix, the half and the full run's memory, and per added stream. */
function marginalRows(pairs: { half: FleetRun; full: FleetRun }[]): string[] {
  const mib = (b: number) => (b / 2 ** 20).toFixed(1);
  const kib = (b: number) => (b / 1024).toFixed(1);
  const rows = pairs.map(({ half, full }) => {
    const a = windowMedians(half);
    const b = windowMedians(full);
    return (
      `| ${full.mix.name} | ${fmt(half.jobs)}: ${fmt(a.open)} open, ${mib(a.growth)} MiB | ${fmt(full.jobs)}: ${fmt(b.open)} open, ${mib(b.growth)} MiB | ` +
      `**${Number.isNaN(marginalPerStream(half, full)) ? "n/a (too few more calls open)" : `${kib(marginalPerStream(half, full))} KiB`}** | ${kib(perStreamAtMost(half))} / ${kib(perStreamAtMost(full))} KiB | ${mib(median(half.window.backlog))} / ${mib(median(full.window.backlog))} MiB | ${half.latency.steady.p99.toFixed(1)} / ${full.latency.steady.p99.toFixed(1)} ms | ` +
      `${half.machine.load[0].toFixed(1)}, ${half.machine.load[1].toFixed(1)}; ${full.machine.load[0].toFixed(1)}, ${full.machine.load[1].toFixed(1)} |`
    );
  });
  const live = (l: LiveSample) => `${fmt(l.active)} calls`;
  const breakdown = LIVE_KINDS.map(([label, of]) => {
    const cells = pairs.map(({ half, full }) => {
      const calls = full.live.active - half.live.active;
      // Growth over each run's own "before" (a fresh server's RSS varies by several MiB run to run).
      const a = of(half.live) - of(half.baseLive);
      const b = of(full.live) - of(full.baseLive);
      return `${mib(a)} → ${mib(b)} MiB (${addedCalls(half.live.active, full.live.active, half.jobs) ? kib((b - a) / calls) : "n/a"})`;
    });
    return `| ${label} | ${cells.join(" | ")} |`;
  });
  return [
    "",
    "### Per open stream: what grows with the streams, and what the process holds anyway",
    "",
    "Each mix also ran at half the jobs (same per-job rates and tiers, so half the lines), into its own fresh server just before the full run. " +
      "**The marginal figure is the one the aim (≤ 64 KiB per open stream) is judged on**: (RSS growth at the full run − at the half) ÷ (calls open at the full − at the half), " +
      "each RSS growth over its own run's “before” and each the median of the window's one-second samples (a difference of two single samples carries both runs' timing noise: when the last scavenge ran, which second had the most calls open). " +
      "It is a stream's own cost: its connection, call and queued lines. Today's figure, (RSS − before) ÷ open calls at the sample with the most open, also divides by the streams what the process holds whatever their number " +
      "(V8's young generation, which any steady load grows to its maximum, 16 MiB a semi-space on 64-bit Node 22; the store backlog's server-wide budget `limits.queuedBytes`, 32 MiB; code and caches first used under load), so it shrinks as streams are added and says little about 1,000 versus 2,000; it is kept for comparison with earlier runs.",
    "",
    "| mix | half run: jobs, calls open, RSS growth (medians) | full run: same | RSS per open stream, marginal | today's figure (peak sample), half / full | store backlog held (median), half / full | p99, steady window, half / full | load average: half start, end; full start, end |",
    "|---|---:|---:|---:|---:|---:|---:|---:|",
    ...rows,
    "",
    `Growth by kind from before the agents to the end of the window, each after a full GC (the calls open; \`BENCH_FLEET_DIAG=1\` prints more kinds), half → full run, and in brackets the difference per added open call (KiB): what stays put is the process's, what grows the streams'.`,
    "",
    `| memory after a full GC | ${pairs.map((p) => `${p.full.mix.name}: ${live(p.half.live)} → ${live(p.full.live)}`).join(" | ")} |`,
    `|---|${pairs.map(() => "---:").join("|")}|`,
    ...breakdown,
  ];
}

/** The rows of one fleet run's table; `half` the same mix at half the jobs, for the marginal row. */
function runRows(r: FleetRun, half?: FleetRun): string[] {
  const { peak, base, latency, check, reports, open, machine } = r;
  const failed = reports.reduce((n, x) => n + x.failed, 0);
  const retries = new Map<string, number>();
  for (const x of reports) for (const [k, n] of Object.entries(x.retries)) retries.set(k, (retries.get(k) ?? 0) + n);
  const retried = [...retries].map(([k, n]) => `${n} × ${k}`).join("; ") || "none";
  // Per stream with the streams actually open: RSS and open calls of the same sample.
  const perStream = perStreamAtMost(r);
  const lost = check.whole === check.jobs && failed === 0 && r.results === r.jobs && latency.followErrors === 0;
  const pct = (ms: number) => `${((ms / 1000 / r.seconds) * 100).toFixed(0)} %`;
  const pgRow = r.pg
    ? Object.entries(r.pg.mean)
        .sort((a, b) => b[1] - a[1])
        .map(([k, n]) => `${k} ${n.toFixed(1)}`)
        .join(", ") + `; ${fmt(r.pg.commitsPerSecond)} commits/s`
    : "n/a (memory store)";
  return [
    "| measure | value |",
    "|---|---:|",
    `| lines/s offered (nominal; lines sent below) → stored (steady window, ${r.seconds.toFixed(1)} s) | ${fmt(offered(r.mix, r.jobs))} → ${fmt(r.lines / r.seconds)} |`,
    `| open calls over the window: mean / most | ${open.mean.toFixed(0)} / ${fmt(open.most.active)} of ${fmt(r.jobs)} |`,
    `| server RSS per open stream ((RSS − before) ÷ open calls, at the sample with the most open; the process's constant share included) | ${(perStream / 1024).toFixed(1)} KiB |`,
    ...(half
      ? [
          `| server RSS per open stream, marginal (${fmt(half.jobs)} → ${fmt(r.jobs)} jobs, window medians: see below) | ${Number.isNaN(marginalPerStream(half, r)) ? "n/a (too few more calls open)" : `${(marginalPerStream(half, r) / 1024).toFixed(1)} KiB`} (aim ≤ 64 KiB) |`,
        ]
      : []),
    // Every agent holds its connection for the whole run, open call or not.
    `| after a full GC with ${fmt(r.live.active)} calls open: (RSS − before) ÷ calls; live JS heap ÷ calls | ${((r.live.rss - base.rss) / Math.max(1, r.live.active) / 1024).toFixed(1)} KiB; ${((r.live.heap - base.heap) / Math.max(1, r.live.active) / 1024).toFixed(1)} KiB |`,
    `| server RSS per job connected ((peak − before) ÷ ${fmt(r.jobs)}) | ${((peak.rss - base.rss) / r.jobs / 1024).toFixed(1)} KiB |`,
    `| server RSS before agents → peak | ${(base.rss / 2 ** 20).toFixed(0)} → ${(peak.rss / 2 ** 20).toFixed(0)} MiB |`,
    // The budget is server-wide (limits.queuedBytes): what it holds is the process's, not a stream's.
    `| held unstored: store backlog (queued for the store; budget limits.queuedBytes) median / at the RSS peak / most; received into Node's stream buffers, not yet read (flow-control windows) median / at the RSS peak / most; messages not fully arrived at the RSS peak; connections with widened windows at the RSS peak | ${mib1(median(r.window.backlog))} / ${mib1(peak.held.backlog)} / ${mib1(Math.max(...r.window.backlog))} MiB; ${mib1(median(r.window.windows))} / ${mib1(peak.held.windows)} / ${mib1(Math.max(...r.window.windows))} MiB; ${mib1(peak.held.reading)} MiB; ${peak.held.widened} |`,
    `| server CPU per million lines | ${r.cpuPerMillion.toFixed(1)} CPU-s |`,
    `| write → follow() latency p50 / p99 / max, lines written in the steady window (${fmt(latency.steady.lines)} lines on ${fmt(Math.ceil(r.jobs / FOLLOW_EVERY))} followed jobs) | ${latency.steady.p50.toFixed(1)} / ${latency.steady.p99.toFixed(1)} / ${latency.steady.max.toFixed(0)} ms (aim p99 < 100 ms) |`,
    `| write → follow() latency p50 / p99 / max, every line (the ramp, the ends and the bench's full GC included; ${fmt(latency.lines)} lines) | ${latency.p50.toFixed(1)} / ${latency.p99.toFixed(1)} / ${latency.max.toFixed(0)} ms |`,
    `| write → stored (append returned; every job) p50 / p99, steady window; every line | ${latency.steady.stored.p50.toFixed(1)} / ${latency.steady.stored.p99.toFixed(1)} ms; ${latency.stored.p50.toFixed(1)} / ${latency.stored.p99.toFixed(1)} ms |`,
    `| lines sent / jobs read back whole / results | ${fmt(r.totalSent)} / ${fmt(check.whole)} of ${fmt(check.jobs)} / ${fmt(r.results)} |`,
    `| StreamLogs calls started by the agents | ${fmt(r.reports.reduce((n, y) => n + y.calls, 0))} |`,
    `| server over the window: CPU used / runnable but waiting for a CPU | ${pct(machine.serverCpuMs)} / ${pct(machine.serverWaitMs)} of a core |`,
    `| machine over the window: CPU pressure (PSI "some": time a task waited for a CPU); load average start → end | ${(machine.pressure * 100).toFixed(0)} %; ${machine.load[0].toFixed(1)} → ${machine.load[1].toFixed(1)} |`,
    `| PostgreSQL backends over the window (pg_stat_activity, ${r.pg?.samples ?? 0} samples: mean count per state or wait event) | ${pgRow} |`,
    `| agent processes: CPU, waiting for a CPU, worst timer lag | ${reports.map((x) => `${(x.cpuMs / 1000).toFixed(1)} s`).join(", ")}; ${reports.map((x) => `${(x.runQueueMs / 1000).toFixed(1)} s`).join(", ")}; ${Math.max(...reports.map((x) => x.lag)).toFixed(0)} ms |`,
    `| agent calls retried | ${retried} |`,
    `| server's answer to a PING (a probe connection per agent process, every 500 ms): p50 / p99 / max, unanswered at the end | ${pingRow(reports)} |`,
    `| nothing lost | ${lost ? "**held**" : `**did not hold** (${failed} agents failed, follow order errors ${latency.followErrors}; ${check.problems.join("; ")})`} |`,
  ];
}

/** Runs the fleet benchmark and returns its Markdown section. */
export async function run(): Promise<string> {
  const first = MIXES[MIX_NAMES[0] ?? "heavy"]!;
  const few = JOBS > 10 && process.env.BENCH_FLEET_COMPARE !== "0" ? await fleet(first, 10, 15_000) : null;
  const runs: FleetRun[] = [];
  const pairs: { half: FleetRun; full: FleetRun }[] = [];
  const marginal = process.env.BENCH_FLEET_MARGINAL !== "0" && JOBS >= 20;
  for (const name of MIX_NAMES) {
    // The half run just before the full one: the same minute's machine for both.
    const half = marginal ? await fleet(MIXES[name]!, Math.round(JOBS / 2), DURATION_MS) : null;
    const full = await fleet(MIXES[name]!, JOBS, DURATION_MS);
    runs.push(full);
    if (half) pairs.push({ half, full });
  }
  const halfOf = (r: FleetRun) => pairs.find((p) => p.full === r)?.half;
  const store =
    process.env.BENCH_FLEET_STORE === "memory"
      ? "createMemoryLogStore (BENCH_FLEET_STORE=memory)"
      : `createPostgresLogStore on the local PostgreSQL, pool of ${process.env.BENCH_FLEET_POOL ?? 20}`;
  const calls = (x: FleetRun) => x.reports.reduce((n, y) => n + y.calls, 0);
  const costRows = (x: FleetRun) =>
    `| ${fmt(x.jobs)} (${x.mix.name}) | ${fmt(x.lines / x.seconds)} | ${x.cpuPerMillion.toFixed(1)} µs | ${x.latency.stored.p50.toFixed(1)} / ${x.latency.stored.p99.toFixed(1)} ms | ` +
    `${median(x.followProbe).toFixed(1)} ms (${x.followProbe.length}) | ${fmt(calls(x))} over ${fmt(x.jobs)} jobs |`;
  const mixText = (m: Mix) =>
    `${m.name}: 80 % of the jobs at ${m.quiet} lines/s, 15 % at ${m.busy}, 5 % at ${m.burst}, ${fmt(offered(m, JOBS))} lines/s offered`;
  return [
    "## Runner fleet: 1,000 concurrent jobs on PostgreSQL",
    "",
    `Method: ${fmt(JOBS)} jobs${SCALE !== 1 ? ` (scale ${SCALE})` : ""}, each an agent (\`createRunnerClient\` with its defaults, its own HTTP/2 connection) in one of ` +
      `${AGENT_PROCESSES} agent processes, started over ${RAMP_MS / 1000} s and writing for ${DURATION_MS / 1000} s at a mixed rate, ` +
      `lines of 40–200 bytes carrying the agent's clock, then each job's end. The mixes, each its own run into a fresh server: ${runs.map((r) => mixText(r.mix)).join("; ")}. ` +
      `One server process (startRunnerServer, ${store}, memory queue, token check on${process.env.BENCH_FLEET_SERVER_FLAGS ? `, Node flags ${process.env.BENCH_FLEET_SERVER_FLAGS}` : ""}${process.env.BENCH_FLEET_SERVER_ENV ? `, environment ${process.env.BENCH_FLEET_SERVER_ENV}` : ""}). ` +
      `Every ${FOLLOW_EVERY}th job is followed with \`follow()\` in the server process from before its first line; latency is from the agent's write to that follower's delivery, counted in fixed buckets (0.1 ms below 100 ms, 1 ms above; a percentile is its bucket's upper edge) allocated before the agents start, so the measuring adds nothing to the server's RSS. ` +
      'Rates, RSS and CPU are measured over the middle of the run (every job started), sampled each second; today\'s RSS per open stream divides the RSS growth by the calls open in the same sample, the marginal one compares the full run with a half one (see "Per open stream" below). ' +
      "The aim's latency counts the lines written in that window, when all the jobs are open (it includes the calls' cuts, each at a random point of the last quarter of the client's 20 s `maxCallMs`); the row for every line adds the ramp (jobs starting, fewer streams), the ends and the bench's own full GC. " +
      "Memory after a full GC is sampled right after the window, the calls open (a pause of the server the bench makes: in the every-line latency, and in the steady one only for the lines written in the window's last milliseconds still in flight when it starts). " +
      "Where the time went is measured, not assumed: the server's and agents' time runnable but waiting for a CPU (Linux schedstat), the machine's CPU pressure (PSI), and PostgreSQL's backends of the bench's database sampled from pg_stat_activity every 250 ms (other work on the machine uses the same database: its idle connections are in the count). " +
      "Afterwards every job is read back from the store and checked line by line. Agents, server and PostgreSQL share the machine (2 cores) with other work: see the load average row.",
    ...runs.flatMap((r) => [
      "",
      `### ${r.mix.name} mix (${fmt(offered(r.mix, r.jobs))} lines/s offered)`,
      "",
      ...runRows(r, halfOf(r)),
    ]),
    ...(pairs.length > 0 ? marginalRows(pairs) : []),
    ...(few
      ? [
          "",
          `Cost per request with few and with all jobs open (a run of 10 jobs, ${first.name} tiers, ${few.durationMs / 1000} s, just before the main ones): ` +
            "one StreamLogs item = server CPU per stored line over the steady window (it includes the follow() deliveries and the job-row work of the store); " +
            "one follow() = a new follow() of a live job from line 0 until its first line arrives (a store read and the follower's set-up), one at a time, median.",
          "",
          "| open jobs | lines/s | server CPU per item | write → stored p50 / p99 | one follow() (probes) | calls started |",
          "|---:|---:|---:|---:|---:|---:|",
          costRows(few),
          ...pairs.map((p) => costRows(p.half)),
          ...runs.map(costRows),
        ]
      : []),
  ].join("\n");
}
