/**
 * The server's listening sockets (src/runner/server/acceptors.ts): Node accepts one connection per
 * listening socket per event-loop turn, so a busy server with one socket left a fleet's
 * connections in the kernel's accept queue (fleet bench: ~900 of 1,000 agents waiting, their
 * keep-alive giving up). These tests provoke it through real sockets: a backlog of connections
 * built while the event loop is blocked is accepted several per turn, and many agents at once
 * each get every line stored.
 */
import net from "node:net";
import { randomUUID } from "node:crypto";
import { describe, expect, it } from "vitest";
import { listenAcceptors } from "../../../src/runner/server/acceptors.js";
import { createRunnerClient, createRunnerService, startRunnerServer } from "../../../src/runner/index.js";
import { createMemoryQueue } from "../../../src/adapters/memory/index.js";
import { mintJobToken } from "../../../src/runner/protocol/token.js";
import { until } from "../../fixtures/runner-service.js";

const linux = process.platform === "linux";

/** Accepted connections per event-loop turn (setImmediate runs once a turn), until `total` are in. */
async function acceptedPerTurn(accepted: () => number, total: number): Promise<number[]> {
  const turns: number[] = [];
  let seen = accepted();
  while (seen < total && turns.length < 100_000) {
    await new Promise((r) => setImmediate(r));
    const now = accepted();
    turns.push(now - seen);
    seen = now;
  }
  return turns;
}

/** Opens `n` TCP connections, then blocks the event loop so the kernel queues them unaccepted. */
async function backlog(port: number, n: number): Promise<net.Socket[]> {
  const sockets = Array.from({ length: n }, () =>
    net.connect({ host: "127.0.0.1", port }).on("error", () => undefined),
  );
  // Let the connect() calls go out; the kernel completes loopback handshakes on its own.
  await new Promise((r) => setImmediate(r));
  await new Promise((r) => setImmediate(r));
  const until = performance.now() + 300;
  while (performance.now() < until) {
    // Busy: nothing is accepted meanwhile, as on a server whose turn is long.
  }
  return sockets;
}

describe("runner server acceptors", () => {
  it.runIf(linux)(
    "a busy loop accepts several queued connections per turn with several sockets (one per turn with one)",
    async () => {
      for (const count of [1, 8]) {
        let accepted = 0;
        const held: net.Socket[] = [];
        const acceptors = await listenAcceptors({ host: "127.0.0.1", port: 0, count, backlog: 512 }, (s) => {
          accepted++;
          held.push(s);
        });
        const clients = await backlog(acceptors.port, 64);
        try {
          expect(acceptors.count).toBe(count);
          const turns = await acceptedPerTurn(() => accepted, 64);
          expect(accepted).toBe(64);
          if (count === 1) expect(Math.max(...turns)).toBe(1);
          else expect(Math.max(...turns)).toBeGreaterThan(1);
        } finally {
          for (const s of [...clients, ...held]) s.destroy();
          await acceptors.close();
        }
      }
    },
  );

  it("many agents at once on one server: every line of every job stored, one result each", async () => {
    const secret = "acceptors-secret";
    const queue = createMemoryQueue();
    const runner = createRunnerService(queue, { secret });
    const server = await startRunnerServer(runner, { port: 0, acceptors: 4 });
    const jobs = Array.from({ length: 60 }, () => randomUUID());
    const clients = jobs.map((id) =>
      createRunnerClient({ endpoint: server.url, requestId: id, token: mintJobToken(secret, id) }),
    );
    try {
      for (let i = 0; i < 20; i++) for (const [k, c] of clients.entries()) c.log(`${jobs[k]} line ${i}`);
      await Promise.all(
        clients.map((c) =>
          c.end({ exitCode: 0, success: true, repoUrl: "https://example.com/r.git", commitSha: "abc" }),
        ),
      );
      await until(() => queue.results.length === jobs.length, "a result per job");
      for (const id of jobs) {
        const lines = await runner.logs.read(id, 0);
        expect(lines.map((l) => l.line)).toEqual(Array.from({ length: 20 }, (_, i) => `${id} line ${i}`));
      }
      expect(new Set(queue.results.map((r) => r.requestId)).size).toBe(jobs.length);
    } finally {
      await Promise.all(clients.map((c) => c.close()));
      await server.close();
      await runner.close();
    }
  });

  it("one socket (acceptors: 1) serves as before, and the port is free again after close()", async () => {
    const runner = createRunnerService(createMemoryQueue());
    const server = await startRunnerServer(runner, { port: 0, acceptors: 1 });
    const id = randomUUID();
    const client = createRunnerClient({ endpoint: server.url, requestId: id });
    client.log("hello");
    await client.end({ exitCode: 0, success: true, repoUrl: "https://example.com/r.git", commitSha: "abc" });
    await client.close();
    expect((await runner.logs.read(id, 0)).map((l) => l.line)).toEqual(["hello"]);
    await server.close();
    await runner.close();
    // Every listening socket is closed: the port can be bound again, without SO_REUSEPORT.
    const again = net.createServer();
    await new Promise<void>((resolve, reject) =>
      again.once("error", reject).listen({ host: "127.0.0.1", port: server.port }, () => resolve()),
    );
    await new Promise<void>((resolve) => again.close(() => resolve()));
  });

  it("acceptors outside 1..64 or not an integer is refused before anything binds", async () => {
    const runner = createRunnerService(createMemoryQueue());
    try {
      for (const acceptors of [0, -1, 1.5, 65, Infinity, Number.NaN]) {
        await expect(startRunnerServer(runner, { port: 0, acceptors }), String(acceptors)).rejects.toThrow(RangeError);
      }
    } finally {
      await runner.close();
    }
  });

  it.runIf(linux)(
    "a port held by another runner server is refused (EADDRINUSE), not shared through SO_REUSEPORT",
    async () => {
      const runner = createRunnerService(createMemoryQueue());
      const server = await startRunnerServer(runner, { port: 0 });
      try {
        await expect(startRunnerServer(runner, { port: server.port })).rejects.toMatchObject({ code: "EADDRINUSE" });
      } finally {
        await server.close();
        await runner.close();
      }
    },
  );

  it.runIf(linux)(
    "eight sockets are all closed by close(): the port can be bound again without SO_REUSEPORT",
    async () => {
      const runner = createRunnerService(createMemoryQueue());
      const server = await startRunnerServer(runner, { port: 0 });
      await server.close();
      await runner.close();
      const again = net.createServer();
      await new Promise<void>((resolve, reject) =>
        again.once("error", reject).listen({ host: "127.0.0.1", port: server.port }, () => resolve()),
      );
      await new Promise<void>((resolve) => again.close(() => resolve()));
    },
  );
});
