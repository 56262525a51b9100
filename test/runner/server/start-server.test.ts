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
import { Runner } from "../../../src/gen/runner/v1/runner_pb.js";
import {
  createRunnerClient,
  createRunnerHandler,
  createRunnerService,
  startRunnerServer,
} from "../../../src/runner/index.js";
import { createMemoryQueue } from "../../../src/adapters/memory/index.js";
import { controlledStream, end, line, send, until } from "../../fixtures/runner-service.js";

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
      expect((await send(client, [line(randomUUID(), "warm-up")])).ok).toBe(true);
      // Two calls hold both streams open.
      const held = [randomUUID(), randomUUID()].map((id) => ({ id, stream: controlledStream() }));
      const heldCalls = held.map(({ id, stream }) => {
        stream.push(line(id, "held"));
        return send(client, stream.items);
      });
      for (const { id } of held)
        await until(async () => (await runner.logs.get(id))?.committed === 1, "held call stored");
      // A third call's stream waits in the client: its item cannot reach the server yet.
      const third = randomUUID();
      const thirdCall = send(client, [line(third, "queued"), end(third)]);
      await new Promise((r) => setTimeout(r, 300));
      expect(await runner.logs.get(third)).toBeNull();
      // Freeing one stream lets it through, and every call succeeds.
      held[0]!.stream.close();
      expect((await thirdCall).ok).toBe(true);
      held[1]!.stream.close();
      expect((await Promise.all(heldCalls)).map((o) => o.ok)).toEqual([true, true]);
      expect(queue.results.map((r) => r.requestId)).toEqual([third]);
    } finally {
      await server.close();
      await runner.close();
    }
  });

  it("the agent's client reaches a service mounted under a path prefix through the endpoint's path", async () => {
    const queue = createMemoryQueue();
    const runner = createRunnerService(queue);
    const mounted = createRunnerHandler(runner, { requestPathPrefix: "/ci/runner" });
    const server = http2.createServer(mounted.handler);
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const endpoint = `http://127.0.0.1:${(server.address() as AddressInfo).port}/ci/runner/`;
    const requestId = randomUUID();
    const client = createRunnerClient({ endpoint, requestId });
    try {
      client.log("through the prefix");
      await client.end({ exitCode: 0, success: true, repoUrl: "", commitSha: "" });
      expect((await runner.logs.read(requestId)).map((l) => l.line)).toEqual(["through the prefix"]);
      expect((await queue.next()).requestId).toBe(requestId);
    } finally {
      await client.close();
      await mounted.shutdown(0);
      server.close();
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
