/**
 * Runner telemetry over a real HTTP/2 socket: a runner service on startRunnerServer with
 * an fs log store, real gRPC calls (a job of 1,000 lines, a resume, a cancel, refused
 * calls), and the metrics read back through an in-memory OpenTelemetry reader with exact
 * counts; spans through the SDK's in-memory exporter, parented by the caller's
 * `traceparent`; log lines through a real pino logger, with no token or secret in them.
 */
import { randomUUID } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { MeterProvider, type MetricData } from "@opentelemetry/sdk-metrics";
import { InMemorySpanExporter, SimpleSpanProcessor, TracerProvider } from "@opentelemetry/sdk-trace";
import { createFsLogStore } from "../../../src/adapters/fs/index.js";
import { mintJobToken } from "../../../src/runner/protocol/token.js";
import type { JobLogStore } from "../../../src/runner/ports.js";
import { controlledStream, end, line, send, startHarness, until, type Harness } from "../../fixtures/runner-service.js";
import { captureLogs, MemoryReader, metricsOf } from "../../fixtures/telemetry-reader.js";

/** The value of a metric's points whose attributes include `match` (a histogram's: its count), summed. */
function valueOf(metrics: Map<string, MetricData>, name: string, match: Record<string, unknown> = {}): number {
  const metric = metrics.get(name);
  if (!metric) return 0;
  let total = 0;
  for (const p of metric.dataPoints) {
    if (!Object.entries(match).every(([k, v]) => p.attributes[k] === v)) continue;
    const v = p.value as number | { count: number };
    total += typeof v === "number" ? v : v.count;
  }
  return total;
}

/** The fs log store, with its appends counted (the histogram must see each one). */
function countingStore(dir: string): { store: JobLogStore; appends: () => number } {
  const base = createFsLogStore(dir);
  let appends = 0;
  const store = new Proxy(base, {
    get(target, prop, receiver) {
      if (prop === "append") {
        return (...args: Parameters<JobLogStore["append"]>) => {
          appends++;
          return target.append(...args);
        };
      }
      const value = Reflect.get(target, prop, receiver) as unknown;
      return typeof value === "function" ? (value as (...a: unknown[]) => unknown).bind(target) : value;
    },
  });
  return { store, appends: () => appends };
}

const SECRET = "telemetry-test-secret-0123456789abcdef";
const TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT = "00f067aa0ba902b7";

describe("runner metrics, spans and logs after real traffic", () => {
  const reader = new MemoryReader();
  const meterProvider = new MeterProvider({ readers: [reader] });
  const spans = new InMemorySpanExporter();
  const tracerProvider = new TracerProvider({ spanProcessors: [new SimpleSpanProcessor({ exporter: spans })] });
  const logs = captureLogs();
  const dir = mkdtempSync(join(tmpdir(), "runner-depot-telemetry-"));
  const counted = countingStore(dir);
  let h: Harness;
  const tokens: string[] = [];
  const token = (id: string) => {
    const t = mintJobToken(SECRET, id);
    tokens.push(t);
    return t;
  };
  const jobA = randomUUID();
  const jobB = randomUUID();
  const jobC = randomUUID();
  const jobD = randomUUID();
  let bytesSent = 0;
  const lineOf = (id: string, text: string) => {
    bytesSent += Buffer.byteLength(text, "utf8");
    return line(id, text);
  };

  beforeAll(async () => {
    h = await startHarness({ secret: SECRET, logs: counted.store, logger: logs.logger, meterProvider, tracerProvider });

    // A job of 1,000 lines and its end, in one call carrying the caller's trace context.
    const a = [...Array.from({ length: 1000 }, (_, i) => lineOf(jobA, `line ${i} of job A — ünïcode`)), end(jobA, 0)];
    expect(
      await send(h.client, a, { token: token(jobA), headers: { traceparent: `00-${TRACE_ID}-${PARENT}-01` } }),
    ).toMatchObject({ ok: true, committed: "1001" });

    // A resume: 10 lines, the call ends without the end; the next call resends 8 and 9 (not counted again) and adds 5.
    expect(
      await send(
        h.client,
        Array.from({ length: 10 }, (_, i) => lineOf(jobB, `b${i}`)),
        { token: token(jobB) },
      ),
    ).toMatchObject({ ok: true, committed: "10" });
    const resumed = [
      line(jobB, "b8"),
      line(jobB, "b9"),
      ...Array.from({ length: 5 }, (_, i) => lineOf(jobB, `b${10 + i}`)),
      end(jobB, 1),
    ];
    expect(await send(h.client, resumed, { token: token(jobB), offset: 8 })).toMatchObject({
      ok: true,
      committed: "16",
    });

    // A cancel: 3 lines stored, the host cancels, the runner's next call gets ok = false.
    expect(
      await send(
        h.client,
        [0, 1, 2].map((i) => lineOf(jobC, `c${i}`)),
        { token: token(jobC) },
      ),
    ).toMatchObject({ ok: true, committed: "3" });
    expect(await h.runner.cancelJob(jobC)).toMatchObject({ outcome: "cancelled" });
    expect(await send(h.client, [line(jobC, "c3")], { token: token(jobC), offset: 3 })).toMatchObject({
      ok: false,
      reason: "cancelled",
    });

    // Refused callers: a token of another job, and no token at all.
    expect(await send(h.client, [line(jobD, "d0")], { token: token(jobA) })).toMatchObject({
      code: "PermissionDenied",
    });
    expect(await send(h.client, [line(jobD, "d0")])).toMatchObject({ code: "Unauthenticated" });
  }, 60_000);

  afterAll(async () => {
    await h.close();
    await meterProvider.shutdown();
    await tracerProvider.shutdown();
    rmSync(dir, { recursive: true, force: true });
  });

  it("counts lines, bytes, calls by code, the resume, refusals and outcomes exactly", async () => {
    const m = await metricsOf(reader);
    expect(valueOf(m, "runner.lines.ingested")).toBe(1000 + 15 + 3);
    expect(valueOf(m, "runner.bytes.ingested")).toBe(bytesSent);
    expect(valueOf(m, "runner.calls", { "rpc.grpc.status_code": 0 })).toBe(5);
    expect(valueOf(m, "runner.calls", { "rpc.grpc.status_code": 7 })).toBe(1);
    expect(valueOf(m, "runner.calls", { "rpc.grpc.status_code": 16 })).toBe(1);
    expect(valueOf(m, "runner.calls")).toBe(7);
    // B's second call, and C's call after the cancel (it joined a job with 3 items stored).
    expect(valueOf(m, "runner.resumes")).toBe(2);
    expect(valueOf(m, "runner.items.refused", { "runner.reason": "job_ended" })).toBe(1);
    expect(valueOf(m, "runner.items.refused", { "runner.reason": "unauthorized" })).toBe(1);
    expect(valueOf(m, "runner.items.refused")).toBe(2);
    expect(valueOf(m, "runner.jobs.ended", { "runner.outcome": "finished" })).toBe(2);
    expect(valueOf(m, "runner.jobs.ended", { "runner.outcome": "cancelled" })).toBe(1);
    expect(valueOf(m, "runner.queue.publish.duration", { "runner.publish.result": "accepted" })).toBe(3);
    expect(valueOf(m, "runner.queue.publish.duration")).toBe(3);
    expect(valueOf(m, "runner.queue.publish.retries")).toBe(0);
    expect(valueOf(m, "runner.streams.open")).toBe(0);
    expect(counted.appends()).toBeGreaterThan(0);
    expect(valueOf(m, "runner.log_store.append.duration")).toBe(counted.appends());
    expect(m.get("runner.log_store.append.duration")?.descriptor.unit).toBe("s");
  });

  it("counts an open stream while a call is in progress", async () => {
    const id = randomUUID();
    const stream = controlledStream();
    const pending = send(h.client, stream.items, { token: token(id) });
    stream.push(line(id, "x"));
    await until(async () => (await h.logs.get(id))?.committed === 1, "the line stored");
    expect(valueOf(await metricsOf(reader), "runner.streams.open")).toBe(1);
    stream.close();
    expect(await pending).toMatchObject({ ok: true });
    expect(valueOf(await metricsOf(reader), "runner.streams.open")).toBe(0);
  });

  it("a StreamLogs span joins the caller's trace, and the publish span is its child", () => {
    const done = spans.getFinishedSpans();
    const calls = done.filter((s) => s.name === "runner.v1.Runner/StreamLogs");
    const first = calls.find((s) => s.attributes["runner.request_id"] === jobA)!;
    expect(first.spanContext().traceId).toBe(TRACE_ID);
    expect(first.parentSpanContext?.spanId).toBe(PARENT);
    expect(first.attributes).toMatchObject({
      "rpc.system": "grpc",
      "rpc.method": "StreamLogs",
      "rpc.grpc.status_code": 0,
      "runner.committed": 1001,
    });
    const publish = done.find((s) => s.name === "runner.queue.publish" && s.attributes["runner.request_id"] === jobA)!;
    expect(publish.parentSpanContext?.spanId).toBe(first.spanContext().spanId);
    expect(publish.attributes["runner.publish.result"]).toBe("accepted");
    const denied = calls.find((s) => s.attributes["rpc.grpc.status_code"] === 7)!;
    expect(denied.status.code).toBe(2); // ERROR
    // A call without traceparent starts its own trace.
    const other = calls.find((s) => s.attributes["runner.request_id"] === jobB)!;
    expect(other.spanContext().traceId).not.toBe(TRACE_ID);
  });

  it("logs call ends, the resume, the cancel and the refusals, and never a token or the secret", () => {
    const parsed = logs.parsed();
    const byMsg = (msg: string) => parsed.filter((l) => l.msg === msg);
    expect(byMsg("call ended").filter((l) => l.requestId === jobA)).toEqual([
      expect.objectContaining({ code: "OK", ok: true, offset: 0, committed: 1001, items: 1001 }),
    ]);
    // A call's start names its job, the offset it resumes at and what the server had stored.
    expect(byMsg("call started").find((l) => l.requestId === jobA)).toMatchObject({
      level: 20,
      offset: 0,
      committed: 0,
      protocol: "grpc",
    });
    expect(
      byMsg("call started")
        .filter((l) => l.requestId === jobB)
        .map((l) => [l.offset, l.committed]),
    ).toEqual([
      [0, 0],
      [8, 10],
    ]);
    expect(byMsg("call resumed").find((l) => l.requestId === jobB)).toMatchObject({
      level: 30,
      offset: 8,
      committed: 10,
    });
    expect(byMsg("call ended").find((l) => l.requestId === jobB && l.committed === 16)).toMatchObject({
      code: "OK",
      ok: true,
      offset: 8,
    });
    expect(byMsg("call resumed").map((l) => l.requestId)).toContain(jobB);
    expect(byMsg("call ended").find((l) => l.requestId === jobC && l.ok === false)).toMatchObject({
      reason: "cancelled",
    });
    expect(byMsg("job cancelled")).toEqual([expect.objectContaining({ requestId: jobC, lines: 3 })]);
    expect(
      byMsg("job ended")
        .map((l) => l.outcome)
        .sort(),
    ).toEqual(["cancelled", "finished", "finished"]);
    expect(
      byMsg("call refused")
        .map((l) => l.code)
        .sort(),
    ).toEqual(["PERMISSION_DENIED", "UNAUTHENTICATED"]);
    expect(byMsg("call refused").find((l) => l.code === "PERMISSION_DENIED")).toMatchObject({ requestId: jobD });
    const all = logs.lines.join("\n");
    expect(tokens.length).toBeGreaterThan(3);
    for (const t of tokens) expect(all).not.toContain(t);
    expect(all).not.toContain(SECRET);
    expect(all.toLowerCase()).not.toContain("bearer");
  });
});

describe("runner telemetry: lost jobs and the sweep", () => {
  it("counts the job declared lost and the sweeps, and logs it", async () => {
    const reader = new MemoryReader();
    const meterProvider = new MeterProvider({ readers: [reader] });
    const logs = captureLogs();
    const h = await startHarness({ lostAfterMs: 200, sweepIntervalMs: 50, logger: logs.logger, meterProvider });
    try {
      const id = randomUUID();
      expect(await send(h.client, [line(id, "x")])).toMatchObject({ ok: true });
      await until(async () => (await h.logs.get(id))?.status === "lost", "the job declared lost");
      await until(() => logs.parsed().some((l) => l.msg === "job lost"), "the lost line");
      const m = await metricsOf(reader);
      expect(valueOf(m, "runner.jobs.ended", { "runner.outcome": "lost" })).toBe(1);
      expect(valueOf(m, "runner.lost.sweeps")).toBeGreaterThanOrEqual(1);
      expect(logs.parsed().find((l) => l.msg === "job lost")).toMatchObject({ requestId: id, level: 40 });
    } finally {
      await h.close();
      await meterProvider.shutdown();
    }
  });
});

describe("runner telemetry: result publish retries and give-ups", () => {
  it("logs a refused publish that is retried, then one given up, with the job and the attempt", async () => {
    const reader = new MemoryReader();
    const meterProvider = new MeterProvider({ readers: [reader] });
    const logs = captureLogs();
    // A 2 s publish bound: the first job's one retry must fit in it, which 300 ms did not
    // guarantee on a loaded machine (the retry waits on a timer).
    const h = await startHarness({
      logger: logs.logger,
      meterProvider,
      publishRetry: { initialDelayMs: 10, maxDelayMs: 20, maxMs: 2_000 },
    });
    try {
      // The queue refuses once: the end is retried and accepted within the call.
      const retried = randomUUID();
      h.queue.failNext(1);
      expect(await send(h.client, [line(retried, "a"), end(retried, 0)])).toMatchObject({ ok: true, committed: "2" });
      // The queue stays down past the publish bound: the call ends UNAVAILABLE, given up.
      const refused = randomUUID();
      h.queue.down = true;
      expect(await send(h.client, [line(refused, "b"), end(refused, 0)])).toMatchObject({ code: "Unavailable" });
      h.queue.down = false;

      const parsed = logs.parsed();
      const retries = parsed.filter((l) => l.msg === "result publish failed, retrying");
      expect(retries.find((l) => l.requestId === retried)).toMatchObject({
        level: 40,
        outcome: "finished",
        attempt: 1,
        delayMs: 10,
        error: "queue refused the publish",
      });
      expect(retries.filter((l) => l.requestId === retried)).toHaveLength(1);
      expect(retries.filter((l) => l.requestId === refused).length).toBeGreaterThanOrEqual(1);
      const givenUp = parsed.filter((l) => l.msg === "result publish given up");
      expect(givenUp).toEqual([
        expect.objectContaining({ level: 50, requestId: refused, outcome: "finished", error: "queue is down" }),
      ]);
      expect(givenUp[0]!.attempts).toBe(retries.filter((l) => l.requestId === refused).length + 1);
      expect(parsed.find((l) => l.msg === "job ended" && l.requestId === retried)).toMatchObject({
        outcome: "finished",
        exitCode: 0,
      });
      const m = await metricsOf(reader);
      expect(valueOf(m, "runner.queue.publish.retries")).toBe(
        1 + retries.filter((l) => l.requestId === refused).length,
      );
    } finally {
      await h.close();
      await meterProvider.shutdown();
    }
  });
});

describe("runner telemetry: the RabbitMQ queue's connection events", () => {
  it("logs a failed connect with its attempt, never the URL's credentials", async () => {
    const { createRabbitMqQueue } = await import("../../../src/adapters/rabbitmq/index.js");
    const logs = captureLogs();
    // A port nothing listens on: every connect fails at once.
    const queue = createRabbitMqQueue({
      url: "amqp://someone:hunter2-password@127.0.0.1:1",
      logger: logs.logger,
      reconnectDelayMs: { initial: 10, max: 20 },
    });
    try {
      await expect(queue.ready(300)).rejects.toThrow();
      await until(() => logs.parsed().some((l) => l.msg === "queue connect failed"), "a connect failure logged");
      expect(logs.parsed().find((l) => l.msg === "queue connect failed")).toMatchObject({
        queue: "runner.job-results",
        attempt: 1,
        level: 40,
      });
      expect(logs.lines.join("\n")).not.toContain("hunter2");
    } finally {
      await queue.close();
    }
  });
});
