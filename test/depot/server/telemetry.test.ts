/**
 * Depot telemetry over real HTTP: a listening servePackageRouter on an fs store, real
 * fetch traffic (a publish, a download, a 404, an abandon, garbage collection), and the
 * metrics read back through an in-memory OpenTelemetry reader with exact counts; spans
 * through the SDK's in-memory exporter, parented by the caller's `traceparent`; log
 * lines through a real pino logger, with no token in them.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { MeterProvider, type MetricData } from "@opentelemetry/sdk-metrics";
import { InMemorySpanExporter, SimpleSpanProcessor, TracerProvider } from "@opentelemetry/sdk-trace";
import { createFsStore } from "../../../src/adapters/fs/store.js";
import { bearerTokens } from "../../../src/depot/server/auth.js";
import { createPackageRouter, type PackageRouter } from "../../../src/depot/server/router.js";
import { servePackageRouter, type PackageServer } from "../../../src/depot/server/serve.js";
import { CachedOpenCount } from "../../../src/depot/transactions/open-count.js";
import { add, openTransaction, tempDir } from "../../fixtures/depot.js";
import { captureLogs, MemoryReader, metricsOf } from "../../fixtures/telemetry-reader.js";

/** Every data point of a metric as `{ attributes, value }` (a histogram's value: its count). */
function points(
  metric: MetricData | undefined,
): Array<{ attributes: Record<string, unknown>; value: number; sum?: number }> {
  if (!metric) return [];
  return metric.dataPoints.map((p) => {
    const v = p.value as number | { count: number; sum?: number };
    return typeof v === "number"
      ? { attributes: p.attributes, value: v }
      : { attributes: p.attributes, value: v.count, sum: v.sum };
  });
}

const TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT = "00f067aa0ba902b7";
const FILE = "hello, depot\n"; // 13 bytes

describe("depot metrics, spans and logs after real traffic", () => {
  const reader = new MemoryReader();
  const meterProvider = new MeterProvider({ readers: [reader] });
  const spans = new InMemorySpanExporter();
  const tracerProvider = new TracerProvider({ spanProcessors: [new SimpleSpanProcessor({ exporter: spans })] });
  const logs = captureLogs();
  let router: PackageRouter;
  let server: PackageServer;
  let cleanup: () => Promise<void>;

  beforeAll(async () => {
    const tmp = await tempDir();
    cleanup = tmp.cleanup;
    router = createPackageRouter(createFsStore(tmp.dir), {
      meterProvider,
      tracerProvider,
      logger: logs.logger,
      gcGraceMs: 0,
    });
    server = await servePackageRouter(router);
  });
  afterAll(async () => {
    await server.close();
    await meterProvider.shutdown();
    await tracerProvider.shutdown();
    await cleanup();
  });

  it("counts a publish, a download and a 404 exactly, by route and status", async () => {
    const id = await openTransaction(server.url, "tool@1.0.0");
    const opened = await metricsOf(reader);
    expect(points(opened.get("depot.transactions.open"))).toEqual([{ attributes: {}, value: 1 }]);

    expect((await add(server.url, id, { type: "file", path: "bin/tool", body: FILE })).status).toBe(201);
    const traceparent = `00-${TRACE_ID}-${PARENT}-01`;
    const commit = await fetch(`${server.url}/commit/${id}`, { method: "POST", headers: { traceparent } });
    expect(commit.status).toBe(201);
    const download = await fetch(`${server.url}/data/tool@1.0.0`, { headers: { traceparent } });
    expect(download.status).toBe(200);
    const archive = new Uint8Array(await download.arrayBuffer());
    expect((await fetch(`${server.url}/data/nothing-here`)).status).toBe(404);
    await router.idle();

    const found = await metricsOf(reader);
    const requests = points(found.get("depot.requests"))
      .map(
        (p) =>
          `${String(p.attributes["http.request.method"])} ${String(p.attributes["http.route"])} ${String(p.attributes["http.response.status_code"])} ×${p.value}`,
      )
      .sort();
    expect(requests).toEqual([
      "GET /data/:pkg 200 ×1",
      "GET /data/:pkg 404 ×1",
      "POST /add/:id/:type 201 ×1",
      "POST /commit/:id 201 ×1",
      "POST /trans/:pkg 201 ×1",
    ]);
    // The duration histogram counts the same requests.
    expect(points(found.get("depot.request.duration")).reduce((n, p) => n + p.value, 0)).toBe(5);
    expect(points(found.get("depot.bytes.in"))).toEqual([{ attributes: {}, value: Buffer.byteLength(FILE) }]);
    expect(points(found.get("depot.bytes.out"))).toEqual([{ attributes: {}, value: archive.byteLength }]);
    expect(archive.byteLength).toBeGreaterThan(Buffer.byteLength(FILE));
    expect(points(found.get("depot.publishes"))).toEqual([{ attributes: {}, value: 1 }]);
    expect(points(found.get("depot.commit.duration")).map((p) => [p.attributes, p.value])).toEqual([
      [{ outcome: "published" }, 1],
    ]);
    expect(points(found.get("depot.transactions.open"))).toEqual([{ attributes: {}, value: 0 }]);
    // Store latency: the operations a publish and a download need, all ok, each timed.
    const store = points(found.get("depot.store.duration"));
    const operations = new Set(store.map((p) => p.attributes.operation));
    for (const op of ["getRecord", "putRecord", "putBlob", "getBlob"]) expect(operations).toContain(op);
    expect(store.every((p) => p.attributes.outcome === "ok" && p.value > 0)).toBe(true);

    // Spans: one commit and one download, children of the caller's span in its trace.
    const finished = spans.getFinishedSpans();
    const byName = new Map(finished.map((s) => [s.name, s]));
    expect(finished.map((s) => s.name).sort()).toEqual(["depot.commit", "depot.download", "depot.download"]);
    const commitSpan = byName.get("depot.commit")!;
    expect(commitSpan.spanContext().traceId).toBe(TRACE_ID);
    expect(commitSpan.parentSpanContext?.spanId).toBe(PARENT);
    expect(commitSpan.attributes).toMatchObject({
      "depot.package": "tool",
      "depot.version": "1.0.0",
      "depot.transaction": id,
    });
    const served = finished.find(
      (s) => s.name === "depot.download" && s.attributes["http.response.status_code"] === 200,
    )!;
    expect(served.spanContext().traceId).toBe(TRACE_ID);
    expect(served.parentSpanContext?.spanId).toBe(PARENT);
    expect(served.attributes["depot.bytes_sent"]).toBe(archive.byteLength);
    const missing = finished.find((s) => s.name === "depot.download" && s !== served)!;
    expect(missing.status).toEqual({ code: 2, message: "PACKAGE_NOT_FOUND" });
    expect(missing.spanContext().traceId).not.toBe(TRACE_ID); // no traceparent: a new trace

    const messages = logs.parsed().map((l) => l.msg);
    expect(messages).toEqual(expect.arrayContaining(["transaction opened", "version published"]));
  });

  it("logs an abandon and a garbage collection, and counts the bytes it reclaimed", async () => {
    const id = await openTransaction(server.url, "tool@2.0.0");
    const body = "only in an abandoned transaction\n";
    expect((await add(server.url, id, { type: "file", path: "gone", body })).status).toBe(201);
    expect((await fetch(`${server.url}/trans/${id}`, { method: "DELETE" })).status).toBe(204);
    const report = await router.collectGarbage();
    expect(report.deletedBlobs).toBe(1);
    expect(report.reclaimedBytes).toBe(Buffer.byteLength(body));
    const found = await metricsOf(reader);
    expect(points(found.get("depot.gc.reclaimed"))).toEqual([{ attributes: {}, value: Buffer.byteLength(body) }]);
    expect(points(found.get("depot.gc.deleted_blobs"))).toEqual([{ attributes: {}, value: 1 }]);
    expect(points(found.get("depot.transactions.open"))).toEqual([{ attributes: {}, value: 0 }]);
    const lines = logs.parsed();
    expect(lines.find((l) => l.msg === "transaction abandoned")).toMatchObject({
      level: 30,
      transaction: id,
      name: "tool",
      version: "2.0.0",
    });
    expect(lines.find((l) => l.msg === "garbage collected")).toMatchObject({
      level: 30,
      deletedBlobs: 1,
      reclaimedBytes: Buffer.byteLength(body),
    });
  });
});

describe("depot.transactions.open is the depot's count, read from the store", () => {
  it("a second replica and a restarted one report the transactions another process opened; expired ones are not counted", async () => {
    const tmp = await tempDir();
    const tokens = { "alice-token-1f2e3d4c5b6a": ["*"], "bob-token-6a5b4c3d2e1f": ["*"] };
    const authorize = bearerTokens(tokens);
    const providers: MeterProvider[] = [];
    const replica = (extra: Parameters<typeof createPackageRouter>[1] = {}) => {
      const reader = new MemoryReader();
      providers.push(new MeterProvider({ readers: [reader] }));
      const router = createPackageRouter(createFsStore(tmp.dir), {
        authorize,
        meterProvider: providers.at(-1),
        ...extra,
      });
      return {
        router,
        open: async () => points((await metricsOf(reader)).get("depot.transactions.open")).map((p) => p.value),
      };
    };
    const a = replica();
    const server = await servePackageRouter(a.router);
    try {
      const [alice, bob] = Object.keys(tokens).map((t) => ({ Authorization: `Bearer ${t}` }));
      // Two principals (two slot records): alice opens two, bob one, and alice abandons one.
      await openTransaction(server.url, "one@1.0.0", alice);
      const dropped = await openTransaction(server.url, "two@1.0.0", alice);
      await openTransaction(server.url, "three@1.0.0", bob);
      expect((await fetch(`${server.url}/trans/${dropped}`, { method: "DELETE", headers: alice })).status).toBe(204);
      expect(await a.open()).toEqual([2]);
      // Another process on the same store (a replica, or this one restarted) never opened any.
      expect(await replica().open()).toEqual([2]);
      // Past the idle expiry, nothing holds a slot any more (expired, not yet collected).
      expect(await replica({ now: () => new Date(Date.now() + 25 * 3600_000) }).open()).toEqual([0]);
      // This process's own changes show on its next scrape.
      await openTransaction(server.url, "four@1.0.0", bob);
      expect(await a.open()).toEqual([3]);
    } finally {
      await server.close();
      for (const provider of providers) await provider.shutdown();
      await tmp.cleanup();
    }
  });
});

describe("the cached open-transaction count", () => {
  it("reads the store once per max age whatever the scrapes, and moves with local changes in between", async () => {
    let stored = 5;
    let reads = 0;
    let clock = 0;
    const count = new CachedOpenCount(
      async () => (reads++, stored),
      30_000,
      () => clock,
    );
    expect(await count.read()).toBe(5);
    count.add(1);
    stored = 9; // another replica opened some: not seen until the count is stale
    for (let i = 0; i < 10; i++) expect(await count.read()).toBe(6);
    expect(reads).toBe(1);
    clock = 30_000;
    expect(await count.read()).toBe(9);
    expect(reads).toBe(2);
    // The store unreachable at a refresh: the last count stands, the next scrape retries.
    const failing = new CachedOpenCount(
      async () => {
        throw new Error("store down");
      },
      30_000,
      () => clock,
    );
    expect(await failing.read()).toBeNull();
  });
});

describe("depot log events of the transaction lifecycle", () => {
  it("logs an expiry found by a request and those garbage collection makes, a repeated commit and refused ones", async () => {
    const tmp = await tempDir();
    const logs = captureLogs();
    let clock = Date.now();
    const router = createPackageRouter(createFsStore(tmp.dir), { logger: logs.logger, now: () => new Date(clock) });
    const server = await servePackageRouter(router);
    try {
      const done = await openTransaction(server.url, "lib@1.0.0");
      expect((await add(server.url, done, { type: "file", path: "a", body: "a\n" })).status).toBe(201);
      expect((await fetch(`${server.url}/commit/${done}`, { method: "POST" })).status).toBe(201);
      expect((await fetch(`${server.url}/commit/${done}`, { method: "POST" })).status).toBe(200);
      const abandoned = await openTransaction(server.url, "lib@1.0.2");
      expect((await fetch(`${server.url}/trans/${abandoned}`, { method: "DELETE" })).status).toBe(204);
      expect((await fetch(`${server.url}/commit/${abandoned}`, { method: "POST" })).status).toBe(410);
      const byRequest = await openTransaction(server.url, "lib@2.0.0");
      const byGc = [await openTransaction(server.url, "lib@3.0.0"), await openTransaction(server.url, "lib@4.0.0")];
      // A day and an hour later all three are past their idle expiry (24 h).
      clock += 25 * 3600_000;
      expect((await fetch(`${server.url}/commit/${byRequest}`, { method: "POST" })).status).toBe(410);
      expect((await router.collectGarbage()).expired).toBe(2);

      const parsed = logs.parsed();
      const byMsg = (msg: string) => parsed.filter((l) => l.msg === msg);
      expect(byMsg("version published")).toEqual([
        expect.objectContaining({
          level: 30,
          transaction: done,
          name: "lib",
          version: "1.0.0",
          digest: expect.stringMatching(/^sha256:/),
        }),
      ]);
      expect(byMsg("commit repeated")).toEqual([
        expect.objectContaining({ level: 30, transaction: done, name: "lib", version: "1.0.0" }),
      ]);
      expect(byMsg("commit refused").map((l) => [l.level, l.transaction, l.code])).toEqual([
        [30, abandoned, "TRANSACTION_GONE"],
        [30, byRequest, "TRANSACTION_EXPIRED"],
      ]);
      // The request's expiry first, then garbage collection's, one line each.
      const expired = byMsg("transaction expired").map((l) => [l.level, l.transaction, l.version]);
      expect(expired[0]).toEqual([30, byRequest, "2.0.0"]);
      expect(expired.slice(1).sort()).toEqual(
        [
          [30, byGc[0], "3.0.0"],
          [30, byGc[1], "4.0.0"],
        ].sort(),
      );
      expect(byMsg("garbage collected")).toEqual([expect.objectContaining({ level: 30, expired: 2 })]);
    } finally {
      await server.close();
      await tmp.cleanup();
    }
  });
});

describe("a failed garbage collection", () => {
  it("is logged at error with the error, and collectGarbage rejects", async () => {
    const tmp = await tempDir();
    const logs = captureLogs();
    const store = createFsStore(tmp.dir);
    // A store whose blob listing fails (a backend gone mid-run).
    const failing = Object.assign(Object.create(Object.getPrototypeOf(store) as object) as typeof store, store, {
      listBlobs: async function* () {
        throw new Error("blob listing failed");
      },
    });
    const router = createPackageRouter(failing, { logger: logs.logger });
    try {
      await expect(router.collectGarbage()).rejects.toThrow("blob listing failed");
      const failed = logs.parsed().filter((l) => l.msg === "garbage collection failed");
      expect(failed).toEqual([
        expect.objectContaining({ level: 50, err: expect.objectContaining({ message: "blob listing failed" }) }),
      ]);
      expect(logs.parsed().some((l) => l.msg === "garbage collected")).toBe(false);
    } finally {
      await tmp.cleanup();
    }
  });
});

describe("auth refusals are logged without the token", () => {
  it("logs a 401 and a 403 with their codes, and no line holds a token or the Authorization header", async () => {
    const tmp = await tempDir();
    const logs = captureLogs();
    const writer = "writer-token-7f3a9c1e5b2d";
    const reader = "reader-token-0c4e8a2f6b1d";
    const router = createPackageRouter(createFsStore(tmp.dir), {
      authorize: bearerTokens({ [writer]: ["*"], [reader]: { read: ["*"] } }),
      logger: logs.logger,
    });
    const server = await servePackageRouter(router, { logger: logs.logger });
    try {
      const wrong = "wrong-token-9d8c7b6a5f4e";
      expect(
        (
          await fetch(`${server.url}/trans/tool@1.0.0`, {
            method: "POST",
            headers: { Authorization: `Bearer ${wrong}` },
          })
        ).status,
      ).toBe(401);
      expect(
        (
          await fetch(`${server.url}/trans/tool@1.0.0`, {
            method: "POST",
            headers: { Authorization: `Bearer ${reader}` },
          })
        ).status,
      ).toBe(403);
      expect((await fetch(`${server.url}/catalog`, { headers: { Authorization: `Bearer ${writer}` } })).status).toBe(
        200,
      );
      const refusals = logs.parsed().filter((l) => l.msg === "auth refused");
      expect(refusals.map((l) => [l.level, l.code, l.action, l.name, l.route])).toEqual([
        [40, "UNAUTHENTICATED", "publish", "tool", "/trans/:pkg"],
        [40, "PERMISSION_DENIED", "publish", "tool", "/trans/:pkg"],
      ]);
      // Every line, including the debug request lines and the server's own.
      const text = logs.lines.join("\n");
      expect(logs.lines.length).toBeGreaterThanOrEqual(5);
      for (const secret of [writer, reader, wrong, "Bearer", "authorization"])
        expect(text.toLowerCase()).not.toContain(secret.toLowerCase());
    } finally {
      await server.close();
      await tmp.cleanup();
    }
  });
});

describe("the library takes no OpenTelemetry SDK and no pino", () => {
  it("only src/cli imports them; everything else imports @opentelemetry/api alone", async () => {
    const { readdir, readFile } = await import("node:fs/promises");
    const root = new URL("../../../src/", import.meta.url);
    const files = (await readdir(root, { recursive: true })).filter((f) => f.endsWith(".ts") && !f.startsWith("gen/"));
    // Import statements only (line start), not a JSDoc example that shows pino to a host.
    const sdk = /^(?:import|export|\})[^\n]*from\s+"(pino[^"]*|@opentelemetry\/(?!api")[^"]+)"/m;
    const offenders = [];
    let api = 0;
    for (const file of files) {
      const text = await readFile(new URL(file, root), "utf8");
      if (text.includes('from "@opentelemetry/api"')) api++;
      if (sdk.test(text) && !file.startsWith("cli/")) offenders.push(file);
    }
    expect(offenders).toEqual([]);
    expect(api).toBeGreaterThan(3);
    // And the CLI's SDK users are the two serve modules.
    const cliUsers = [];
    for (const file of files.filter((f) => f.startsWith("cli/")))
      if (sdk.test(await readFile(new URL(file, root), "utf8"))) cliUsers.push(file);
    expect(cliUsers.sort()).toEqual(["cli/serve/serve-log.ts", "cli/serve/serve-telemetry.ts"]);
  });
});
