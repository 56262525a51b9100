/**
 * The OpenTelemetry SDK as the telemetry-overhead bench servers register it: serve's own
 * setup (src/cli/serve-telemetry.ts: the MeterProvider read by a Prometheus exporter, the
 * W3C propagators, and, when traces are on, a TracerProvider with serve's
 * BatchSpanProcessor settings), except that spans go to an exporter that drops them
 * instead of OTLP, and the Prometheus text is rendered on a timer standing in for a scrape.
 */
import { createInterface } from "node:readline";
import type { ReadableSpan, SpanExporter } from "@opentelemetry/sdk-trace";
import { startServeTelemetry } from "../src/cli/serve/serve-telemetry.js";

/**
 * Seconds between scrapes: Prometheus's usual 15 s (its default scrape_interval is 60 s).
 * TELEMETRY_SCRAPE_SECONDS changes it; the bench reports the value it ran with.
 */
export const SCRAPE_SECONDS = Number(process.env.TELEMETRY_SCRAPE_SECONDS) || 15;

const dropSpans: SpanExporter = {
  export: (_spans: ReadableSpan[], done) => done({ code: 0 }),
  shutdown: async () => undefined,
};

/** The registered SDK of a bench server. */
export interface BenchTelemetry {
  /** One scrape now: the Prometheus text's length (the timer scrapes on its own as well). */
  scrape(): Promise<number>;
  stop(): Promise<void>;
}

/** Which SDK a bench server registers: serve's default (no OTLP endpoint: a meter provider only), or serve with traces on. */
export type SdkVariant = "metrics" | "traces";

/** The variant a bench server's arguments ask for (`--telemetry=metrics` or `--telemetry=traces`), or null for none. */
export function sdkVariantOf(argv: string[]): SdkVariant | null {
  const flag = argv.find((arg) => arg.startsWith("--telemetry="));
  return flag === undefined ? null : flag.endsWith("=traces") ? "traces" : "metrics";
}

/** Registers the SDK globally (before the service is made: the metrics API has no proxy meter). */
export function registerTelemetrySdk(variant: SdkVariant): BenchTelemetry {
  const telemetry = startServeTelemetry({}, variant === "traces" ? { spanExporter: dropSpans } : {});
  const timer = setInterval(() => void telemetry.metricsText(), SCRAPE_SECONDS * 1000);
  return {
    scrape: async () => (await telemetry.metricsText()).length,
    async stop() {
      clearInterval(timer);
      await telemetry.shutdown();
    },
  };
}

/**
 * Answers the bench's commands on stdin, one JSON line each on stdout: `cpu` (the
 * process's CPU time so far, µs: user + system) and `scrape` (the CPU time of one scrape,
 * µs; 0 without an SDK). Calls `close` when stdin ends.
 */
export function answerBench(telemetry: BenchTelemetry | undefined, close: () => void): void {
  const cpuNow = () => {
    const { user, system } = process.cpuUsage();
    return user + system;
  };
  let queue = Promise.resolve();
  const commands = createInterface({ input: process.stdin });
  commands.on("line", (line) => {
    // In order: a scrape's answer is awaited, and a later `cpu` must not overtake it.
    queue = queue.then(async () => {
      const command = line.trim();
      if (command === "cpu") process.stdout.write(`${JSON.stringify({ cpu: cpuNow() })}\n`);
      if (command === "scrape") {
        const before = cpuNow();
        await telemetry?.scrape();
        process.stdout.write(`${JSON.stringify({ cpu: telemetry ? cpuNow() - before : 0 })}\n`);
      }
    });
  });
  commands.on("close", () => void queue.then(close));
}
