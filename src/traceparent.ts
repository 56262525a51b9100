/**
 * The W3C Trace Context `traceparent` header (https://www.w3.org/TR/trace-context/),
 * parsed without an OpenTelemetry SDK: the library reads incoming trace context even
 * when the host registered no propagator.
 */
import { createTraceState, TraceFlags, type SpanContext } from "@opentelemetry/api";

/** Longest header value looked at; the version-00 form is 55 characters. */
const MAX_TRACEPARENT = 512;
const VERSION_00 = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;
// Later versions may append fields after the flags (§3.2.4): the first four are read.
const VERSION_LATER = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(?:-|$)/;
const ALL_ZERO = /^0+$/;

/**
 * The remote span context of a `traceparent` value (with its `tracestate`), or null when it is absent or
 * invalid (the spec says: then start a new trace). O(1): values over 512 characters are
 * refused before any regular expression runs.
 *
 * @example
 * parseTraceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
 * // → { traceId: "4bf9…4736", spanId: "00f0…02b7", traceFlags: 1, isRemote: true }
 */
export function parseTraceparent(value: string | null | undefined, tracestate?: string | null): SpanContext | null {
  if (typeof value !== "string" || value.length > MAX_TRACEPARENT) return null;
  const text = value.trim();
  let traceId: string;
  let spanId: string;
  let flags: string;
  const v00 = VERSION_00.exec(text);
  if (v00) {
    [, traceId, spanId, flags] = v00 as unknown as [string, string, string, string];
  } else {
    const later = VERSION_LATER.exec(text);
    // Version ff is forbidden; 00 must match its exact form above.
    if (!later || later[1] === "ff" || later[1] === "00") return null;
    [, , traceId, spanId, flags] = later as unknown as [string, string, string, string, string];
  }
  if (ALL_ZERO.test(traceId) || ALL_ZERO.test(spanId)) return null;
  const context: SpanContext = {
    traceId,
    spanId,
    traceFlags: Number.parseInt(flags, 16) & TraceFlags.SAMPLED,
    isRemote: true,
  };
  // The spec bounds tracestate to 512 characters; a longer one is dropped, not cut.
  if (typeof tracestate === "string" && tracestate.length > 0 && tracestate.length <= MAX_TRACEPARENT)
    context.traceState = createTraceState(tracestate);
  return context;
}
