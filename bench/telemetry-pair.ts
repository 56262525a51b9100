/**
 * What the two telemetry-overhead benches share: a pair of bench servers (one without an
 * OpenTelemetry provider, one with the SDK: bench/telemetry-sdk.ts) alive side by side,
 * and the paired-slice method. Work is cut into slices, each run on both servers at the
 * same moment, so a change in the machine's load (shared, 2 cores) falls on both members
 * of a pair instead of on whichever server ran in a bad minute.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { createInterface } from "node:readline";
import { stop } from "./children.js";
import type { SdkVariant } from "./telemetry-sdk.js";

export type Mode = "off" | "on";

export interface BenchServer {
  /** The first line the server printed (its address). */
  hello: Record<string, unknown>;
  child: ChildProcess;
  /** The server's CPU time so far (user + system), µs. */
  cpu(): Promise<number>;
  /** The CPU time of one scrape in the server, µs (0 without an SDK). */
  scrape(): Promise<number>;
}

/** Starts `script` with `args` (and, for "on", the SDK `variant`: telemetry-sdk.ts) in its own process. */
export async function startBenchServer(
  script: string,
  args: string[],
  mode: Mode,
  variant: SdkVariant = "traces",
): Promise<BenchServer> {
  const child = spawn(
    process.execPath,
    ["--import", "tsx", script, ...args, ...(mode === "on" ? [`--telemetry=${variant}`] : [])],
    { stdio: ["pipe", "pipe", "inherit"] },
  );
  const lines = createInterface({ input: child.stdout! })[Symbol.asyncIterator]();
  const next = async () => {
    const line = await lines.next();
    if (line.done) throw new Error(`${script} exited`);
    return JSON.parse(line.value) as Record<string, unknown>;
  };
  const ask = async (command: string) => {
    child.stdin!.write(`${command}\n`);
    return (await next()).cpu as number;
  };
  return { hello: await next(), child, cpu: () => ask("cpu"), scrape: () => ask("scrape") };
}

export { stop };

/** One slice's figures for one server: `rate` (higher is better) and `cpu` (µs) spent on `units`. */
export interface Slice {
  rate: number;
  cpu: number;
  units: number;
}

/**
 * Runs `slices` slices of `work` on both servers at once (the same load falls on both at
 * the same moment; each server's CPU time is its own). Returns each server's slices,
 * index-aligned (slice i of "off" is the peer of slice i of "on").
 */
export async function pairedSlices(
  servers: Record<Mode, BenchServer>,
  slices: number,
  work: (server: BenchServer) => Promise<{ rate: number; units: number }>,
): Promise<Record<Mode, Slice[]>> {
  const out: Record<Mode, Slice[]> = { off: [], on: [] };
  const modes: Mode[] = ["off", "on"];
  for (let i = 0; i < slices; i++) {
    // Which one starts first alternates: the first has the machine to itself for a moment.
    const order = i % 2 === 0 ? modes : [...modes].reverse();
    const before = await Promise.all(order.map((mode) => servers[mode].cpu()));
    const done = await Promise.all(
      order.map(async (mode) => ({ ...(await work(servers[mode])), after: await servers[mode].cpu() })),
    );
    order.forEach((mode, k) =>
      out[mode].push({ rate: done[k]!.rate, units: done[k]!.units, cpu: done[k]!.after - before[k]! }),
    );
  }
  return out;
}

/** Appends `more`'s slices to `all`'s, pairs kept aligned. */
export function append(all: Record<Mode, Slice[]>, more: Record<Mode, Slice[]>): void {
  all.off.push(...more.off);
  all.on.push(...more.on);
}

/**
 * Runs `round` `rounds` times, each on a fresh pair of servers started by `start` (which
 * starts first alternates) and stopped afterwards.
 */
export async function inRounds(
  rounds: number,
  start: (mode: Mode) => Promise<BenchServer>,
  round: (servers: Record<Mode, BenchServer>) => Promise<void>,
): Promise<void> {
  for (let r = 0; r < rounds; r++) {
    const servers: Partial<Record<Mode, BenchServer>> = {};
    try {
      for (const mode of r % 2 === 0 ? (["off", "on"] as const) : (["on", "off"] as const))
        servers[mode] = await start(mode);
      await round(servers as Record<Mode, BenchServer>);
    } finally {
      await Promise.all(Object.values(servers).map((server) => stop(server.child)));
    }
  }
}

export const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const quantile = (xs: number[], q: number) => [...xs].sort((a, b) => a - b)[Math.round(q * (xs.length - 1))]!;
const fmt = (n: number, digits: number) => n.toFixed(digits);

/**
 * A table row comparing the pair. `kind` "rate" (higher is better: cost = how much lower
 * the SDK's rate is) or "cpu" (CPU per unit, lower is better: cost = how much more the
 * SDK's server spent). Rates: the median slice, and the cost is the median of the
 * per-pair ratios. CPU: the total over all slices ÷ the work (both servers did the same
 * work), and the cost is the ratio of those totals: it keeps the rare slices a major GC
 * falls in, which a median would drop. Beside the cost, the median of the per-pair costs
 * and their middle half (25th–75th percentile): the noise of one slice in this run.
 */
export function pairRow(
  what: string,
  kind: "rate" | "cpu",
  slices: Record<Mode, Slice[]>,
  unit: string,
  scale: number,
  digits: number,
): string {
  const value = (s: Slice) => (kind === "rate" ? s.rate : s.cpu / s.units);
  const costOf = (ratio: number) => (kind === "rate" ? 1 - ratio : ratio - 1) * 100;
  const costs = slices.on.map((s, i) => costOf(value(s) / value(slices.off[i]!)));
  const total = (mode: Mode) =>
    slices[mode].reduce((a, s) => a + s.cpu, 0) / slices[mode].reduce((a, s) => a + s.units, 0);
  const figure = (mode: Mode) => (kind === "rate" ? median(slices[mode].map((s) => s.rate)) : total(mode));
  const [a, b] = [figure("off") * scale, figure("on") * scale];
  const ratio =
    kind === "rate" ? median(slices.on.map((s, i) => s.rate / slices.off[i]!.rate)) : total("on") / total("off");
  const u = unit ? ` ${unit}` : "";
  return `| ${what} | ${fmt(a, digits)}${u} | ${fmt(b, digits)}${u} | ${fmt(ratio, 3)} | **${fmt(costOf(ratio), 1)} %** | ${fmt(median(costs), 1)} % (${fmt(quantile(costs, 0.25), 1)} … ${fmt(quantile(costs, 0.75), 1)} %) |`;
}

/** The header of a {@link pairRow} table. */
export function pairHeader(first: string): string[] {
  return [
    `| ${first} | no provider (peer) | with SDK | ratio (SDK ÷ none) | cost | per-pair cost: median (middle half) |`,
    "|---|---:|---:|---:|---:|---:|",
  ];
}
