/**
 * Graceful shutdown with calls in flight: idle connections go at once, calls in flight
 * get the grace time, then end UNAVAILABLE with runner-committed; close() never hangs,
 * even with runners that are still sending.
 */
import { randomUUID } from "node:crypto";
import { getEventListeners } from "node:events";
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { describe, expect, it } from "vitest";
import { Runner } from "../../../src/gen/runner/v1/runner_pb.js";
import { createRunnerService, startRunnerServer } from "../../../src/runner/index.js";
import { createStreamLogsFastPath } from "../../../src/runner/server/fast-path.js";
import { createReadBudget } from "../../../src/runner/server/read-budget.js";
import { kMessageBytes, kShutdownSignal } from "../../../src/runner/service/runner-service.js";
import { CallValues } from "../../../src/runner/server/call-context.js";
import { isLoopbackHost } from "../../../src/loopback.js";
import { createMemoryLogStore, createMemoryQueue } from "../../../src/adapters/memory/index.js";
import { controlledStream, end, line, send, startHarness, until, type Outcome } from "../../fixtures/runner-service.js";

describe("runner server shutdown", () => {
  it("100 calls in flight: those that finish in the grace time get their Ack, the rest UNAVAILABLE with committed; close() resolves", async () => {
    const h = await startHarness({ server: { gracefulShutdownMs: 400 } });
    const second = createClient(Runner, createGrpcTransport({ baseUrl: h.server.url }));
    const calls = Array.from({ length: 100 }, (_, i) => {
      const id = randomUUID();
      const stream = controlledStream();
      const outcome = send(i % 2 === 0 ? h.client : second, stream.items);
      stream.push(line(id, `first of ${i}`));
      return { id, stream, outcome };
    });
    await until(async () => {
      const states = await Promise.all(calls.map((c) => h.logs.get(c.id)));
      return states.every((s) => s?.committed === 1);
    }, "every call stored its first line");

    const closing = h.server.close();
    // A third of the runners finish during the grace time; the rest keep their calls open.
    const finishing = calls.filter((_, i) => i % 3 === 0);
    for (const c of finishing) {
      c.stream.push(line(c.id, "second"));
      c.stream.push(end(c.id));
      c.stream.close();
    }
    await closing;
    const outcomes: Outcome[] = await Promise.all(calls.map((c) => c.outcome));
    let acked = 0;
    let unavailable = 0;
    for (const [i, out] of outcomes.entries()) {
      if (out.ok === true) {
        acked++;
        expect(i % 3).toBe(0);
        expect(out.committed).toBe("3");
      } else {
        unavailable++;
        expect(out.code).toBe("Unavailable");
        // The runner learns where the job stands, so it resumes without a loss or a duplicate.
        expect(out.committed).toMatch(/^[1-3]$/);
      }
    }
    expect(acked + unavailable).toBe(100);
    expect(unavailable).toBeGreaterThanOrEqual(66);
    // Nothing stored was lost.
    for (const c of calls) expect((await h.logs.read(c.id))[0]?.line).toMatch(/^first of/);
    for (const c of calls) c.stream.close();
    await h.runner.close();
    await h.logs.close?.();
  });

  it("a host's shutdown signal: one abort listener however many calls are open, and its abort stops every call UNAVAILABLE", async () => {
    // A listener per call made each call's start and end walk the signal's listener list
    // (EventTarget's duplicate check): O(open calls) per call.
    const logs = createMemoryLogStore();
    const runner = createRunnerService(createMemoryQueue(), { logs });
    const shutdown = new AbortController();
    const fast = createStreamLogsFastPath(runner, {
      messageBytes: runner.limits.messageBytes,
      budget: createReadBudget(),
      contextValues: () => new CallValues().set(kShutdownSignal, shutdown.signal).set(kMessageBytes, undefined),
    });
    const server = http2.createServer((req, res) => {
      if (!fast.request(req, res)) res.writeHead(404).end();
    });
    const sessions = new Set<http2.ServerHttp2Session>();
    server.on("session", (session) => sessions.add(session));
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const client = createClient(
      Runner,
      createGrpcTransport({ baseUrl: `http://127.0.0.1:${(server.address() as AddressInfo).port}` }),
    );
    try {
      const calls = Array.from({ length: 30 }, (_, i) => {
        const id = randomUUID();
        const stream = controlledStream();
        const outcome = send(client, stream.items);
        stream.push(line(id, `first of ${i}`));
        return { id, stream, outcome };
      });
      await until(() => runner.activeCalls === 30, "30 calls open");
      await until(
        async () => (await Promise.all(calls.map((c) => logs.get(c.id)))).every((s) => s?.committed === 1),
        "every call stored its first line",
      );
      expect(getEventListeners(shutdown.signal, "abort").length).toBe(1);
      shutdown.abort();
      const outcomes: Outcome[] = await Promise.all(calls.map((c) => c.outcome));
      for (const out of outcomes) {
        expect(out.code).toBe("Unavailable");
        expect(out.committed).toBe("1");
      }
      for (const c of calls) c.stream.close();
      // A call started after the abort is stopped at once.
      const late = randomUUID();
      const after = await send(client, [line(late, "late")]);
      expect(after.code).toBe("Unavailable");
    } finally {
      for (const session of sessions) session.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
      await runner.close();
    }
  });

  it("close() with idle connections and no calls resolves; later calls are refused", async () => {
    const h = await startHarness({ memoryStore: true });
    const id = randomUUID();
    expect(await send(h.client, [line(id, "a")])).toMatchObject({ ok: true });
    await h.server.close();
    await h.server.close();
    // A new connection is refused (the old client's session may instead see REFUSED_STREAM).
    const fresh = createClient(Runner, createGrpcTransport({ baseUrl: h.server.url }));
    const out = await send(fresh, [line(id, "b")], { offset: 1 });
    expect(out.code).toBe("Unavailable");
    await h.runner.close();
  });

  it("a call whose runner is still sending when the service answers early leaves no stream open (close does not hang)", async () => {
    const h = await startHarness({ memoryStore: true, server: { gracefulShutdownMs: 5000 } });
    const id = randomUUID();
    const stream = controlledStream();
    const pending = send(h.client, stream.items);
    // A gap: the service answers at the first item while the runner keeps its side open.
    stream.push(line(id, "x"));
    const early = send(h.client, [line(randomUUID(), "y")], { offset: 3 });
    expect((await early).code).toBe("FailedPrecondition");
    stream.push(line("bad id", "x"));
    expect((await pending).code).toBe("InvalidArgument");
    // Had the early-ended streams stayed half open, this would wait for the grace time or hang.
    await h.server.close();
    stream.close();
    await h.runner.close();
  });

  it("refuses to listen beyond loopback with a service that accepts any caller, unless insecure", async () => {
    const open = createRunnerService(createMemoryQueue());
    expect(open.acceptsAnyCaller).toBe(true);
    await expect(startRunnerServer(open, { host: "0.0.0.0", port: 0 })).rejects.toThrow(/refusing to listen/);
    await expect(startRunnerServer(open, { host: "192.0.2.10", port: 0 })).rejects.toThrow(/refusing to listen/);
    const guarded = createRunnerService(createMemoryQueue(), { secret: "k" });
    expect(guarded.acceptsAnyCaller).toBe(false);
    for (const host of ["127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost", "::ffff:127.0.0.1"])
      expect(isLoopbackHost(host)).toBe(true);
    for (const host of ["0.0.0.0", "::", "10.0.0.1", "example.com", "128.0.0.1"])
      expect(isLoopbackHost(host)).toBe(false);
    await open.close();
    await guarded.close();
  });
});
