/**
 * gRPC health checking on the runner server, through another implementation:
 * @grpc/grpc-js with @grpc/proto-loader loading proto/grpc/health/v1/health.proto (the
 * standard grpc.health.v1 interface). SERVING while accepting, NOT_SERVING from the start
 * of a drain, via Check and Watch; and a drain that cuts a call past its grace time.
 */
import * as http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { randomUUID } from "node:crypto";
import { fileURLToPath } from "node:url";
import { Writable } from "node:stream";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { pino } from "pino";
import { afterEach, describe, expect, it } from "vitest";
import { createMemoryQueue } from "../../../src/adapters/memory/index.js";
import { createRunnerHandler, createRunnerService, startRunnerServer } from "../../../src/runner/index.js";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import { Health, HealthCheckResponse_ServingStatus } from "../../../src/gen/grpc/health/v1/health_pb.js";
import { controlledStream, line, send, startHarness, until, type Harness } from "../../fixtures/runner-service.js";

const protoPath = fileURLToPath(new URL("../../../proto/grpc/health/v1/health.proto", import.meta.url));
const definition = protoLoader.loadSync(protoPath, { keepCase: true, defaults: true, enums: String });
type HealthClient = grpc.Client & {
  Check(
    request: { service: string },
    callback: (error: grpc.ServiceError | null, response?: { status: string }) => void,
  ): void;
  Watch(request: { service: string }): grpc.ClientReadableStream<{ status: string }>;
};
const pkg = grpc.loadPackageDefinition(definition) as unknown as {
  grpc: { health: { v1: { Health: new (address: string, credentials: grpc.ChannelCredentials) => HealthClient } } };
};

function check(client: HealthClient, service = ""): Promise<string> {
  return new Promise((resolve, reject) =>
    client.Check({ service }, (error, response) => (error ? reject(error) : resolve(response!.status))),
  );
}

/** A Watch call whose statuses pile up in `seen`; `ended` resolves with its final gRPC code. */
function watch(client: HealthClient, service = "") {
  const seen: string[] = [];
  const call = client.Watch({ service });
  call.on("data", (message: { status: string }) => seen.push(message.status));
  const ended = new Promise<number>((resolve) => {
    call.on("status", (status: grpc.StatusObject) => resolve(status.code));
    call.on("error", () => undefined);
  });
  return { seen, ended, call };
}

let h: Harness | null = null;
let client: HealthClient | null = null;
afterEach(async () => {
  client?.close();
  client = null;
  await h?.close();
  h = null;
});

describe("gRPC health checking with grpc-js", () => {
  it("SERVING while accepting; NOT_SERVING via Check and Watch from the start of a drain", async () => {
    h = await startHarness({ memoryStore: true });
    client = new pkg.grpc.health.v1.Health(h.server.url.replace("http://", ""), grpc.credentials.createInsecure());
    expect(await check(client)).toBe("SERVING");
    expect(await check(client, "runner.v1.Runner")).toBe("SERVING");
    await expect(check(client, "no.such.Service")).rejects.toMatchObject({ code: grpc.status.NOT_FOUND });
    const watcher = watch(client);
    const unknown = watch(client, "no.such.Service");
    await until(() => watcher.seen.length === 1 && unknown.seen.length === 1, "the first Watch answers");
    expect(watcher.seen).toEqual(["SERVING"]);
    expect(unknown.seen).toEqual(["SERVICE_UNKNOWN"]);

    // The drain's not-serving time: the server still accepts, and says it is going away.
    const drained = h.server.drain({ notServingMs: 600_000, graceMs: 5_000 });
    await until(() => watcher.seen.length === 2, "the Watch update");
    expect(watcher.seen).toEqual(["SERVING", "NOT_SERVING"]);
    expect(await check(client)).toBe("NOT_SERVING");
    expect(await check(client, "runner.v1.Runner")).toBe("NOT_SERVING");
    expect(h.server.health?.status).toBe("NOT_SERVING");
    const id = randomUUID();
    expect(await send(h.client, [line(id, "still accepted")])).toMatchObject({ ok: true, committed: "1" });

    // close() ends the not-serving time at once; the Watch calls end with the server.
    await h.server.close();
    expect(await drained).toEqual({ inFlight: 0, cut: 0, cutRequestIds: [] });
    expect(await watcher.ended).toBe(grpc.status.OK);
    expect(await unknown.ended).toBe(grpc.status.OK);
    expect(unknown.seen).toEqual(["SERVICE_UNKNOWN"]);
  });

  it("a drain gives calls in flight the grace time, cuts the rest UNAVAILABLE, and names the cut ones by request ID", async () => {
    const lines: string[] = [];
    const logger = pino(
      { level: "info" },
      new Writable({
        write(chunk: Buffer, _e, done) {
          lines.push(chunk.toString("utf8"));
          done();
        },
      }),
    );
    h = await startHarness({ memoryStore: true, server: { logger } });
    client = new pkg.grpc.health.v1.Health(h.server.url.replace("http://", ""), grpc.credentials.createInsecure());
    const watcher = watch(client);
    await until(() => watcher.seen.length === 1, "the first Watch answer");
    const id = randomUUID();
    const stream = controlledStream();
    const pending = send(h.client, stream.items);
    stream.push(line(id, "a"));
    await until(async () => (await h!.logs.get(id))?.committed === 1, "the line stored");

    // A second call that finishes within the grace time is not named.
    const kept = randomUUID();
    const keptStream = controlledStream();
    const keptPending = send(h.client, keptStream.items);
    keptStream.push(line(kept, "k"));
    await until(async () => (await h!.logs.get(kept))?.committed === 1, "the kept line stored");

    const drained = h.server.drain({ graceMs: 5_000 });
    keptStream.close();
    expect(await keptPending).toMatchObject({ ok: true });
    const report = await drained;
    expect(report).toEqual({ inFlight: 2, cut: 1, cutRequestIds: [id] });
    expect(await pending).toMatchObject({ code: "Unavailable", committed: "1" });
    expect(watcher.seen).toEqual(["SERVING", "NOT_SERVING"]);
    expect(await watcher.ended).toBe(grpc.status.OK);
    const parsed = lines
      .join("")
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(parsed.find((l) => l.msg === "drain started")).toMatchObject({ level: 30, activeCalls: 2, notServingMs: 0 });
    expect(parsed.find((l) => l.msg === "drain finished")).toMatchObject({ inFlight: 2, cut: 1, cutRequestIds: [id] });
    stream.close();
  });

  it("serves health on a host's own HTTP/2 server through createRunnerHandler", async () => {
    const runner = createRunnerService(createMemoryQueue());
    const runnerHandler = createRunnerHandler(runner);
    const server = http2.createServer(runnerHandler.handler);
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const own = new pkg.grpc.health.v1.Health(
      `127.0.0.1:${(server.address() as AddressInfo).port}`,
      grpc.credentials.createInsecure(),
    );
    try {
      expect(await check(own)).toBe("SERVING");
      runnerHandler.health!.setStatus("NOT_SERVING");
      expect(await check(own)).toBe("NOT_SERVING");
      // Health calls are not calls in flight: they never hold a shutdown up.
      const watcher = watch(own);
      await until(() => watcher.seen.length === 1, "the Watch answer");
      expect(runnerHandler.activeRequests).toBe(0);
      expect(await runnerHandler.shutdown(10_000)).toEqual({ inFlight: 0, cut: 0, cutRequestIds: [] });
      expect(await watcher.ended).toBe(grpc.status.OK);
    } finally {
      own.close();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      await runner.close();
    }
  });
});

describe("gRPC health Watch slots per peer (issue 31, item 10)", () => {
  it("one address holds at most 10 Watch calls: the 11th ends RESOURCE_EXHAUSTED while the server has slots left; a freed slot is reusable", async () => {
    h = await startHarness({ memoryStore: true });
    client = new pkg.grpc.health.v1.Health(h.server.url.replace("http://", ""), grpc.credentials.createInsecure());
    const open = Array.from({ length: 10 }, () => watch(client!));
    await until(() => open.every((w) => w.seen.length === 1), "ten Watch calls answered");
    // Before: any 100 Watch calls from one anonymous client were served.
    const eleventh = watch(client);
    expect(await eleventh.ended).toBe(grpc.status.RESOURCE_EXHAUSTED);
    expect(h.server.health!.watchers).toBe(10);
    open[0]!.call.cancel();
    await until(() => h!.server.health!.watchers === 9, "the cancelled Watch left");
    const again = watch(client);
    await until(() => again.seen.length === 1, "a Watch in the freed slot");
    for (const w of [...open, again]) w.call.cancel();
  });
});

/** A raw Connect unary (JSON) Health Check stream on `session`, its errors ignored; the caller sends the body. */
function connectCheck(session: http2.ClientHttp2Session): http2.ClientHttp2Stream {
  const req = session.request({
    ":method": "POST",
    ":path": "/grpc.health.v1.Health/Check",
    "content-type": "application/json",
    "connect-protocol-version": "1",
  });
  req.on("error", () => undefined);
  return req;
}

describe("gRPC health checking over the Connect protocol and gRPC-web (an attack round)", () => {
  it("Check answers by service name on every transport: the Connect unary body is the bare message", async () => {
    const runner = createRunnerService(createMemoryQueue());
    const server = await startRunnerServer(runner, { host: "127.0.0.1", port: 0 });
    try {
      const transports = {
        "connect json": createConnectTransport({ baseUrl: server.url, httpVersion: "2" }),
        "connect binary": createConnectTransport({ baseUrl: server.url, httpVersion: "2", useBinaryFormat: true }),
        "grpc-web": createGrpcWebTransport({ baseUrl: server.url, httpVersion: "2" }),
      };
      for (const [name, transport] of Object.entries(transports)) {
        const client = createClient(Health, transport);
        for (const service of ["", "runner.v1.Runner"])
          expect((await client.check({ service })).status, `${name} ${service}`).toBe(
            HealthCheckResponse_ServingStatus.SERVING,
          );
        const unknown = await client.check({ service: "no.such.Service" }).then(
          () => null,
          (e: unknown) => ConnectError.from(e).code,
        );
        expect(unknown, name).toBe(Code.NotFound);
      }
    } finally {
      await server.close();
      await runner.close();
    }
  });

  it("a Connect unary Check whose body never ends is reset after firstMessageMs", async () => {
    const runner = createRunnerService(createMemoryQueue());
    const server = await startRunnerServer(runner, { host: "127.0.0.1", port: 0, readLimits: { firstMessageMs: 300 } });
    const session = http2.connect(server.url);
    session.on("error", () => undefined);
    try {
      const req = connectCheck(session);
      req.write('{"service":');
      const code = await new Promise<number>((resolve) => req.on("close", () => resolve(req.rstCode)));
      expect(code).toBe(http2.constants.NGHTTP2_CANCEL);
    } finally {
      session.close();
      await server.close();
      await runner.close();
    }
  });
});

describe("Connect unary Health calls under the read budget (a review of the change above)", () => {
  /** A raw Connect unary Check on `session` sending `body` (ended or not); its JSON answer once it comes. */
  function post(session: http2.ClientHttp2Session, body: string, end: boolean): Promise<{ code?: string }> {
    const req = connectCheck(session);
    const chunks: Buffer[] = [];
    req.on("data", (chunk: Buffer) => chunks.push(chunk));
    const answer = new Promise<{ code?: string }>((resolve) =>
      req.on("close", () => resolve(chunks.length > 0 ? JSON.parse(Buffer.concat(chunks).toString()) : {})),
    );
    if (end) req.end(body);
    else req.write(body);
    return answer;
  }

  it("refuses a body over 4 KiB RESOURCE_EXHAUSTED, and one past the connection's bytes UNAVAILABLE", async () => {
    const runner = createRunnerService(createMemoryQueue());
    const server = await startRunnerServer(runner, {
      host: "127.0.0.1",
      port: 0,
      readLimits: { connectionBytes: 10_000, firstMessageMs: 10_000 },
    });
    const session = http2.connect(server.url);
    session.on("error", () => undefined);
    try {
      expect(await post(session, `{"service":"${"x".repeat(5000)}"}`, true)).toMatchObject({
        code: "resource_exhausted",
      });
      // Four bodies of 3,000 bytes held open: three fit the connection's 10,000 and wait for their end; the first
      // answer is the refusal of the one that did not fit.
      const answers = [1, 2, 3, 4].map(() => post(session, `{"service":"${"x".repeat(2988)}`, false));
      expect(await Promise.race(answers)).toMatchObject({ code: "unavailable" });
    } finally {
      session.destroy();
      await server.close();
      await runner.close();
    }
  });
});
