/**
 * Depot telemetry overhead (issue 11): the download figures of one depot server with an
 * OpenTelemetry SDK registered (meter provider scraped once a second, every span batched
 * to an exporter that drops it; bench/depot-telemetry-server.ts) and without one (the
 * API's no-ops), on the same store and the same client, rounds alternating which goes
 * first. Rows: large archive downloads (MB/s) and small archive downloads at concurrency 8
 * (requests/s), each with the server's CPU time (user + system) per MiB or per request,
 * which a loaded machine disturbs less than wall-clock rates; the peer of each "with SDK"
 * figure is the "no provider" one of the same run.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { ROOT_CONTEXT } from "@opentelemetry/api";
import { MeterProvider, MetricReader } from "@opentelemetry/sdk-metrics";
import { BatchSpanProcessor, TracerProvider } from "@opentelemetry/sdk-trace";
import { DepotTelemetry } from "../src/depot/observe.js";
import { stop } from "./children.js";

const MiB = 2 ** 20;
/** DEPOT_TELEMETRY_MIB, DEPOT_TELEMETRY_SMALL and DEPOT_TELEMETRY_ROUNDS shrink a trial run; the report states what ran. */
const LARGE_BYTES = (Number(process.env.DEPOT_TELEMETRY_MIB) || 64) * MiB;
const SMALL_REQUESTS = Number(process.env.DEPOT_TELEMETRY_SMALL) || 4000;
const ROUNDS = Number(process.env.DEPOT_TELEMETRY_ROUNDS) || 5;
const LARGE_RUNS = 5;
const CONCURRENCY = 8;

const serverScript = path.join(path.dirname(fileURLToPath(import.meta.url)), "depot-telemetry-server.ts");
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const fmt = (n: number, digits = 0) => n.toFixed(digits);

interface Server {
  url: string;
  child: ChildProcess;
  /** The server's CPU time so far (user + system), µs. */
  cpu(): Promise<number>;
}

async function startServer(dir: string, telemetry: boolean): Promise<Server> {
  const child = spawn(process.execPath, ["--import", "tsx", serverScript, dir, ...(telemetry ? ["--telemetry"] : [])], { stdio: ["pipe", "pipe", "inherit"] });
  const lines = createInterface({ input: child.stdout! })[Symbol.asyncIterator]();
  const next = async () => {
    const line = await lines.next();
    if (line.done) throw new Error("depot server exited");
    return line.value;
  };
  const url = (JSON.parse(await next()) as { url: string }).url;
  return {
    url,
    child,
    async cpu() {
      child.stdin!.write("cpu\n");
      const usage = JSON.parse(await next()) as { user: number; system: number };
      return usage.user + usage.system;
    },
  };
}

/** Publishes `name@1.0.0` with one file of `bytes` random bytes. */
async function publish(url: string, name: string, bytes: number): Promise<void> {
  const opened = await fetch(`${url}/trans/${name}@1.0.0`, { method: "POST" });
  const { transaction } = (await opened.json()) as { transaction: string };
  const added = await fetch(`${url}/add/${transaction}/file`, { method: "POST", headers: { "Pkg-Path": "payload.bin" }, body: randomBytes(bytes) });
  if (added.status !== 201) throw new Error(`add: ${added.status}`);
  const committed = await fetch(`${url}/commit/${transaction}`, { method: "POST" });
  if (committed.status !== 201) throw new Error(`commit: ${committed.status}`);
}

async function drain(response: Response): Promise<number> {
  const reader = response.body!.getReader();
  let bytes = 0;
  for (let next = await reader.read(); !next.done; next = await reader.read()) bytes += next.value.byteLength;
  return bytes;
}

/** MB/s of LARGE_RUNS sequential downloads of the large archive (median run). */
async function largeDownloads(url: string): Promise<number> {
  const rates: number[] = [];
  for (let i = 0; i < LARGE_RUNS; i++) {
    const start = performance.now();
    const bytes = await drain(await fetch(`${url}/data/large@1.0.0`));
    rates.push(bytes / 1e6 / ((performance.now() - start) / 1000));
  }
  return median(rates);
}

/** Requests/s of SMALL_REQUESTS downloads of the small archive, CONCURRENCY at a time. */
async function smallDownloads(url: string): Promise<number> {
  let next = 0;
  const start = performance.now();
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (next++ < SMALL_REQUESTS) {
        const response = await fetch(`${url}/data/small@1.0.0`);
        if (response.status !== 200) throw new Error(`small download: ${response.status}`);
        await drain(response);
      }
    }),
  );
  return SMALL_REQUESTS / ((performance.now() - start) / 1000);
}

class PullReader extends MetricReader {
  protected async onForceFlush(): Promise<void> {}
  protected async onShutdown(): Promise<void> {}
}

/**
 * µs per request of the telemetry calls one small download makes (a request count and
 * duration, four store timings, bytes out, one span with its attributes), in this process,
 * through the API's no-ops and through the SDK.
 */
function instrumentationCost(): { noop: number; sdk: number } {
  const meterProvider = new MeterProvider({ readers: [new PullReader()] });
  const tracerProvider = new TracerProvider({ spanProcessors: [new BatchSpanProcessor({ exporter: { export: (_s, done) => done({ code: 0 }), shutdown: async () => undefined } })] });
  const once = (t: DepotTelemetry) => {
    const span = t.startSpan("depot.download", ROOT_CONTEXT, { "http.route": "/data/:pkg", "http.request.method": "GET" });
    span.setAttributes({ "depot.package": "small", "depot.version": "1.0.0" });
    for (const operation of ["getRecord", "getRecord", "getBlob", "getBlob"]) t.storeDuration.record(0.0001, { operation, outcome: "ok" });
    span.setAttribute("http.response.status_code", 200);
    t.bytesSent(3072);
    span.setAttribute("depot.bytes_sent", 3072);
    span.end();
    t.request("/data/:pkg", "GET", 200, 0.001);
  };
  const perCall = (t: DepotTelemetry) => {
    for (let i = 0; i < 20_000; i++) once(t);
    const runs: number[] = [];
    for (let r = 0; r < 5; r++) {
      const start = performance.now();
      for (let i = 0; i < 20_000; i++) once(t);
      runs.push(((performance.now() - start) * 1000) / 20_000);
    }
    return median(runs);
  };
  return { noop: perCall(new DepotTelemetry()), sdk: perCall(new DepotTelemetry({ meterProvider, tracerProvider })) };
}

export async function run(): Promise<string> {
  const dir = await mkdtemp(path.join(os.tmpdir(), "bench-depot-telemetry-"));
  const fresh = () => ({ large: [] as number[], small: [] as number[], largeCpu: [] as number[], smallCpu: [] as number[] });
  const results = { off: fresh(), on: fresh() };
  try {
    const seed = await startServer(dir, false);
    try {
      await publish(seed.url, "large", LARGE_BYTES);
      await publish(seed.url, "small", 1024);
    } finally {
      await stop(seed.child);
    }
    for (let round = 0; round < ROUNDS; round++) {
      const order: Array<"off" | "on"> = round % 2 === 0 ? ["off", "on"] : ["on", "off"];
      for (const mode of order) {
        const server = await startServer(dir, mode === "on");
        try {
          // Warm-up of both paths in every server (JIT, file cache, sockets): before this,
          // only the small path was warmed and the first large runs of a round paid for it.
          await smallDownloads(server.url).catch(() => 0);
          await drain(await fetch(`${server.url}/data/large@1.0.0`));
          let cpu = await server.cpu();
          results[mode].large.push(await largeDownloads(server.url));
          results[mode].largeCpu.push((await server.cpu()) - cpu);
          cpu = await server.cpu();
          results[mode].small.push(await smallDownloads(server.url));
          results[mode].smallCpu.push((await server.cpu()) - cpu);
        } finally {
          await stop(server.child);
        }
      }
    }
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
  /** A rate row (higher is better): cost = how much lower the SDK's rate is. */
  const row = (what: string, unit: string, off: number[], on: number[], digits: number) => {
    const [a, b] = [median(off), median(on)];
    return `| ${what} | ${fmt(a, digits)} ${unit} | ${fmt(b, digits)} ${unit} | ${fmt(b / a, 3)} | ${fmt(((a - b) / a) * 100, 1)} % |`;
  };
  /** A CPU row (lower is better): cost = how much more CPU the SDK's server spent. */
  const cpuRow = (what: string, unit: string, per: number, off: number[], on: number[]) => {
    const [a, b] = [median(off) / per, median(on) / per];
    return `| ${what} | ${fmt(a, 1)} ${unit} | ${fmt(b, 1)} ${unit} | ${fmt(b / a, 3)} | ${fmt(((b - a) / a) * 100, 1)} % |`;
  };
  const largeMiB = (LARGE_RUNS * LARGE_BYTES) / MiB;
  const calls = instrumentationCost();
  const serverPerRequest = median(results.off.smallCpu) / SMALL_REQUESTS;
  return [
    "## Depot telemetry overhead",
    "",
    `Method: one depot server process (\`createPackageRouter\` + \`servePackageRouter\`, fs store) without any OpenTelemetry provider (the API's no-ops: the library's default) and with the SDK registered first, as \`serve\` does: \`@opentelemetry/sdk-metrics\` MeterProvider with a pull reader collected once a second, and \`@opentelemetry/sdk-trace\` TracerProvider batching every \`depot.download\` span to an exporter that drops it. Same store, same \`fetch\` client in the bench process; ${ROUNDS} rounds alternating which mode goes first (5 by default; 3 before, too few on a loaded machine), each server warmed up on both paths (one small run, one large download) before it is measured, medians across rounds. Large: ${LARGE_RUNS} sequential downloads of a ${LARGE_BYTES / MiB} MiB archive per round (median). Small: ${SMALL_REQUESTS} downloads of a 1 KiB package's archive at concurrency ${CONCURRENCY} per round. Peer of each "with SDK" figure: the "no provider" figure of the same run. The machine is shared (2 cores, other agents' work running).`,
    "",
    "| download | no provider (peer) | with SDK | ratio (SDK ÷ none) | cost |",
    "|---|---:|---:|---:|---:|",
    row(`${LARGE_BYTES / MiB} MiB archive`, "MB/s", results.off.large, results.on.large, 0),
    row("1 KiB package archive, concurrency 8", "req/s", results.off.small, results.on.small, 0),
    cpuRow(`server CPU per MiB of ${LARGE_BYTES / MiB} MiB archives`, "ms", largeMiB * 1000, results.off.largeCpu, results.on.largeCpu),
    cpuRow("server CPU per 1 KiB archive request", "µs", SMALL_REQUESTS, results.off.smallCpu, results.on.smallCpu),
    "",
    `The telemetry calls of one small download alone (request count and duration, four store timings, bytes out, one span with its attributes; in the bench process, 5 × 20,000 calls, median): ${fmt(calls.noop, 2)} µs through the API's no-ops, ${fmt(calls.sdk, 1)} µs through the SDK, i.e. ${fmt((calls.sdk / serverPerRequest) * 100, 1)} % of the server's CPU per small request without a provider (${fmt(serverPerRequest, 0)} µs, above). A large download adds the same once per body, not per chunk.`,
  ].join("\n");
}
