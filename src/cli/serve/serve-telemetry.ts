/**
 * The OpenTelemetry SDK behind `serve` — the one place that imports it: the library
 * speaks only `@opentelemetry/api`, and this module (loaded by the serve command alone)
 * registers the global providers the runner and the depot then report to. Metrics are
 * pulled as Prometheus text by `GET /metrics`; traces go to OTLP/HTTP when the standard
 * environment asks for it (docs/decisions/operations.md).
 */
import { metrics, propagation, trace } from "@opentelemetry/api";
import { CompositePropagator, W3CBaggagePropagator, W3CTraceContextPropagator } from "@opentelemetry/core";
import { PrometheusExporter, PrometheusSerializer } from "@opentelemetry/exporter-prometheus";
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-http";
import { defaultResource, detectResources, envDetector, resourceFromAttributes } from "@opentelemetry/resources";
import { MeterProvider } from "@opentelemetry/sdk-metrics";
import { BatchSpanProcessor, TracerProvider, type SpanExporter } from "@opentelemetry/sdk-trace";

/** The SDK as serve runs it. */
interface ServeTelemetry {
  /** Every registered metric in the Prometheus text exposition format (0.0.4). */
  metricsText(): Promise<string>;
  /** Where traces go, or null when no OTLP endpoint is configured. */
  readonly tracesTo: string | null;
  /** Flushes pending spans and unregisters the providers. */
  shutdown(): Promise<void>;
}

/** What a host of {@link startServeTelemetry} other than serve may change. */
interface ServeTelemetryOptions {
  /**
   * Batch spans to this exporter instead of OTLP, whatever the environment says (the
   * telemetry benchmarks: serve's own providers, with spans dropped in-process).
   */
  spanExporter?: SpanExporter;
}

/**
 * Registers a meter provider (read by GET /metrics), the W3C trace-context and baggage
 * propagators, and — when `OTEL_EXPORTER_OTLP_ENDPOINT` or
 * `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set, unless `OTEL_SDK_DISABLED=true` or
 * `OTEL_TRACES_EXPORTER=none` — a tracer provider batching spans to that OTLP/HTTP
 * endpoint (the exporter reads its own standard variables: headers, timeout,
 * compression). `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` name the resource
 * (service.name defaults to runner-depot).
 *
 * @example
 * const telemetry = startServeTelemetry();
 * const text = await telemetry.metricsText(); // "# HELP depot_requests_total …"
 */
export function startServeTelemetry(
  env: NodeJS.ProcessEnv = process.env,
  options: ServeTelemetryOptions = {},
): ServeTelemetry {
  const resource = defaultResource()
    .merge(resourceFromAttributes({ "service.name": "runner-depot" }))
    .merge(detectResources({ detectors: [envDetector] }));
  const reader = new PrometheusExporter({ preventServerStart: true });
  const meterProvider = new MeterProvider({ resource, readers: [reader] });
  metrics.setGlobalMeterProvider(meterProvider);
  propagation.setGlobalPropagator(
    new CompositePropagator({ propagators: [new W3CTraceContextPropagator(), new W3CBaggagePropagator()] }),
  );

  const endpoint = env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT || env.OTEL_EXPORTER_OTLP_ENDPOINT;
  const tracing =
    options.spanExporter !== undefined ||
    (Boolean(endpoint) && env.OTEL_SDK_DISABLED !== "true" && env.OTEL_TRACES_EXPORTER !== "none");
  let tracerProvider: TracerProvider | undefined;
  if (tracing) {
    // The processor's defaults (2,048 spans queued at most, a batch of 512 or every 5 s):
    // sdk-trace 3 no longer reads the OTEL_BSP_* variables.
    const exporter = options.spanExporter ?? new OTLPTraceExporter();
    tracerProvider = new TracerProvider({ resource, spanProcessors: [new BatchSpanProcessor({ exporter })] });
    trace.setGlobalTracerProvider(tracerProvider);
  }
  const serializer = new PrometheusSerializer();
  return {
    tracesTo: tracing ? (options.spanExporter ? "(exporter given)" : (endpoint ?? null)) : null,
    async metricsText() {
      const { resourceMetrics } = await reader.collect();
      return serializer.serialize(resourceMetrics);
    },
    async shutdown() {
      await Promise.allSettled([tracerProvider?.shutdown(), meterProvider.shutdown()]);
      trace.disable();
      metrics.disable();
      propagation.disable();
    },
  };
}
