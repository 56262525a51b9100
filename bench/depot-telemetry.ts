/**
 * Depot telemetry overhead (issue 11): the download figures of two depot servers alive side
 * by side, one with an OpenTelemetry SDK registered as serve registers it
 * (bench/telemetry-sdk.ts) and one without (the API's no-ops), each on its own copy of the
 * same store, measured in paired slices (bench/telemetry-pair.ts). Rows: large archive
 * downloads (MB/s) and small archive downloads at concurrency 8 (requests/s), each with the
 * server's CPU time (user + system) per MiB or per request, which a loaded machine
 * disturbs less than wall-clock rates.
 */
import { randomBytes } from "node:crypto";
import { cp, mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { ROOT_CONTEXT } from "@opentelemetry/api";
import { MeterProvider, MetricReader } from "@opentelemetry/sdk-metrics";
import { BatchSpanProcessor, TracerProvider } from "@opentelemetry/sdk-trace";
import { DepotTelemetry } from "../src/depot/server/telemetry.js";
import { SCRAPE_SECONDS, type SdkVariant } from "./telemetry-sdk.js";
import {
  append,
  inRounds,
  median,
  pairHeader,
  pairRow,
  pairedSlices,
  startBenchServer,
  stop,
  type Mode,
  type Slice,
} from "./telemetry-pair.js";

const MiB = 2 ** 20;
/** DEPOT_TELEMETRY_MIB, DEPOT_TELEMETRY_SMALL, DEPOT_TELEMETRY_SLICES, DEPOT_TELEMETRY_LARGE_SLICES and DEPOT_TELEMETRY_ROUNDS shrink a trial run; the report states what ran. */
const LARGE_BYTES = (Number(process.env.DEPOT_TELEMETRY_MIB) || 64) * MiB;
/** Small downloads per slice (about a second). */
const SMALL_REQUESTS = Number(process.env.DEPOT_TELEMETRY_SMALL) || 1000;
/** Rounds, each with a fresh pair of server processes (a process's JIT and heap make it faster or slower for its whole life). */
const ROUNDS = Number(process.env.DEPOT_TELEMETRY_ROUNDS) || 6;
/** Small-download slices per round, each a pair. */
const SLICES = Number(process.env.DEPOT_TELEMETRY_SLICES) || 6;
/** Large-download slices per round (one download from each server). */
const LARGE_SLICES = Number(process.env.DEPOT_TELEMETRY_LARGE_SLICES) || 3;
const CONCURRENCY = 8;

const serverScript = path.join(path.dirname(fileURLToPath(import.meta.url)), "depot-telemetry-server.ts");
const fmt = (n: number, digits = 0) => n.toFixed(digits);

/** Publishes `name@1.0.0` with one file of `bytes` random bytes. */
async function publish(url: string, name: string, bytes: number): Promise<void> {
  const opened = await fetch(`${url}/trans/${name}@1.0.0`, { method: "POST" });
  const { transaction } = (await opened.json()) as { transaction: string };
  const added = await fetch(`${url}/add/${transaction}/file`, {
    method: "POST",
    headers: { "Pkg-Path": "payload.bin" },
    body: randomBytes(bytes),
  });
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

/** MB/s of one download of the large archive. */
async function largeDownload(url: string): Promise<number> {
  const start = performance.now();
  const bytes = await drain(await fetch(`${url}/data/large@1.0.0`));
  return bytes / 1e6 / ((performance.now() - start) / 1000);
}

/** Requests/s of SMALL_REQUESTS downloads of the small archive, CONCURRENCY at a time. */
async function smallDownloads(url: string, requests = SMALL_REQUESTS): Promise<number> {
  let next = 0;
  const start = performance.now();
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (next++ < requests) {
        const response = await fetch(`${url}/data/small@1.0.0`);
        if (response.status !== 200) throw new Error(`small download: ${response.status}`);
        await drain(response);
      }
    }),
  );
  return requests / ((performance.now() - start) / 1000);
}

class PullReader extends MetricReader {
  protected async onForceFlush(): Promise<void> {}
  protected async onShutdown(): Promise<void> {}
}

/**
 * µs per request of the telemetry calls one small download makes (a request count and
 * duration, three store timings, bytes out, one span with its attributes), in this process,
 * through the API's no-ops and through the SDK. The loop yields every 256 calls (the time
 * of the yields not counted), so the span processor exports its batches as in a server:
 * in one synchronous loop its queue fills and it drops spans instead.
 */
async function instrumentationCost(): Promise<{ noop: number; sdk: number }> {
  const meterProvider = new MeterProvider({ readers: [new PullReader()] });
  const tracerProvider = new TracerProvider({
    spanProcessors: [
      new BatchSpanProcessor({
        exporter: { export: (_s, done) => done({ code: 0 }), shutdown: async () => undefined },
      }),
    ],
  });
  // Made once, as depot/store/metrics.ts makes them.
  const storeAttributes = ["getRecord", "getRecord", "openBlob"].map((operation) => ({ operation, outcome: "ok" }));
  const once = (t: DepotTelemetry) => {
    const span = t.startSpan("depot.download", ROOT_CONTEXT, {
      "http.route": "/data/:pkg",
      "http.request.method": "GET",
    });
    if (span.isRecording()) span.setAttributes({ "depot.package": "small", "depot.version": "1.0.0" });
    for (const attributes of storeAttributes) t.storeDuration.record(0.0001, attributes);
    span.setAttribute("http.response.status_code", 200);
    t.bytesSent(3072);
    span.setAttribute("depot.bytes_sent", 3072);
    span.end();
    t.request("/data/:pkg", "GET", 200, 0.001);
  };
  const timed = async (t: DepotTelemetry, calls: number) => {
    let ms = 0;
    for (let done = 0; done < calls; done += 256) {
      const start = performance.now();
      for (let i = 0; i < 256; i++) once(t);
      ms += performance.now() - start;
      await new Promise<void>((resolve) => setImmediate(resolve));
    }
    return (ms * 1000) / calls;
  };
  const perCall = async (t: DepotTelemetry) => {
    await timed(t, 20_480);
    const runs: number[] = [];
    for (let r = 0; r < 5; r++) runs.push(await timed(t, 20_480));
    return median(runs);
  };
  return {
    noop: await perCall(new DepotTelemetry()),
    sdk: await perCall(new DepotTelemetry({ meterProvider, tracerProvider })),
  };
}

/** The slices of one comparison: no provider against one SDK variant. */
interface Comparison {
  large: Record<Mode, Slice[]>;
  small: Record<Mode, Slice[]>;
  scrapes: number[];
}

/** ROUNDS rounds of paired slices, the "on" server registering `variant`. */
async function compare(dirs: Record<Mode, string>, variant: SdkVariant): Promise<Comparison> {
  const out: Comparison = { large: { off: [], on: [] }, small: { off: [], on: [] }, scrapes: [] };
  await inRounds(
    ROUNDS,
    (mode) => startBenchServer(serverScript, [dirs[mode]], mode, variant),
    async (both) => {
      for (const server of Object.values(both)) {
        // Warm-up of both paths (JIT, file cache, sockets), light on the small one: garbage
        // that thousands of small downloads leave (the SDK's retained spans, promoted) would
        // be collected during the large slices and charged to them.
        await smallDownloads(server.hello.url as string, 300);
        for (let i = 0; i < 3; i++) await drain(await fetch(`${server.hello.url}/data/large@1.0.0`));
      }
      append(
        out.large,
        await pairedSlices(both, LARGE_SLICES, async (server) => ({
          rate: await largeDownload(server.hello.url as string),
          units: LARGE_BYTES / MiB,
        })),
      );
      for (const server of Object.values(both)) await smallDownloads(server.hello.url as string, 2000);
      append(
        out.small,
        await pairedSlices(both, SLICES, async (server) => ({
          rate: await smallDownloads(server.hello.url as string),
          units: SMALL_REQUESTS,
        })),
      );
      out.scrapes.push(await both.on.scrape());
    },
  );
  return out;
}

const perUnit = (slices: Slice[]) => slices.reduce((a, s) => a + s.cpu, 0) / slices.reduce((a, s) => a + s.units, 0);

export async function run(): Promise<string> {
  const root = await mkdtemp(path.join(os.tmpdir(), "bench-depot-telemetry-"));
  const dirs: Record<Mode, string> = { off: path.join(root, "off"), on: path.join(root, "on") };
  let metricsOnly: Comparison, withTraces: Comparison;
  const started = new Date();
  const loadBefore = os.loadavg();
  try {
    const seed = await startBenchServer(serverScript, [dirs.off], "off");
    try {
      await publish(seed.hello.url as string, "large", LARGE_BYTES);
      await publish(seed.hello.url as string, "small", 1024);
    } finally {
      await stop(seed.child);
    }
    // Each server its own copy: two routers never share one store directory.
    await cp(dirs.off, dirs.on, { recursive: true });
    metricsOnly = await compare(dirs, "metrics");
    withTraces = await compare(dirs, "traces");
  } finally {
    await rm(root, { recursive: true, force: true });
  }
  const loadAfter = os.loadavg();
  const calls = await instrumentationCost();
  const serverPerRequest = perUnit(withTraces.small.off);
  const scrape = median([...metricsOnly.scrapes, ...withTraces.scrapes]);
  const scrapeShare = (c: Comparison) =>
    (scrape / (SCRAPE_SECONDS * median(c.small.on.map((s) => s.rate)) * perUnit(c.small.on))) * 100;
  const mib = LARGE_BYTES / MiB;
  const rows = (c: Comparison) => [
    pairRow(`${mib} MiB archive`, "rate", c.large, "MB/s", 1, 0),
    pairRow(`1 KiB package archive, concurrency ${CONCURRENCY}`, "rate", c.small, "req/s", 1, 0),
    pairRow(`server CPU per MiB of ${mib} MiB archives`, "cpu", c.large, "ms", 1 / 1000, 2),
    pairRow("server CPU per 1 KiB archive request", "cpu", c.small, "µs", 1, 1),
  ];
  const load = (l: number[]) => l.map((x) => x.toFixed(2)).join(", ");
  return [
    "## Depot telemetry overhead",
    "",
    `Method: two depot server processes alive side by side (\`createPackageRouter\` + \`servePackageRouter\`, fs store, each on its own copy of the same store), one without any OpenTelemetry provider (the API's no-ops: the library's default) and one with the SDK registered first by serve's own code (\`startServeTelemetry\`, src/cli/serve-telemetry.ts): the MeterProvider read by the Prometheus exporter, scraped every ${SCRAPE_SECONDS} s (Prometheus's usual interval; its default is 60 s; a scrape once a second before), and the W3C propagators; that is all serve registers by default (first table). With traces on (second table), as serve runs with an OTLP endpoint, also a TracerProvider with serve's BatchSpanProcessor settings (batches of 512, at most 2,048 queued) handing every \`depot.download\` span to an exporter that drops it (the OTLP encoding and the network are not measured). Same \`fetch\` client in the bench process. Paired slices (bench/telemetry-pair.ts): each slice drives both servers at the same moment, so a change in the machine's load falls on both members of a pair (before: whole rounds one server after the other, whose noise was larger than the cost); ${ROUNDS} rounds per table, each with a fresh pair of processes (one process can stay faster or slower than another for its whole life: ±30 % on the large path in trial runs). Large: ${LARGE_SLICES} slices per round of one ${mib} MiB archive download from each server. Small: ${SLICES} slices per round of ${SMALL_REQUESTS} downloads of a 1 KiB package's archive at concurrency ${CONCURRENCY} from each server. Each server is warmed up with 300 small downloads and three large ones; the large slices run first, then 2,000 more small downloads per server, then the small slices (so the garbage thousands of small downloads leave is not collected during, and charged to, the large slices). Rates: the median slice, cost from the median of the per-pair ratios; CPU: each server's user + system time over all slices ÷ the work, cost from the ratio of those totals (it keeps the rare slices a major GC falls in); the last column is the median of the per-pair costs and their middle half (25th–75th percentile), the noise of a single slice. An A/A trial (both servers without a provider) measured 2.2 % on the runner's CPU row: differences of that size are noise. The machine is shared (2 cores, other agents' work running): load average ${load(loadBefore)} (1, 5, 15 min) at the start (${started.toISOString().slice(11, 16)} UTC), ${load(loadAfter)} at the end.`,
    "",
    "Meter provider only (serve's default):",
    "",
    ...pairHeader("download"),
    ...rows(metricsOnly),
    "",
    "Meter and tracer provider (serve with an OTLP endpoint):",
    "",
    ...pairHeader("download"),
    ...rows(withTraces),
    "",
    `The telemetry calls of one small download alone (request count and duration, three store timings (two records read, the blob opened), bytes out, one span with its attributes; in the bench process, 5 × 20,480 calls yielding every 256, median): ${fmt(calls.noop, 2)} µs through the API's no-ops, ${fmt(calls.sdk, 1)} µs through the SDK, i.e. ${fmt((calls.sdk / serverPerRequest) * 100, 1)} % of the server's CPU per small request without a provider (${fmt(serverPerRequest, 0)} µs, second table). A large download adds the same once per body, not per chunk. One scrape (\`GET /metrics\`'s collection and Prometheus text, in the server, median over the rounds): ${fmt(scrape, 0)} µs of CPU; every ${SCRAPE_SECONDS} s at the small-download rate above that is ${fmt(scrapeShare(withTraces), 3)} % of the server's CPU.`,
  ].join("\n");
}
