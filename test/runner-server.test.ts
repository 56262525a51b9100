/**
 * Server settings: HTTP/2 keep-alive pings, SETTINGS_MAX_CONCURRENT_STREAMS, and the
 * handler a host mounts on its own HTTP/2 server.
 */
import * as http2 from "node:http2";
import { randomUUID } from "node:crypto";
import type { AddressInfo } from "node:net";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { describe, expect, it } from "vitest";
import { Runner } from "../src/gen/runner/v1/runner_pb.js";
import { createRunnerHandler, createRunnerService, startRunnerServer } from "../src/runner/index.js";
import { createMemoryQueue } from "../src/adapters/memory/index.js";
import { controlledStream, end, line, send, until } from "./runner-service-helpers.js";

describe("runner server settings", () => {
  it("pings idle clients (keep-alive) and advertises maxConcurrentStreams", async () => {
    const runner = createRunnerService(createMemoryQueue());
    const server = await startRunnerServer(runner, { port: 0, keepAliveMs: 30, maxConcurrentStreams: 7 });
    const session = http2.connect(server.url);
    try {
      let pings = 0;
      session.on("ping", () => pings++);
      await new Promise<void>((resolve) => session.once("remoteSettings", () => resolve()));
      expect(session.remoteSettings.maxConcurrentStreams).toBe(7);
      await until(() => pings >= 2, "two keep-alive pings");
      expect(session.destroyed).toBe(false);
    } finally {
      session.destroy();
      await server.close();
      await runner.close();
    }
  });

  it("a client beyond maxConcurrentStreams queues instead of failing", async () => {
    const queue = createMemoryQueue();
    const runner = createRunnerService(queue);
    const server = await startRunnerServer(runner, { port: 0, maxConcurrentStreams: 2 });
    try {
      const client = createClient(Runner, createGrpcTransport({ baseUrl: server.url }));
      // Once the client has the server's SETTINGS (after a first call), it queues extra streams.
      const warm = randomUUID();
      expect((await send(client, [line(warm, "warm-up")])).ok).toBe(true);
      const ids = Array.from({ length: 6 }, () => randomUUID());
      const outs = await Promise.all(ids.map((id) => send(client, [line(id, "a"), end(id)])));
      expect(outs.map((o) => o.ok)).toEqual(ids.map(() => true));
      expect(queue.results).toHaveLength(6);
    } finally {
      await server.close();
      await runner.close();
    }
  });

  it("createRunnerHandler mounts the service on the host's own HTTP/2 server, with graceful shutdown", async () => {
    const runner = createRunnerService(createMemoryQueue());
    const mounted = createRunnerHandler(runner);
    const server = http2.createServer();
    server.on("request", (req, res) => {
      if (req.url === "/healthz") {
        res.end("ok");
        return;
      }
      mounted.handler(req, res);
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    const client = createClient(Runner, createGrpcTransport({ baseUrl: url }));
    const id = randomUUID();
    expect(await send(client, [line(id, "a")])).toMatchObject({ ok: true, committed: "1" });
    const stream = controlledStream();
    const pending = send(client, stream.items, { offset: 1 });
    stream.push(line(id, "b"));
    await until(async () => (await runner.logs.get(id))?.committed === 2, "b stored");
    expect(mounted.activeRequests).toBe(1);
    await mounted.shutdown(50);
    expect(await pending).toMatchObject({ code: "Unavailable", committed: "2" });
    stream.close();
    server.close();
    await runner.close();
  });
});
