/**
 * The depot's metrics, spans and log lines in one place (names: docs/decisions/operations.md).
 * Everything goes through `@opentelemetry/api`: without a registered provider each call is
 * a no-op on the API's noop instruments, and the logger defaults to one that drops lines.
 */
import { SpanKind, SpanStatusCode, type Attributes, type Context, type Span, type Tracer } from "@opentelemetry/api";
import { meterOf, silentLogger, tracerOf, type Logger, type TelemetryOptions } from "../../telemetry.js";
import type { CachedOpenCount } from "../transactions/open-count.js";

/** Seconds buckets from 1 ms to 60 s (the SDK's default buckets are for milliseconds). */
const SECONDS_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];

/** Where the depot sends its telemetry (router options): the shared options of src/telemetry.ts. */
export type DepotTelemetryOptions = TelemetryOptions;

/** One `depot.requests` series: its attributes and its count so far. */
interface RequestSeries {
  readonly attributes: Attributes;
  count: number;
}

/** What a commit came to, for `depot.commit.duration`. */
export type CommitOutcome = "published" | "repeated" | "refused" | "failed";

/** The depot's instruments, created once per router. */
export class DepotTelemetry {
  readonly logger: Logger;
  /** Got once (the global provider's is a proxy: a provider registered later still takes over). */
  private readonly tracer: Tracer;
  private readonly requests;
  private readonly requestDuration;
  private readonly bytesIn;
  private readonly bytesOut;
  private readonly commitDuration;
  private readonly publishes;
  private readonly transactionsOpen;
  private readonly gcReclaimed;
  private readonly gcBlobs;
  /** Store operation latency (depot/store/metrics.ts records into it). */
  readonly storeDuration;

  constructor(options: DepotTelemetryOptions = {}) {
    this.logger = options.logger ?? silentLogger;
    this.tracer = tracerOf(options.tracerProvider);
    const meter = meterOf(options.meterProvider);
    const seconds = { unit: "s", advice: { explicitBucketBoundaries: SECONDS_BUCKETS } };
    // Counted here and observed at collection (below): one SDK record per request instead of two.
    this.requests = meter.createObservableCounter("depot.requests", {
      unit: "{request}",
      description: "Requests answered, by route, method and status",
    });
    this.requests.addCallback((result) => {
      for (const series of this.requestSeries.values()) result.observe(series.count, series.attributes);
      if (this.overflowSeries.count > 0) result.observe(this.overflowSeries.count, this.overflowSeries.attributes);
    });
    this.requestDuration = meter.createHistogram("depot.request.duration", {
      ...seconds,
      description: "Time to the response head, by route, method and status",
    });
    this.bytesIn = meter.createCounter("depot.bytes.in", {
      unit: "By",
      description: "Upload body bytes read (files and licences)",
    });
    this.bytesOut = meter.createCounter("depot.bytes.out", {
      unit: "By",
      description: "Archive and delta body bytes sent",
    });
    this.commitDuration = meter.createHistogram("depot.commit.duration", {
      ...seconds,
      description: "Commit latency, by outcome",
    });
    this.publishes = meter.createCounter("depot.publishes", {
      unit: "{version}",
      description: "Versions published (first commits)",
    });
    // An observable gauge answered from the store (a cached count: depot/transactions/open-count.ts), so the
    // value is the depot's, whichever replica is scraped and across restarts.
    this.transactionsOpen = meter.createObservableGauge("depot.transactions.open", {
      unit: "{transaction}",
      description: "Transactions open or committing, depot-wide (read from the store, cached)",
    });
    this.gcReclaimed = meter.createCounter("depot.gc.reclaimed", {
      unit: "By",
      description: "Blob bytes deleted by garbage collection",
    });
    this.gcBlobs = meter.createCounter("depot.gc.deleted_blobs", {
      unit: "{blob}",
      description: "Blobs deleted by garbage collection",
    });
    this.storeDuration = meter.createHistogram("depot.store.duration", {
      ...seconds,
      description: "Store operation latency, by operation and outcome",
    });
  }

  /**
   * One answered request. `route` is the matched pattern (bounded), never the raw path.
   * O(1): a map lookup, an increment, one histogram record. `depot.requests` is an
   * observable counter read from these counts at collection, so a request costs the SDK
   * one record (its clock read and attributes hash) instead of two.
   */
  request(route: string, method: string, status: number, seconds: number): void {
    const series = this.seriesOf(route, method, status);
    series.count++;
    this.requestDuration.record(seconds, series.attributes);
  }

  /**
   * One series per (route, method, status), its frozen attributes object reused on every request: no allocation
   * per call on the hot path.
   * Why: docs/decisions/operations.md, "telemetry.ts: DepotTelemetry.requestSeries".
   */
  private readonly requestSeries = new Map<string, RequestSeries>();
  private readonly overflowSeries: RequestSeries = {
    attributes: Object.freeze({ "otel.metric.overflow": true }),
    count: 0,
  };

  private seriesOf(route: string, method: string, status: number): RequestSeries {
    const key = `${status} ${method} ${route}`;
    const known = this.requestSeries.get(key);
    if (known !== undefined) return known;
    const attributes = Object.freeze({
      "http.route": route,
      "http.request.method": method,
      "http.response.status_code": status,
    });
    if (this.requestSeries.size >= 512) {
      this.overflowSeries.count++;
      return { attributes, count: 0 };
    }
    const series = { attributes, count: 0 };
    this.requestSeries.set(key, series);
    return series;
  }

  // No attributes on the byte counters: an SDK hashes a record's attributes on every call,
  // and the route adds little (uploads have one route; downloads split by depot.requests).
  bytesRead(bytes: number): void {
    if (bytes > 0) this.bytesIn.add(bytes);
  }

  bytesSent(bytes: number): void {
    if (bytes > 0) this.bytesOut.add(bytes);
  }

  committed(outcome: CommitOutcome, seconds: number): void {
    this.commitDuration.record(seconds, { outcome });
    if (outcome === "published") this.publishes.add(1);
  }

  private openCount: CachedOpenCount | null = null;

  /** Answers `depot.transactions.open` from `count` (once per router). */
  observeOpenTransactions(count: CachedOpenCount): void {
    this.openCount = count;
    this.transactionsOpen.addCallback(async (result) => {
      const value = await count.read();
      if (value !== null) result.observe(value);
    });
  }

  /** +1 on open, -1 on each commit, abandon or expiry this process carries out (moves the cached count at once). */
  transactionDelta(delta: number): void {
    this.openCount?.add(delta);
  }

  reclaimed(blobs: number, bytes: number): void {
    if (blobs > 0) this.gcBlobs.add(blobs);
    if (bytes > 0) this.gcReclaimed.add(bytes);
  }

  /** Starts a server span under `parent` (the request's trace context). */
  startSpan(name: string, parent: Context, attributes: Attributes): Span {
    return this.tracer.startSpan(name, { kind: SpanKind.SERVER, attributes }, parent);
  }
}

/** Ends a span with an error status from `error` (its message only: never a header or body). */
export function failSpan(span: Span, error: unknown): void {
  const code = (error as { code?: unknown } | null)?.code;
  span.setStatus({ code: SpanStatusCode.ERROR, message: typeof code === "string" ? code : "error" });
  span.end();
}
