/**
 * The runner service's metrics, spans and log lines in one place. Names, units and
 * attributes: docs/decisions/operations.md. Instruments are created once per service;
 * without a registered provider each is the API's no-op.
 */
import {
  SpanKind,
  SpanStatusCode,
  trace,
  type Attributes,
  type Context,
  type Counter,
  type Histogram,
  type Span,
  type Tracer,
  type UpDownCounter,
} from "@opentelemetry/api";
import { meterOf, silentLogger, tracerOf, type Logger, type TelemetryOptions } from "../../telemetry.js";

/** Seconds buckets from 1 ms to 60 s (the SDK's defaults are for milliseconds). */
const SECONDS_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];

/** Why an item ended its call unstored (`runner.reason`). */
export type RefusalReason =
  "message_too_large" | "invalid_item" | "offset_gap" | "job_ended" | "unauthorized" | "unknown_job";

/** How one publish attempt came out (`runner.publish.result`). */
type PublishResult = "accepted" | "refused" | "timeout";

/** gRPC code names by number, for log lines (metrics and spans carry the number). */
const GRPC_CODE_NAMES = [
  "OK",
  "CANCELLED",
  "UNKNOWN",
  "INVALID_ARGUMENT",
  "DEADLINE_EXCEEDED",
  "NOT_FOUND",
  "ALREADY_EXISTS",
  "PERMISSION_DENIED",
  "RESOURCE_EXHAUSTED",
  "FAILED_PRECONDITION",
  "ABORTED",
  "OUT_OF_RANGE",
  "UNIMPLEMENTED",
  "INTERNAL",
  "UNAVAILABLE",
  "DATA_LOSS",
  "UNAUTHENTICATED",
];

/** `runner.calls` attributes per gRPC code, made once each (codes are 0–16): no allocation per call. */
const CODE_ATTRIBUTES: Attributes[] = [];

/** The name of a gRPC code number. */
export function grpcCodeName(code: number): string {
  return GRPC_CODE_NAMES[code] ?? String(code);
}

/** The runner service's instruments and logger. */
export class RunnerTelemetry {
  readonly logger: Logger;
  private readonly tracer: Tracer;
  readonly linesIngested: Counter;
  readonly bytesIngested: Counter;
  private readonly itemsRefused: Counter;
  readonly streamsOpen: UpDownCounter;
  private readonly calls: Counter;
  readonly resumes: Counter;
  private readonly jobsEnded: Counter;
  private readonly publishDuration: Histogram;
  readonly publishRetries: Counter;
  readonly lostSweeps: Counter;
  readonly appendDuration: Histogram;

  constructor(options: TelemetryOptions) {
    this.logger = options.logger ?? silentLogger;
    this.tracer = tracerOf(options.tracerProvider);
    const meter = meterOf(options.meterProvider);
    const seconds = { unit: "s", advice: { explicitBucketBoundaries: SECONDS_BUCKETS } };
    this.linesIngested = meter.createCounter("runner.lines.ingested", {
      unit: "{line}",
      description: "New log lines accepted into a job (resends not counted)",
    });
    this.bytesIngested = meter.createCounter("runner.bytes.ingested", {
      unit: "By",
      description: "UTF-8 bytes of the new log lines as received",
    });
    this.itemsRefused = meter.createCounter("runner.items.refused", {
      unit: "{item}",
      description: "Items that ended their call unstored, by reason",
    });
    this.streamsOpen = meter.createUpDownCounter("runner.streams.open", {
      unit: "{stream}",
      description: "StreamLogs calls in progress",
    });
    this.calls = meter.createCounter("runner.calls", {
      unit: "{call}",
      description: "StreamLogs calls answered, by gRPC code",
    });
    this.resumes = meter.createCounter("runner.resumes", {
      unit: "{call}",
      description: "Calls that joined a job with items already stored",
    });
    this.jobsEnded = meter.createCounter("runner.jobs.ended", {
      unit: "{job}",
      description: "Job results recorded, by outcome",
    });
    this.publishDuration = meter.createHistogram("runner.queue.publish.duration", {
      ...seconds,
      description: "One queue publish attempt of a job result, by result",
    });
    this.publishRetries = meter.createCounter("runner.queue.publish.retries", {
      unit: "{attempt}",
      description: "Publish attempts after a job's first",
    });
    this.lostSweeps = meter.createCounter("runner.lost.sweeps", {
      unit: "{sweep}",
      description: "Lost-job sweeps run",
    });
    this.appendDuration = meter.createHistogram("runner.log_store.append.duration", {
      ...seconds,
      description: "One JobLogStore.append (a batch of lines)",
    });
  }

  /**
   * Starts the SERVER span of a StreamLogs call under the caller's trace context (see {@link childContext} for its
   * children's parent).
   */
  startCall(parent: Context, protocol: string): Span {
    return this.tracer.startSpan(
      "runner.v1.Runner/StreamLogs",
      {
        kind: SpanKind.SERVER,
        attributes: {
          "rpc.system": "grpc",
          "rpc.service": "runner.v1.Runner",
          "rpc.method": "StreamLogs",
          "runner.protocol": protocol,
        },
      },
      parent,
    );
  }

  /**
   * The context that parents a call's child spans: made when a child starts (a publish, once
   * a job), not with every call; each open call kept one (a context and its closures) for nothing.
   */
  childContext(parent: Context, span: Span): Context {
    return trace.setSpan(parent, span);
  }

  /** Counts a call's answer (metrics) and ends its span. */
  endCall(span: Span, code: number, attributes: Attributes): void {
    this.calls.add(1, (CODE_ATTRIBUTES[code] ??= Object.freeze({ "rpc.grpc.status_code": code })));
    span.setAttributes({ ...attributes, "rpc.grpc.status_code": code });
    if (code !== 0) span.setStatus({ code: SpanStatusCode.ERROR, message: grpcCodeName(code) });
    span.end();
  }

  refused(reason: RefusalReason): void {
    this.itemsRefused.add(1, { "runner.reason": reason });
  }

  jobEnded(outcome: string): void {
    this.jobsEnded.add(1, { "runner.outcome": outcome });
  }

  /** Starts the PRODUCER span of one queue publish. */
  startPublish(parent: Context | undefined, requestId: string, outcome: string): Span {
    return this.tracer.startSpan(
      "runner.queue.publish",
      { kind: SpanKind.PRODUCER, attributes: { "runner.request_id": requestId, "runner.outcome": outcome } },
      parent,
    );
  }

  /** Ends a publish attempt's span and records its duration. */
  endPublish(span: Span, result: PublishResult, seconds: number): void {
    this.publishDuration.record(seconds, { "runner.publish.result": result });
    span.setAttribute("runner.publish.result", result);
    if (result !== "accepted") span.setStatus({ code: SpanStatusCode.ERROR, message: result });
    span.end();
  }
}

/** A failure's message for a log line (never its metadata, which may carry headers). */
export function errorText(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
