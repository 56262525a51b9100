/** The shared telemetry helpers: the Logger type fits pino, the silent default, incoming trace context. */
import { Writable } from "node:stream";
import { pino } from "pino";
import { propagation, trace } from "@opentelemetry/api";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import { afterEach, describe, expect, it } from "vitest";
import { silentLogger, traceContextOf, type Logger } from "../src/telemetry.js";

const T = "4bf92f3577b34da6a3ce929d0e0e4736";
const S = "00f067aa0ba902b7";

describe("telemetry helpers", () => {
  afterEach(() => propagation.disable());

  it("a pino logger is a Logger as it is, and writes the object's fields and the message", () => {
    const lines: string[] = [];
    const sink = new Writable({
      write(chunk, _enc, done) {
        lines.push(String(chunk));
        done();
      },
    });
    const logger: Logger = pino({ level: "debug" }, sink);
    logger.child({ requestId: "r1" }).info({ committed: 3 }, "call ended");
    expect(JSON.parse(lines[0]!)).toMatchObject({ requestId: "r1", committed: 3, msg: "call ended", level: 30 });
  });

  it("the silent logger says nothing and its child is itself", () => {
    expect(silentLogger.child({ a: 1 })).toBe(silentLogger);
    expect(silentLogger.error({ a: 1 }, "x")).toBeUndefined();
  });

  it("reads W3C traceparent without a registered propagator", () => {
    const ctx = traceContextOf(new Headers({ traceparent: `00-${T}-${S}-01` }));
    expect(trace.getSpanContext(ctx)).toMatchObject({ traceId: T, spanId: S, traceFlags: 1, isRemote: true });
    expect(trace.getSpanContext(traceContextOf(new Headers({ traceparent: "garbage" })))).toBeUndefined();
    expect(trace.getSpanContext(traceContextOf(new Headers()))).toBeUndefined();
  });

  it("uses the host's registered propagator when there is one", () => {
    propagation.setGlobalPropagator(new W3CTraceContextPropagator());
    const ctx = traceContextOf(new Headers({ traceparent: `00-${T}-${S}-00`, tracestate: "k=v" }));
    expect(trace.getSpanContext(ctx)).toMatchObject({ traceId: T, spanId: S, traceFlags: 0 });
    expect(trace.getSpanContext(ctx)?.traceState?.get("k")).toBe("v");
  });
});
