/**
 * The runner port's connection caps (issue 31), with real sockets from several loopback
 * addresses: past the per-peer cap a peer's new connections are closed on arrival while other
 * peers still call; past the server-wide cap everyone's are; a closed connection frees its slot.
 */
import { randomUUID } from "node:crypto";
import * as http2 from "node:http2";
import * as net from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createMemoryQueue } from "../../../src/adapters/memory/index.js";
import { createMemoryLogStore } from "../../../src/adapters/memory/log-store.js";
import { createRunnerService, startRunnerServer, type RunnerServer } from "../../../src/runner/index.js";
import { createConnectionGate } from "../../../src/runner/server/connection-cap.js";
import { frame, openCall } from "../../fixtures/runner-raw-calls.js";
import { end, line } from "../../fixtures/runner-service.js";

const PER_PEER = 5;
const SERVER_WIDE = 12;

/** A connection from `localAddress`: admitted once the server's SETTINGS arrive, refused when it closes first. */
async function dial(
  url: string,
  localAddress: string,
): Promise<{ session: http2.ClientHttp2Session; admitted: boolean }> {
  const { hostname, port } = new URL(url);
  const session = http2.connect(url, {
    createConnection: () => net.connect({ host: hostname, port: Number(port), localAddress }),
  });
  session.on("error", () => undefined);
  const admitted = await new Promise<boolean>((resolve) => {
    session.once("remoteSettings", () => resolve(true));
    session.once("close", () => resolve(false));
  });
  return { session, admitted };
}

/** A whole StreamLogs call (one line and the end) on `session`: its gRPC status. */
async function call(session: http2.ClientHttp2Session): Promise<number | null> {
  const id = randomUUID();
  const c = openCall(session, "grpc", "any");
  c.stream.end(Buffer.concat([frame(line(id, "hello")), frame(end(id, 0))]));
  return (await c.status).code;
}

describe("the runner port's connection caps", () => {
  let server: RunnerServer;
  let runner: ReturnType<typeof createRunnerService>;
  const sessions: http2.ClientHttp2Session[] = [];
  beforeAll(async () => {
    runner = createRunnerService(createMemoryQueue(), { logs: createMemoryLogStore() });
    server = await startRunnerServer(runner, {
      port: 0,
      maxConnections: SERVER_WIDE,
      maxConnectionsPerPeer: PER_PEER,
    });
  });
  afterAll(async () => {
    for (const s of sessions) s.destroy();
    await server.close();
    await runner.close();
  });

  it("per peer, then server-wide; other peers keep calling; a closed connection frees its slot", async () => {
    // One peer opens 8: 5 are served, 3 closed on arrival (before: all 8 kept, without bound).
    const first = [];
    for (let i = 0; i < 8; i++) first.push(await dial(server.url, "127.0.0.1"));
    sessions.push(...first.map((d) => d.session));
    expect(first.map((d) => d.admitted)).toEqual([true, true, true, true, true, false, false, false]);

    // Another peer still gets in and its call is served.
    const other = await dial(server.url, "127.0.0.2");
    sessions.push(other.session);
    expect(other.admitted).toBe(true);
    expect(await call(other.session)).toBe(0);

    // Up to the server-wide cap from more peers (5 + 1 + 6 = 12), then nobody gets in.
    const more = [];
    for (let i = 0; i < 4; i++) more.push(await dial(server.url, "127.0.0.3"));
    for (let i = 0; i < 2; i++) more.push(await dial(server.url, "127.0.0.4"));
    sessions.push(...more.map((d) => d.session));
    expect(more.every((d) => d.admitted)).toBe(true);
    const fresh = await dial(server.url, "127.0.0.5");
    expect(fresh.admitted).toBe(false);

    // The connections a peer closes are free again.
    first[0]!.session.destroy();
    first[1]!.session.destroy();
    let again = await dial(server.url, "127.0.0.5");
    for (let i = 0; !again.admitted && i < 50; i++) {
      await new Promise((resolve) => setTimeout(resolve, 20));
      again = await dial(server.url, "127.0.0.5");
    }
    sessions.push(again.session);
    expect(again.admitted).toBe(true);
    expect(await call(again.session)).toBe(0);
  });

  it("refuses caps that are not positive integers", () => {
    expect(() => createConnectionGate({ maxConnections: 0 })).toThrow(RangeError);
    expect(() => createConnectionGate({ maxConnectionsPerPeer: 1.5 })).toThrow(RangeError);
  });
});
