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
import { BatchSpanProcessor, TracerProvider } from "@opentelemetry/sdk-trace";

/** The SDK as serve runs it. */
export interface ServeTelemetry {
  /** Every registered metric in the Prometheus text exposition format (0.0.4). */
  metricsText(): Promise<string>;
  /** Where traces go, or null when no OTLP endpoint is configured. */
  readonly tracesTo: string | null;
  /** Flushes pending spans and unregisters the providers. */
  shutdown(): Promise<void>;
}

/** Content-Type of {@link ServeTelemetry.metricsText}. */
export const PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8";

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
export function startServeTelemetry(env: NodeJS.ProcessEnv = process.env): ServeTelemetry {
  const resource = defaultResource()
    .merge(resourceFromAttributes({ "service.name": "runner-depot" }))
    .merge(detectResources({ detectors: [envDetector] }));
  const reader = new PrometheusExporter({ preventServerStart: true });
  const meterProvider = new MeterProvider({ resource, readers: [reader] });
  metrics.setGlobalMeterProvider(meterProvider);
  propagation.setGlobalPropagator(new CompositePropagator({ propagators: [new W3CTraceContextPropagator(), new W3CBaggagePropagator()] }));

  const endpoint = env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT || env.OTEL_EXPORTER_OTLP_ENDPOINT;
  const tracing = Boolean(endpoint) && env.OTEL_SDK_DISABLED !== "true" && env.OTEL_TRACES_EXPORTER !== "none";
  let tracerProvider: TracerProvider | undefined;
  if (tracing) {
    tracerProvider = new TracerProvider({ resource, spanProcessors: [new BatchSpanProcessor({ exporter: new OTLPTraceExporter() })] });
    trace.setGlobalTracerProvider(tracerProvider);
  }
  const serializer = new PrometheusSerializer();
  return {
    tracesTo: tracing ? (endpoint ?? null) : null,
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
