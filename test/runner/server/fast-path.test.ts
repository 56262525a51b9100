/**
 * The gRPC fast path of createRunnerHandler against the connect-node path: the same
 * scenarios, sent as raw HTTP/2 gRPC requests (so frame boundaries are ours to choose),
 * must give the same status, headers and trailers on both, and store the same lines.
 * Also: which requests the fast path takes (plain gRPC StreamLogs) and which it leaves to
 * connect (compressed, Connect protocol, gRPC-web, a deadline), and its back-pressure.
 */
import * as http2 from "node:http2";
import { randomUUID } from "node:crypto";
import type { AddressInfo } from "node:net";
import { create, toBinary } from "@bufbuild/protobuf";
import { createClient, createContextValues } from "@connectrpc/connect";
import {
  compressionGzip,
  createConnectTransport,
  createGrpcTransport,
  createGrpcWebTransport,
} from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { LogItemSchema, Runner, type LogItem } from "../../../src/gen/runner/v1/runner_pb.js";
import {
  createRunnerHandler,
  createRunnerService,
  startRunnerServer,
  type RunnerServer,
  type RunnerService,
} from "../../../src/runner/index.js";
import { createStreamLogsFastPath } from "../../../src/runner/server/fast-path.js";
import { kMessageBytes, kShutdownSignal } from "../../../src/runner/service/runner-service.js";
import { LINE_RECORD_OVERHEAD } from "../../../src/runner/service/log-cap.js";
import { createReadBudget } from "../../../src/runner/server/read-budget.js";
import { createMemoryLogStore, createMemoryQueue, type MemoryQueue } from "../../../src/adapters/memory/index.js";
import { createFsLogStore } from "../../../src/adapters/fs/log-store.js";
import { createPostgresLogStore } from "../../../src/adapters/postgres/index.js";
import { createTestSchema, needs } from "../../fixtures/backends.js";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import type { JobLogStore, LogEntry } from "../../../src/runner/ports.js";
import { end, line, send, until } from "../../fixtures/runner-service.js";

const PATH = "/runner.v1.Runner/StreamLogs";

function frame(item: LogItem, flags = 0): Buffer {
  const bytes = toBinary(LogItemSchema, item);
  const out = Buffer.alloc(5 + bytes.length);
  out[0] = flags;
  out.writeUInt32BE(bytes.length, 1);
  out.set(bytes, 5);
  return out;
}

/** What a raw gRPC call came to on the wire. */
interface Wire {
  status: number;
  headers: Record<string, string>;
  trailers: Record<string, string> | null;
  body: Buffer;
}

/** One step of a raw call: bytes to write (each awaited as its own write), a pause, or a wait for a condition. */
type Step = Buffer | { waitFor: () => Promise<boolean> };

async function rawCall(url: string, steps: Step[], headers: Record<string, string> = {}): Promise<Wire> {
  const session = http2.connect(url);
  session.on("error", () => undefined);
  try {
    const req = session.request({
      ":method": "POST",
      ":path": PATH,
      "content-type": "application/grpc",
      te: "trailers",
      ...headers,
    });
    req.on("error", () => undefined);
    let responseHeaders: http2.IncomingHttpHeaders = {};
    let trailers: http2.IncomingHttpHeaders | null = null;
    const chunks: Buffer[] = [];
    req.on("response", (h) => (responseHeaders = h));
    req.on("trailers", (t) => (trailers = t));
    req.on("data", (c: Buffer) => chunks.push(c));
    const closed = new Promise<void>((resolve) => req.once("close", resolve));
    for (const step of steps) {
      if (Buffer.isBuffer(step)) {
        await new Promise<void>((resolve) => req.write(step, () => resolve()));
        // A separate DATA frame per write: let it leave before the next one.
        await new Promise((r) => setTimeout(r, 5));
      } else {
        await until(step.waitFor, "server-side condition");
      }
    }
    if (!req.closed && !req.destroyed) req.end();
    await closed;
    return {
      status: Number(responseHeaders[":status"]),
      headers: clean(responseHeaders),
      trailers: trailers && clean(trailers),
      body: Buffer.concat(chunks),
    };
  } finally {
    session.destroy();
  }
}

function clean(h: http2.IncomingHttpHeaders): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(h))
    if (k !== "date" && v !== undefined) out[k] = Array.isArray(v) ? v.join(", ") : String(v);
  return out;
}

interface Side {
  name: string;
  queue: MemoryQueue;
  logs: JobLogStore;
  runner: RunnerService;
  server: RunnerServer;
}

async function startSide(fastPath: boolean): Promise<Side> {
  const queue = createMemoryQueue();
  const logs = createMemoryLogStore();
  const runner = createRunnerService(queue, { logs, limits: { messageBytes: 2048, idleMs: 5000 } });
  const server = await startRunnerServer(runner, { port: 0, fastPath });
  return { name: fastPath ? "fast path" : "connect path", queue, logs, runner, server };
}

/** Runs the same scenario on both sides and returns both outcomes. */
async function both<T>(sides: Side[], scenario: (side: Side) => Promise<T>): Promise<T[]> {
  const out: T[] = [];
  for (const side of sides) out.push(await scenario(side));
  return out;
}

describe("runner gRPC fast path vs connect path: same scenario, same answer", () => {
  let sides: Side[];
  beforeAll(async () => {
    sides = [await startSide(true), await startSide(false)];
  });
  afterAll(async () => {
    for (const s of sides) {
      await s.server.close();
      await s.runner.close();
    }
  });

  it("frames split across DATA frames at odd places: every item stored once, same response on both paths", async () => {
    const results = await both(sides, async (side) => {
      const id = randomUUID();
      const body = Buffer.concat([
        ...Array.from({ length: 20 }, (_, i) => frame(line(id, `line ${i} ${"é".repeat(i)}`, i % 3 === 0))),
        frame(end(id, 3, false)),
      ]);
      // Cut inside a prefix, inside a message, and one byte at a time for a stretch.
      const cuts = [2, 3, 9, 40, 41, 42, 43, 44, 45, 120, body.length - 1];
      const steps: Buffer[] = [];
      let at = 0;
      for (const cut of cuts) {
        steps.push(body.subarray(at, cut));
        at = cut;
      }
      steps.push(body.subarray(at));
      const wire = await rawCall(side.server.url, steps);
      const stored = (await side.logs.read(id)).map((l) => `${l.stderr ? "E" : "O"}:${l.line}`);
      return { wire, stored, result: side.queue.results.find((r) => r.requestId === id) };
    });
    const [fast, slow] = results;
    expect(fast!.wire.trailers).toMatchObject({ "grpc-status": "0", "runner-committed": "21" });
    expect(fast!.wire.body).toEqual(Buffer.from([0, 0, 0, 0, 2, 0x08, 0x01])); // Ack { ok: true }
    expect(fast!.stored).toHaveLength(20);
    expect(fast!.stored[4]).toBe(`O:line 4 ${"é".repeat(4)}`);
    expect(fast!.result).toMatchObject({
      outcome: "finished",
      exitCode: 3,
      success: false,
      lines: { stdout: 13, stderr: 7 },
    });
    expect(fast!.wire).toEqual(slow!.wire);
    expect(fast!.stored).toEqual(slow!.stored);
  });

  it("trailers carry grpc-status and runner-committed exactly once; the headers carry neither", async () => {
    for (const scenario of ["ok", "error"] as const) {
      const [fast, slow] = await both(sides, async (side) => {
        const id = randomUUID();
        const items = scenario === "ok" ? [line(id, "a")] : [line(id, "a"), end(id), line(id, "after end")];
        return rawCall(side.server.url, [Buffer.concat(items.map((i) => frame(i)))]);
      });
      expect(fast!.headers).toEqual({ ":status": "200", "content-type": "application/grpc+proto" });
      expect(fast!.headers["grpc-status"]).toBeUndefined();
      expect(fast!.trailers!["runner-committed"]).toBe(scenario === "ok" ? "1" : "2");
      expect(fast!.trailers!["grpc-status"]).toBe(scenario === "ok" ? "0" : "3");
      expect(fast).toEqual(slow);
    }
  });

  it("a client that accepts compressed responses (grpc-accept-encoding, as connect-node's and grpc-js's clients send) gets the same negotiated grpc-encoding on both paths", async () => {
    for (const accept of ["gzip", "br, gzip", "identity, deflate, gzip"]) {
      const [fast, slow] = await both(sides, (side) =>
        rawCall(side.server.url, [frame(line(randomUUID(), "a"))], { "grpc-accept-encoding": accept }),
      );
      expect(fast!.headers, accept).toEqual({
        ":status": "200",
        "content-type": "application/grpc+proto",
        // Requests and responses are gzip only (issue 31, item 7: no brotli requests).
        "grpc-encoding": "gzip",
      });
      expect(fast!.trailers, accept).toMatchObject({ "grpc-status": "0", "runner-committed": "1" });
      expect(fast, accept).toEqual(slow);
    }
  });

  it("errors carry runner-committed (gap, mixed IDs, empty item, item after end) and are the same on both paths", async () => {
    const scenarios: Array<{
      name: string;
      build: (id: string) => { items: LogItem[]; offset?: number };
      status: string;
      committed: string;
    }> = [
      { name: "gap", build: (id) => ({ items: [line(id, "x")], offset: 5 }), status: "9", committed: "1" },
      {
        name: "mixed",
        build: (id) => ({ items: [line(id, "x"), line(randomUUID(), "y")] }),
        status: "3",
        committed: "2",
      },
      {
        name: "empty",
        build: (id) => ({ items: [line(id, "x"), create(LogItemSchema, { requestId: id })] }),
        status: "3",
        committed: "2",
      },
      { name: "after end", build: (id) => ({ items: [end(id), line(id, "late")] }), status: "3", committed: "2" },
    ];
    for (const s of scenarios) {
      const [fast, slow] = await both(sides, async (side) => {
        const id = randomUUID();
        // One stored item first, so the job is known and committed says 1 before the call.
        await rawCall(side.server.url, [frame(line(id, "first"))]);
        const { items, offset } = s.build(id);
        const wire = await rawCall(side.server.url, [Buffer.concat(items.map((i) => frame(i)))], {
          "runner-offset": String(offset ?? 1),
        });
        return { wire, stored: (await side.logs.read(id)).map((l) => l.line) };
      });
      expect(fast!.wire.trailers, s.name).toMatchObject({ "grpc-status": s.status, "runner-committed": s.committed });
      expect(fast!.wire.trailers!["grpc-message"], s.name).toBeTruthy();
      expect(fast, s.name).toEqual(slow);
    }
  });

  it("a frame over the wire limit: RESOURCE_EXHAUSTED, items stored before it kept, committed exact, same on both paths", async () => {
    // Far over the limit: the old wire limit of 2 × messageBytes + 64 KiB.
    const limit = 2 * 2048 + 64 * 1024;
    const [fast, slow] = await both(sides, async (side) => {
      const id = randomUUID();
      const huge = Buffer.alloc(5);
      huge.writeUInt32BE(limit + 1, 1);
      // Only the prefix of the huge frame is sent: the server must refuse it without waiting for the rest.
      const wire = await rawCall(side.server.url, [
        Buffer.concat([frame(line(id, "a")), frame(line(id, "b"))]),
        { waitFor: async () => (await side.logs.get(id))?.committed === 2 },
        huge,
      ]);
      return { wire, stored: (await side.logs.read(id)).map((l) => l.line) };
    });
    expect(fast!.wire.trailers).toMatchObject({ "grpc-status": "8", "runner-committed": "2" });
    expect(fast!.stored).toEqual(["a", "b"]);
    expect(fast).toEqual(slow);
  });

  it("a message over messageBytes but within the wire limit: RESOURCE_EXHAUSTED after the items before it (even in the same DATA frame)", async () => {
    const [fast, slow] = await both(sides, async (side) => {
      const id = randomUUID();
      const wire = await rawCall(side.server.url, [
        Buffer.concat([
          frame(line(id, "a")),
          frame(line(id, "b")),
          frame(line(id, "z".repeat(3000))),
          frame(line(id, "c")),
        ]),
      ]);
      return { wire, stored: (await side.logs.read(id)).map((l) => l.line) };
    });
    expect(fast!.wire.trailers).toMatchObject({ "grpc-status": "8", "runner-committed": "2" });
    expect(decodeURIComponent(fast!.wire.trailers!["grpc-message"]!)).toContain("over the 2048-byte limit");
    expect(fast!.stored).toEqual(["a", "b"]);
    expect(fast).toEqual(slow);
  });

  it("a stream that ends inside a frame, a compressed-flag frame without grpc-encoding, invalid UTF-8: INVALID_ARGUMENT with committed", async () => {
    const cases: Array<{ name: string; tail: (id: string) => Buffer; status: string }> = [
      { name: "incomplete", tail: (id) => frame(line(id, "cut")).subarray(0, 9), status: "3" },
      { name: "compressed flag", tail: (id) => frame(line(id, "zipped?"), 1), status: "3" },
      {
        name: "invalid utf-8",
        tail: () => Buffer.from([0, 0, 0, 0, 6, 0x12, 0x04, 0x0a, 0x02, 0xff, 0x41]),
        status: "3",
      },
    ];
    for (const c of cases) {
      const [fast, slow] = await both(sides, async (side) => {
        const id = randomUUID();
        const wire = await rawCall(side.server.url, [
          frame(line(id, "kept")),
          { waitFor: async () => (await side.logs.get(id))?.committed === 1 },
          c.tail(id),
        ]);
        return { wire, stored: (await side.logs.read(id)).map((l) => l.line) };
      });
      expect(fast!.wire.trailers, c.name).toMatchObject({ "grpc-status": c.status, "runner-committed": "1" });
      expect(fast!.stored, c.name).toEqual(["kept"]);
      expect(fast, c.name).toEqual(slow);
    }
  });

  it("zero items: ok, no runner-committed; cancelled job: ok=false with runner-reason; both paths alike", async () => {
    const [fastZero, slowZero] = await both(sides, (side) => rawCall(side.server.url, []));
    expect(fastZero!.trailers).toEqual({ "grpc-status": "0", "runner-accepts": "runs" });
    expect(fastZero).toEqual(slowZero);
    const [fast, slow] = await both(sides, async (side) => {
      const id = randomUUID();
      await rawCall(side.server.url, [frame(line(id, "a"))]);
      await side.runner.cancelJob(id);
      return rawCall(side.server.url, [frame(line(id, "b"))], { "runner-offset": "1" });
    });
    expect(fast!.trailers).toMatchObject({ "grpc-status": "0", "runner-committed": "1", "runner-reason": "cancelled" });
    expect(fast!.body).toEqual(Buffer.from([0, 0, 0, 0, 0])); // Ack { ok: false }
    expect(fast).toEqual(slow);
  });

  it("a newer call of the same job: the older one ends ABORTED with committed and its stream is reset; both paths alike", async () => {
    const outcomes = await both(sides, async (side) => {
      const id = randomUUID();
      const session = http2.connect(side.server.url);
      session.on("error", () => undefined);
      const older = session.request({
        ":method": "POST",
        ":path": PATH,
        "content-type": "application/grpc",
        te: "trailers",
      });
      older.on("error", () => undefined);
      let trailers: http2.IncomingHttpHeaders | null = null;
      older.on("trailers", (t) => (trailers = t));
      const closed = new Promise<number>((resolve) => older.once("close", () => resolve(older.rstCode ?? -1)));
      older.write(frame(line(id, "old")));
      await until(async () => (await side.logs.get(id))?.committed === 1, "older call stored");
      const newer = await rawCall(side.server.url, [frame(line(id, "new"))], { "runner-offset": "1" });
      const rst = await closed;
      session.destroy();
      return {
        trailers: clean(trailers ?? {}),
        rst,
        newer: newer.trailers,
        stored: (await side.logs.read(id)).map((l) => l.line),
      };
    });
    const [fast, slow] = outcomes;
    expect(fast!.trailers).toMatchObject({ "grpc-status": "10", "runner-committed": "1" });
    expect(fast!.rst).toBe(http2.constants.NGHTTP2_NO_ERROR);
    expect(fast!.newer).toMatchObject({ "grpc-status": "0", "runner-committed": "2" });
    expect(fast!.stored).toEqual(["old", "new"]);
    expect(fast).toEqual(slow);
  });

  it("real clients: connect gRPC (plain and gzip-compressed), Connect protocol and gRPC-web all work on the fast-path server", async () => {
    const side = sides[0]!;
    const transports = {
      grpc: createGrpcTransport({ baseUrl: side.server.url }),
      gzip: createGrpcTransport({ baseUrl: side.server.url, sendCompression: compressionGzip }),
      connect: createConnectTransport({ baseUrl: side.server.url, httpVersion: "2" }),
      grpcWeb: createGrpcWebTransport({ baseUrl: side.server.url, httpVersion: "2" }),
    };
    for (const [name, transport] of Object.entries(transports)) {
      const id = randomUUID();
      const out = await send(createClient(Runner, transport), [
        line(id, `via ${name}`),
        line(id, "x".repeat(5000).slice(0, 1500)),
        end(id),
      ]);
      expect(out, name).toMatchObject({ ok: true, committed: "3" });
      expect((await side.logs.read(id))[0]!.line).toBe(`via ${name}`);
    }
  });
});

describe("runner gRPC fast path: the raw-stream entry and the request entry", () => {
  /** A host's own HTTP/2 server mounting createRunnerHandler by its 'request' or its 'stream' entry. */
  async function hostServer(entry: "request" | "stream") {
    const queue = createMemoryQueue();
    const logs = createMemoryLogStore();
    const runner = createRunnerService(queue, { logs, limits: { messageBytes: 2048, idleMs: 5000 } });
    const runnerHandler = createRunnerHandler(runner);
    const server = http2.createServer();
    if (entry === "request") server.on("request", runnerHandler.handler);
    else server.on("stream", runnerHandler.stream);
    const sessions = new Set<http2.ServerHttp2Session>();
    server.on("session", (session) => sessions.add(session));
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    return {
      runner,
      logs,
      runnerHandler,
      url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
      async close() {
        await runnerHandler.shutdown(0);
        for (const session of sessions) session.destroy();
        await new Promise((resolve) => server.close(resolve));
        await runner.close();
      },
    };
  }

  it("the same wire on both entries (ok, an error after stored items, an ended job answered while the client still sends), the Connect protocol still served, no call left in flight", async () => {
    const hosts = [await hostServer("request"), await hostServer("stream")];
    try {
      const wires = [];
      for (const host of hosts) {
        const id = randomUUID();
        const ok = await rawCall(host.url, [frame(line(id, "a")), frame(line(id, "b")), frame(end(id))]);
        const error = await rawCall(host.url, [
          Buffer.concat([frame(line(randomUUID(), "a")), frame(line(randomUUID(), "other job"))]),
        ]);
        // The call ends (item after the end) while the client keeps its side open: trailers, then the reset.
        const early = await rawCall(
          host.url,
          [frame(line(id, "x")), { waitFor: async () => host.runnerHandler.activeRequests === 0 }],
          { "runner-offset": "3" },
        );
        expect((await host.logs.read(id)).map((l) => l.line)).toEqual(["a", "b"]);
        // Connect protocol (connect-node's path) and health on the same listener.
        const connectId = randomUUID();
        const out = await send(createClient(Runner, createConnectTransport({ baseUrl: host.url, httpVersion: "2" })), [
          line(connectId, "via connect"),
          end(connectId),
        ]);
        expect(out).toMatchObject({ ok: true, committed: "2" });
        await until(async () => host.runnerHandler.activeRequests === 0, "no call in flight");
        wires.push({ ok, error, early });
      }
      const [viaRequest, viaStream] = wires;
      expect(viaStream!.ok.trailers).toMatchObject({ "grpc-status": "0", "runner-committed": "3" });
      expect(viaStream!.error.trailers!["grpc-status"]).toBe("3");
      expect(viaStream!.early.trailers).toMatchObject({
        "grpc-status": "0",
        "runner-committed": "3",
        "runner-reason": "ended",
      });
      expect(viaStream).toEqual(viaRequest);
    } finally {
      for (const host of hosts) await host.close();
    }
  });
  it("a StreamLogs call with an expect header: 100 Continue before the answer (100-continue), 417 for any other, on both entries", async () => {
    const hosts = [await hostServer("request"), await hostServer("stream")];
    try {
      const seen = [];
      for (const host of hosts) {
        const outcomes: Record<string, unknown> = {};
        for (const expectation of ["100-continue", "something-else"]) {
          const session = http2.connect(host.url);
          session.on("error", () => undefined);
          try {
            const events: string[] = [];
            const req = session.request({
              ":method": "POST",
              ":path": PATH,
              "content-type": "application/grpc",
              te: "trailers",
              expect: expectation,
            });
            req.on("error", () => undefined);
            req.on("continue", () => events.push("continue"));
            req.on("response", (h) => events.push(`status ${h[":status"]}`));
            req.on("trailers", (t) => events.push(`grpc-status ${t["grpc-status"]}`));
            req.resume();
            const closed = new Promise<void>((resolve) => req.once("close", resolve));
            // A client that waits for 100 Continue before its body, as the header says.
            await until(async () => events.length > 0, "the server's first answer");
            if (!req.closed && !req.destroyed) req.end(frame(line(randomUUID(), "after continue")));
            await closed;
            outcomes[expectation] = events;
          } finally {
            session.destroy();
          }
        }
        seen.push(outcomes);
      }
      const [viaRequest, viaStream] = seen;
      expect(viaStream).toEqual({
        "100-continue": ["continue", "status 200", "grpc-status 0"],
        "something-else": ["status 417"],
      });
      expect(viaStream).toEqual(viaRequest);
    } finally {
      for (const host of hosts) await host.close();
    }
  });
  it("a client that never lets the answer out (a zero stream window) does not keep its streams: they are cancelled soon after the answer, on both entries", async () => {
    const hosts = [await hostServer("request"), await hostServer("stream")];
    try {
      const outcomes = await Promise.all(
        hosts.map(async (host) => {
          // No valid token needed: a call with zero items is answered ok with an Ack (DATA),
          // which a window of 0 never lets leave; the trailers wait behind it.
          const session = http2.connect(host.url, { settings: { initialWindowSize: 0 } });
          session.on("error", () => undefined);
          try {
            const streams = Array.from({ length: 5 }, () => {
              const req = session.request(
                {
                  ":method": "POST",
                  ":path": PATH,
                  "content-type": "application/grpc",
                  te: "trailers",
                  authorization: "Bearer made-up",
                },
                { endStream: true },
              );
              req.on("error", () => undefined);
              return new Promise<number>((resolve) => req.once("close", () => resolve(req.rstCode ?? -1)));
            });
            const codes = await Promise.race([
              Promise.all(streams),
              new Promise<null>((resolve) => setTimeout(resolve, 30_000, null)),
            ]);
            await until(async () => host.runnerHandler.activeRequests === 0, "no call in flight");
            return codes;
          } finally {
            session.destroy();
          }
        }),
      );
      for (const codes of outcomes) expect(codes).toEqual(Array(5).fill(http2.constants.NGHTTP2_CANCEL));
    } finally {
      for (const host of hosts) await host.close();
    }
  }, 60_000);
});

describe("runner gRPC fast path: routing and back-pressure", () => {
  it("takes plain gRPC StreamLogs calls and leaves compressed, Connect, gRPC-web, deadline and other paths to connect", async () => {
    const queue = createMemoryQueue();
    const runner = createRunnerService(queue);
    const connectOnly = createRunnerHandler(runner, { fastPath: false });
    const shutdown = new AbortController();
    const fast = createStreamLogsFastPath(runner, {
      messageBytes: runner.limits.messageBytes,
      budget: createReadBudget(),
      contextValues: () => createContextValues().set(kShutdownSignal, shutdown.signal).set(kMessageBytes, undefined),
    });
    const taken: Array<[string, boolean]> = [];
    const server = http2.createServer((req, res) => {
      const took = fast.request(req, res);
      taken.push([
        `${req.headers["content-type"]} ${req.headers["grpc-encoding"] ?? ""} ${req.headers["grpc-timeout"] ?? ""}`.trim(),
        took,
      ]);
      if (!took) connectOnly.handler(req, res);
    });
    const sessions = new Set<http2.ServerHttp2Session>();
    server.on("session", (session) => sessions.add(session));
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    try {
      const cases = [
        { name: "grpc", transport: createGrpcTransport({ baseUrl: url }), fast: true },
        {
          name: "grpc gzip",
          transport: createGrpcTransport({ baseUrl: url, sendCompression: compressionGzip }),
          fast: false,
        },
        { name: "connect", transport: createConnectTransport({ baseUrl: url, httpVersion: "2" }), fast: false },
        { name: "grpc-web", transport: createGrpcWebTransport({ baseUrl: url, httpVersion: "2" }), fast: false },
      ];
      for (const c of cases) {
        const id = randomUUID();
        taken.length = 0;
        const out = await send(createClient(Runner, c.transport), [line(id, c.name), end(id)]);
        expect(out, c.name).toMatchObject({ ok: true, committed: "2" });
        expect(
          taken.map(([, t]) => t),
          c.name,
        ).toEqual([c.fast]);
      }
      // A call with a deadline (grpc-timeout) goes to connect, which turns it into a deadline.
      taken.length = 0;
      const id = randomUUID();
      const out = await send(createClient(Runner, createGrpcTransport({ baseUrl: url, defaultTimeoutMs: 30_000 })), [
        line(id, "deadline"),
        end(id),
      ]);
      expect(out).toMatchObject({ ok: true, committed: "2" });
      expect(taken).toEqual([[expect.stringContaining("application/grpc"), false]]);
      // A raw request with plain application/grpc takes the fast path; another path does not.
      taken.length = 0;
      const raw = await rawCall(url, [frame(line(randomUUID(), "raw"))]);
      expect(raw.trailers).toMatchObject({ "grpc-status": "0", "runner-committed": "1" });
      expect(taken).toEqual([["application/grpc", true]]);
    } finally {
      const serverClosed = new Promise<void>((resolve) => server.close(() => resolve()));
      for (const session of sessions) session.destroy();
      await serverClosed;
      await runner.close();
    }
  });

  it("a store slower than the runner: the request is paused (flow control) and every item is stored once when it catches up", async () => {
    const queue = createMemoryQueue();
    const inner = createMemoryLogStore();
    let gate: Promise<void> | null = null;
    let open!: () => void;
    gate = new Promise<void>((resolve) => (open = resolve));
    let appends = 0;
    const logs: JobLogStore = {
      ...inner,
      async append(requestId, at, entries, now) {
        appends++;
        if (gate) await gate;
        return inner.append(requestId, at, entries, now);
      },
    };
    const runner = createRunnerService(queue, { logs });
    const server = await startRunnerServer(runner, { port: 0 });
    try {
      const id = randomUUID();
      const n = 60_000;
      const frames: Buffer[] = [];
      for (let i = 0; i < n; i++) frames.push(frame(line(id, `line ${i} ${"x".repeat(60)}`, i % 7 === 0)));
      frames.push(frame(end(id)));
      const body = Buffer.concat(frames);
      const session = http2.connect(server.url);
      session.on("error", () => undefined);
      const req = session.request({
        ":method": "POST",
        ":path": PATH,
        "content-type": "application/grpc",
        te: "trailers",
      });
      let trailers: http2.IncomingHttpHeaders | null = null;
      req.on("trailers", (t) => (trailers = t));
      req.on("data", () => undefined);
      const closed = new Promise<void>((resolve) => req.once("close", resolve));
      let wroteAll = false;
      req.end(body, () => (wroteAll = true));
      // The first batch is held in the store; the runner cannot push the whole body through.
      await until(() => appends >= 1, "first append");
      await new Promise((r) => setTimeout(r, 300));
      expect(wroteAll).toBe(false);
      gate = null;
      open();
      await closed;
      session.destroy();
      expect(clean(trailers ?? {})).toMatchObject({ "grpc-status": "0", "runner-committed": String(n + 1) });
      const stored = await inner.read(id);
      expect(stored).toHaveLength(n);
      expect(stored[12_345]!.line).toBe(`line 12345 ${"x".repeat(60)}`);
      expect(queue.results.find((r) => r.requestId === id)).toMatchObject({
        lines: { stdout: n - Math.ceil(n / 7), stderr: Math.ceil(n / 7) },
      });
    } finally {
      await server.close();
      await runner.close();
    }
  });
});

describe("runner gRPC fast path: lines kept as bytes from the frame to the log store", () => {
  it.each(["memory", "fs", "pg"] as const)(
    "%s store: every line reads back as sent (non-ASCII, a literal U+FFFD, JSON escapes, empty, across the memory store's blocks); an over-long one is cut with its marker; onLog and follow() get plain objects",
    async (kind) => {
      if (kind === "pg" && !needs("postgres")) return;
      const queue = createMemoryQueue();
      const dir = kind === "fs" ? await mkdtemp(path.join(os.tmpdir(), "rd-fastpath-bytes-")) : "";
      const db = kind === "pg" ? await createTestSchema() : null;
      const logs =
        kind === "fs"
          ? createFsLogStore(dir)
          : db !== null
            ? createPostgresLogStore({ pool: db.pool, schema: db.schema })
            : createMemoryLogStore();
      const hooked: unknown[] = [];
      const runner = createRunnerService(queue, {
        logs,
        limits: { lineBytes: 1000 },
        onLog: (e) => hooked.push(...e.lines),
      });
      const server = await startRunnerServer(runner, { port: 0 });
      try {
        const id = randomUUID();
        const texts = Array.from({ length: 3000 }, (_, i) =>
          i % 7 === 0
            ? ""
            : i % 7 === 1
              ? `é€😀 ${i}`
              : i % 7 === 2
                ? `a\ufffdb ${i}`
                : i % 7 === 3
                  ? `say "hi" \\ tab\there \u0001 \u007f ${i}`
                  : `${"x".repeat(i % 900)} ${i}`,
        );
        texts[1500] = "y".repeat(1500); // over the 1,000-byte line limit
        const followed: unknown[] = [];
        const stop = new AbortController();
        const following = (async () => {
          for await (const l of runner.follow(id, { signal: stop.signal })) followed.push(l);
        })().catch(() => undefined);
        // Every item carries its agent time (a µs apart): the fast path decodes it, every store keeps it.
        // Canonical times (an integer count of µs ÷ 1000), as every store gives them back.
        const t0us = Date.parse("2026-11-29T09:00:00Z") * 1000 + 1;
        const at = (i: number) => (t0us + i) / 1000;
        const body = Buffer.concat([
          ...texts.map((t, i) => frame(line(id, t, i % 5 === 0, at(i)))),
          frame(end(id, 0, true)),
        ]);
        // 64 KiB writes: lines cut across DATA frames and request chunks, as a client sends them.
        const steps: Buffer[] = [];
        for (let at = 0; at < body.length; at += 65_536) steps.push(body.subarray(at, at + 65_536));
        const wire = await rawCall(server.url, steps);
        expect(wire.trailers).toMatchObject({ "grpc-status": "0", "runner-committed": String(texts.length + 1) });

        const expected = texts.flatMap((t, i) =>
          i === 1500
            ? [
                { line: "y".repeat(1000), stderr: true, time: at(i) },
                {
                  line: "[runner-depot] line truncated: 1500 bytes, kept 1000",
                  stderr: true,
                  marker: true,
                  time: at(i),
                },
              ]
            : [{ line: t, stderr: i % 5 === 0, time: at(i) }],
        );
        expect(await logs.read(id)).toEqual(expected);
        if (kind === "fs") {
          // A second store on the directory reads the file itself: the records are the format's.
          const reopened = createFsLogStore(dir);
          expect(await reopened.read(id, 0, 50)).toEqual(expected.slice(0, 50));
        }
        // A window in the middle reads the same lines (the store finds the block holding `from`).
        expect(await logs.read(id, 2345, 10)).toEqual(expected.slice(2345, 2355));
        expect(hooked).toEqual(expected);
        await until(() => followed.length === expected.length, "the follower's lines");
        expect(followed).toEqual(expected);
        // Plain objects: nothing handed out is a view of a request buffer.
        for (const l of [...hooked, ...followed]) expect(Object.getPrototypeOf(l)).toBe(Object.prototype);
        stop.abort();
        await following;
      } finally {
        await server.close();
        await runner.close();
        if (dir) await rm(dir, { recursive: true, force: true });
        if (db !== null) {
          await logs.close?.();
          await db.drop();
        }
      }
    },
    60_000,
  );
});

describe("runner server: HTTP/2 windows of a busy connection", () => {
  /** Sends `lines` 100-byte lines and the end in one call on a fresh connection; returns what the server announced. */
  async function oneCall(url: string, lines: number, idleStreams = 0) {
    const session = http2.connect(url);
    session.on("error", () => undefined);
    const announced: number[] = [];
    const streamLimits: number[] = [];
    session.on("remoteSettings", (s) => {
      announced.push(s.initialWindowSize ?? 65_535);
      if (s.maxConcurrentStreams !== undefined) streamLimits.push(s.maxConcurrentStreams);
    });
    try {
      // Other calls open on the same connection, sending nothing yet (as calls waiting for
      // a slow authorize hook would hold their bytes).
      for (let i = 0; i < idleStreams; i++) {
        const idle = session.request({
          ":method": "POST",
          ":path": PATH,
          "content-type": "application/grpc",
          te: "trailers",
        });
        idle.on("error", () => undefined);
      }
      const id = randomUUID();
      const req = session.request({
        ":method": "POST",
        ":path": PATH,
        "content-type": "application/grpc",
        te: "trailers",
      });
      req.on("error", () => undefined);
      let trailers: http2.IncomingHttpHeaders | null = null;
      req.on("trailers", (t) => (trailers = t));
      req.resume();
      const closed = new Promise<void>((resolve) => req.once("close", resolve));
      const body = Buffer.concat([
        ...Array.from({ length: lines }, (_, i) => frame(line(id, `${"x".repeat(90)} ${i}`))),
        frame(end(id)),
      ]);
      for (let at = 0; at < body.length; at += 65_536) {
        if (!req.write(body.subarray(at, at + 65_536))) await new Promise((r) => req.once("drain", r));
      }
      req.end();
      await closed;
      // The server's SETTINGS reach the client asynchronously: give a widening a moment to arrive.
      await until(() => announced.length > 0, "the server's settings");
      if (lines > 0) await new Promise((r) => setTimeout(r, 100));
      return {
        trailers: trailers as http2.IncomingHttpHeaders | null,
        window: announced[announced.length - 1]!,
        streamLimit: streamLimits[streamLimits.length - 1],
        remoteWindow: session.state.remoteWindowSize ?? 0,
      };
    } finally {
      session.destroy();
    }
  }

  it("a call that has received 512 KiB gets 1 MiB windows (stream and connection); a quiet call keeps 64 KiB", async () => {
    const runner = createRunnerService(createMemoryQueue(), { logs: createMemoryLogStore() });
    const server = await startRunnerServer(runner, { port: 0 });
    try {
      const quiet = await oneCall(server.url, 100); // ~14 KiB
      expect(quiet.trailers).toMatchObject({ "grpc-status": "0", "runner-committed": "101" });
      expect(quiet.window).toBe(65_535);
      const busy = await oneCall(server.url, 6000); // ~850 KiB
      expect(busy.trailers).toMatchObject({ "grpc-status": "0", "runner-committed": "6001" });
      expect(busy.window).toBe(1024 * 1024);
      // The connection's window was widened too (what the client may send before an update).
      expect(busy.remoteWindow).toBeGreaterThan(65_535);
      // And its stream limit came down with it: no more streams may join the wide windows.
      expect(quiet.streamLimit).toBe(1000);
      expect(busy.streamLimit).toBe(16);
    } finally {
      await server.close();
      await runner.close();
    }
  }, 60_000);

  it("a busy call on a connection with more than 16 open streams does not widen it (1 MiB in each would be pinnable)", async () => {
    const runner = createRunnerService(createMemoryQueue(), { logs: createMemoryLogStore() });
    const server = await startRunnerServer(runner, { port: 0 });
    try {
      const crowded = await oneCall(server.url, 6000, 20); // ~850 KiB beside 20 open calls
      expect(crowded.trailers).toMatchObject({ "grpc-status": "0", "runner-committed": "6001" });
      expect(crowded.window).toBe(65_535);
      expect(crowded.streamLimit).toBe(1000);
      // With 15 others open (16 in all), the same call widens.
      const few = await oneCall(server.url, 6000, 15);
      expect(few.trailers).toMatchObject({ "grpc-status": "0", "runner-committed": "6001" });
      expect(few.window).toBe(1024 * 1024);
      expect(few.streamLimit).toBe(16);
    } finally {
      await server.close();
      await runner.close();
    }
  }, 60_000);

  it("a Health call (no credential) that receives 512 KiB does not widen its connection's windows", async () => {
    // A secret: StreamLogs calls need a token; Health calls are read on without one.
    const runner = createRunnerService(createMemoryQueue(), {
      logs: createMemoryLogStore(),
      secret: "windows-secret-0123456789abcdef0123",
    });
    const server = await startRunnerServer(runner, { port: 0 });
    const session = http2.connect(server.url);
    session.on("error", () => undefined);
    const announced: number[] = [];
    session.on("remoteSettings", (s) => announced.push(s.initialWindowSize ?? 65_535));
    try {
      const req = session.request({
        ":method": "POST",
        ":path": "/grpc.health.v1.Health/Check",
        "content-type": "application/grpc",
        te: "trailers",
      });
      req.on("error", () => undefined);
      let trailers: http2.IncomingHttpHeaders | null = null;
      req.on("trailers", (t) => (trailers = t));
      req.resume();
      const closed = new Promise<void>((resolve) => req.once("close", resolve));
      // An empty HealthCheckRequest, then a 600 KB one (service = 600,000 - 4 bytes of 'a'):
      // every byte is received before the call can fail on the extra message.
      const big = Buffer.concat([Buffer.from([0x0a, 0xbc, 0xcf, 0x24]), Buffer.alloc(599_996, 0x61)]);
      const prefix = (n: number) => Buffer.from([0, (n >>> 24) & 255, (n >>> 16) & 255, (n >>> 8) & 255, n & 255]);
      const body = Buffer.concat([prefix(0), prefix(big.length), big]);
      for (let at = 0; at < body.length; at += 65_536) {
        if (!req.write(body.subarray(at, at + 65_536))) await new Promise((r) => req.once("drain", r));
      }
      await closed;
      expect(trailers).toMatchObject({ "grpc-status": "12" }); // extra input message for a unary method
      // SETTINGS the server sent before its trailers arrived before them; a ping round trip
      // makes sure every frame sent so far has been read.
      await new Promise<void>((resolve, reject) => session.ping((error) => (error ? reject(error) : resolve())));
      expect(announced.length).toBeGreaterThan(0);
      expect(announced.every((w) => w === 65_535)).toBe(true);
    } finally {
      session.destroy();
      await server.close();
      await runner.close();
    }
  }, 60_000);
});

describe("runner gRPC fast path: the call's signal", () => {
  it("aborts when the call ends: an AbortError for calls that ended well, the failure for the others", async () => {
    const signals: AbortSignal[] = [];
    const runner = createRunnerService(createMemoryQueue(), {
      logs: createMemoryLogStore(),
      authorize: (ctx) => {
        signals.push(ctx.signal);
      },
    });
    const server = await startRunnerServer(runner, { port: 0 });
    const client = createClient(Runner, createGrpcTransport({ baseUrl: server.url }));
    try {
      const id = randomUUID();
      expect(await send(client, [line(id, "a")])).toMatchObject({ ok: true, committed: "1" });
      expect(await send(client, [line(id, "b")], { offset: 1 })).toMatchObject({ ok: true, committed: "2" });
      // A second request ID in the call: INVALID_ARGUMENT after the first item passed authorize.
      const failed = await send(client, [line(id, "c"), line(randomUUID(), "d")], { offset: 2 });
      expect(failed.code).toBe("InvalidArgument");
      await until(() => signals.length === 3 && signals.every((s) => s.aborted), "every call's signal aborted");
      for (const s of signals.slice(0, 2)) {
        expect(s.reason).toBeInstanceOf(DOMException);
        expect((s.reason as DOMException).name).toBe("AbortError");
      }
      expect((signals[2]!.reason as Error).message).toMatch(/same request_id/);
    } finally {
      await server.close();
      await runner.close();
    }
  });
});

describe("runner gRPC fast path: entries as a store reads them", () => {
  it("a store reading the port's fields (stored, stderr, bytes, capped) gets the same entries on both paths, a cut line and the cap included", async () => {
    const outcomes = [];
    for (const fastPath of [true, false]) {
      const inner = createMemoryLogStore();
      const seen: unknown[] = [];
      // A third-party store: it knows only the port's shape, not the fast path's classes.
      const logs: JobLogStore = {
        ...inner,
        async append(requestId, at, entries, now) {
          for (const e of entries)
            seen.push({
              stored: e.stored.map((l) => ({ line: l.line, stderr: l.stderr, marker: l.marker === true })),
              stderr: e.stderr,
              bytes: e.bytes,
              capped: e.capped === true,
            });
          return inner.append(requestId, at, entries, now);
        },
      };
      const runner = createRunnerService(createMemoryQueue(), {
        logs,
        // Each stored line counts 16 + its bytes (log-cap.ts): 21 + 19 + (24 + 71) + 19 = 154, then "12345678" crosses 170.
        limits: { messageBytes: 2048, lineBytes: 8, jobLogBytes: 170, tailBytes: 0, idleMs: 5000 },
      });
      const server = await startRunnerServer(runner, { port: 0, fastPath });
      try {
        const id = randomUUID();
        const texts = ["plain", "é!", "a line over eight bytes", "err", "12345678", "past the cap"];
        // Agent times, so both paths store the same times.
        const wire = await rawCall(server.url, [
          Buffer.concat([...texts.map((t, i) => frame(line(id, t, i === 3, 1_000 + i))), frame(end(id))]),
        ]);
        outcomes.push({ wire, seen, read: await logs.read(id) });
      } finally {
        await server.close();
        await runner.close();
      }
    }
    const [fast, slow] = outcomes;
    expect(fast!.wire.trailers).toMatchObject({ "grpc-status": "0", "runner-committed": "7" });
    expect(fast!.seen).toHaveLength(6);
    expect(fast!.seen[0]).toEqual({
      stored: [{ line: "plain", stderr: false, marker: false }],
      stderr: false,
      bytes: LINE_RECORD_OVERHEAD + 5,
      capped: false,
    });
    expect(fast!.seen[3]).toEqual({
      stored: [{ line: "err", stderr: true, marker: false }],
      stderr: true,
      bytes: LINE_RECORD_OVERHEAD + 3,
      capped: false,
    });
    expect((fast!.seen[2] as { stored: unknown[] }).stored).toHaveLength(2);
    expect(fast!.seen.some((e) => (e as { capped: boolean }).capped)).toBe(true);
    expect(fast!.seen).toEqual(slow!.seen);
    expect(fast!.read).toEqual(slow!.read);
  });

  /** Serves `logs` on the fast path, sends four lines (one on stderr) and the end, checks all four are stored; returns their texts. */
  async function storesFourLines(logs: JobLogStore): Promise<string[]> {
    const runner = createRunnerService(createMemoryQueue(), { logs });
    const server = await startRunnerServer(runner, { port: 0 });
    try {
      const id = randomUUID();
      const texts = ["plain", "é!", "on stderr", "last"];
      const wire = await rawCall(server.url, [
        Buffer.concat([...texts.map((t, i) => frame(line(id, t, i === 2, 1_000 + i))), frame(end(id))]),
      ]);
      expect(wire.trailers).toMatchObject({ "grpc-status": "0", "runner-committed": "5" });
      expect(await logs.read(id)).toEqual(texts.map((t, i) => ({ line: t, stderr: i === 2, time: 1_000 + i })));
      return texts;
    } finally {
      await server.close();
      await runner.close();
    }
  }

  it("a store without the package's mark gets plain entries it may serialise: one made by spreading this package's store, whose append JSON-encodes its batch (a write-behind queue), stores every line", async () => {
    const inner = createMemoryLogStore();
    const logs: JobLogStore = {
      ...inner,
      async append(requestId, at, entries, now) {
        // Through JSON and back, as a store that queues its batches as text would.
        const decoded = JSON.parse(JSON.stringify(entries)) as LogEntry[];
        return inner.append(requestId, at, decoded, now);
      },
    };
    // Made by spreading this package's store (a common way to wrap one): its append is not the
    // marked one, so the mark must not come along (else it is handed lines as entries).
    await storesFourLines(logs);
  });

  it("a store without the package's mark that structuredClones its batch (or keeps its lines) gets plain lines: every line stored, no request buffer handed over", async () => {
    const inner = createMemoryLogStore();
    const handed: unknown[] = [];
    const logs: JobLogStore = {
      open: (id, opts) => inner.open(id, opts),
      get: (id) => inner.get(id),
      finish: (id, result, opts) => inner.finish(id, result, opts),
      read: (id, from, limit) => inner.read(id, from, limit),
      stale: (before) => inner.stale(before),
      async append(requestId, at, entries, now) {
        for (const entry of entries) handed.push(...entry.stored);
        // A clone keeps own data properties only: a getter on a class's prototype is lost.
        return inner.append(requestId, at, structuredClone(entries), now);
      },
    };
    const texts = await storesFourLines(logs);
    // What such a store may keep must not pin the request's chunk (a view of its buffer).
    expect(handed).toEqual(texts.map((t, i) => ({ line: t, stderr: i === 2, time: 1_000 + i })));
    expect(handed.every((l) => Object.getPrototypeOf(l) === Object.prototype)).toBe(true);
  });
});
