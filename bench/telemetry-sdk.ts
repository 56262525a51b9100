/**
 * The OpenTelemetry SDK as the telemetry-overhead bench servers register it, like serve
 * does: a MeterProvider with a pull reader collected once a second (a scrape) and a
 * TracerProvider batching every span to an exporter that drops it.
 */
import { metrics, trace } from "@opentelemetry/api";
import { MeterProvider, MetricReader } from "@opentelemetry/sdk-metrics";
import { BatchSpanProcessor, TracerProvider, type ReadableSpan, type SpanExporter } from "@opentelemetry/sdk-trace";

class PullReader extends MetricReader {
  protected async onForceFlush(): Promise<void> {}
  protected async onShutdown(): Promise<void> {}
}

const dropSpans: SpanExporter = {
  export: (_spans: ReadableSpan[], done) => done({ code: 0 }),
  shutdown: async () => undefined,
};

/** Registers the SDK globally (before the service is made: the metrics API has no proxy meter); returns the scrape timer. */
export function registerTelemetrySdk(): NodeJS.Timeout {
  const reader = new PullReader();
  metrics.setGlobalMeterProvider(new MeterProvider({ readers: [reader] }));
  trace.setGlobalTracerProvider(new TracerProvider({ spanProcessors: [new BatchSpanProcessor({ exporter: dropSpans })] }));
  return setInterval(() => void reader.collect(), 1000);
}
