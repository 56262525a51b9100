/**
 * What both services report through: a pino-compatible {@link Logger} (silent by
 * default), and OpenTelemetry meters and tracers obtained through `@opentelemetry/api`
 * only. The library takes no SDK dependency: without a registered provider every
 * instrument is the API's no-op, so a counter's `add` costs one empty call.
 *
 * Metric names, units and attributes are in docs/decisions/operations.md.
 */
import {
  metrics,
  propagation,
  trace,
  ROOT_CONTEXT,
  type Context,
  type Meter,
  type MeterProvider,
  type TextMapGetter,
  type Tracer,
  type TracerProvider,
} from "@opentelemetry/api";
import { parseTraceparent } from "./traceparent.js";

/** One log method: an object of fields, then the message (pino's order). */
export type LogFn = (fields: object, message?: string) => void;

/**
 * Any pino-compatible logger: `child` and `debug`/`info`/`warn`/`error` taking an object
 * and a message. A pino logger fits as it is.
 *
 * @example
 * import pino from "pino";
 * const runner = createRunnerService(queue, { logger: pino({ level: "info" }) });
 */
export interface Logger {
  /** A logger whose lines all carry `bindings`. */
  child(bindings: Record<string, unknown>): Logger;
  debug: LogFn;
  info: LogFn;
  warn: LogFn;
  error: LogFn;
}

const noop: LogFn = () => undefined;

/** The library's default: says nothing, and `child` returns itself (no allocation per call). */
export const silentLogger: Logger = Object.freeze({
  child: () => silentLogger,
  debug: noop,
  info: noop,
  warn: noop,
  error: noop,
});

/** Where a service reports: logs, metrics, traces. Each defaults to silent / the global provider. */
export interface TelemetryOptions {
  /** Structured logs; default {@link silentLogger}. */
  logger?: Logger;
  /**
   * Meter provider for the service's instruments; default the global one
   * (`metrics.getMeterProvider()`) at the time the service is created. The API has no
   * proxy meter: register a global provider before creating the service, or pass it here.
   */
  meterProvider?: MeterProvider;
  /** Tracer provider for the service's spans; default the global one (a proxy: it may be registered later). */
  tracerProvider?: TracerProvider;
}

/** The instrumentation scope of every meter and tracer of the library. */
const INSTRUMENTATION_SCOPE = "runner-depot";

/** The library's meter: from `provider`, else the global provider. Create instruments from it once, not per call. */
export function meterOf(provider?: MeterProvider): Meter {
  return (provider ?? metrics.getMeterProvider()).getMeter(INSTRUMENTATION_SCOPE);
}

/** The library's tracer: from `provider`, else the global (proxy) provider. */
export function tracerOf(provider?: TracerProvider): Tracer {
  return (provider ?? trace.getTracerProvider()).getTracer(INSTRUMENTATION_SCOPE);
}

const headersGetter: TextMapGetter<Headers> = {
  // forEach, not keys(): keys() needs the DOM.Iterable lib, which a host's tsconfig may lack.
  keys: (carrier) => {
    const names: string[] = [];
    carrier.forEach((_value, name) => names.push(name));
    return names;
  },
  get: (carrier, key) => carrier.get(key) ?? undefined,
};

/**
 * The trace context of incoming request headers: through the host's registered
 * propagator (B3, Jaeger, …), else W3C `traceparent`/`tracestate` read directly, so a
 * host that registered only a tracer provider still joins its callers' traces.
 * ROOT_CONTEXT when the headers carry none. O(header size), bounded by the transport.
 */
export function traceContextOf(headers: Headers): Context {
  const extracted = propagation.extract(ROOT_CONTEXT, headers, headersGetter);
  if (trace.getSpanContext(extracted)) return extracted;
  const remote = parseTraceparent(headers.get("traceparent"), headers.get("tracestate"));
  return remote ? trace.setSpanContext(extracted, remote) : extracted;
}

/** Seconds since `startMs` (a `performance.now()` reading): the unit of every duration histogram. */
export function secondsSince(startMs: number): number {
  return (performance.now() - startMs) / 1000;
}
