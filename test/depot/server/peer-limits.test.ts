/**
 * Issue 30 item 3 over real sockets: one peer's idle connections cannot deny the port.
 * A per-peer cap refuses a peer's connections past `maxConnectionsPerPeer` while another
 * peer (127.0.0.2, a second loopback address) is served; the last `reservedConnections`
 * serve only health checks and authenticated requests; the cap follows the descriptor limit.
 */
import { connect, type Socket } from "node:net";
import { request as httpRequest } from "node:http";
import { afterEach, describe, expect, it } from "vitest";
import { createMemoryStore } from "../../../src/adapters/memory/store.js";
import { checkDescriptors, connectionCapFor, descriptorsInUse } from "../../../src/depot/server/descriptors.js";
import { createPackageRouter } from "../../../src/depot/server/router.js";
import { servePackageRouter, type PackageServer } from "../../../src/depot/server/serve.js";

const sockets: Socket[] = [];
let server: PackageServer | undefined;
afterEach(async () => {
  for (const s of sockets.splice(0)) s.destroy();
  await server?.close();
  server = undefined;
});

/** An idle connection from `localAddress` (read, so the server's close is seen). */
async function idle(port: number, localAddress: string): Promise<Socket> {
  const socket = await new Promise<Socket>((resolve, reject) => {
    const s = connect({ port, host: "127.0.0.1", localAddress }, () => resolve(s));
    s.on("error", reject);
  });
  socket.on("error", () => undefined);
  socket.resume();
  sockets.push(socket);
  return socket;
}

/** A GET from `localAddress` through node:http: status and problem code (if any). */
function get(
  port: number,
  path: string,
  localAddress: string,
  headers: Record<string, string> = {},
): Promise<{ status: number; code?: string }> {
  return new Promise((resolve, reject) => {
    const req = httpRequest({ host: "127.0.0.1", port, path, localAddress, headers, agent: false }, (res) => {
      let text = "";
      res.on("data", (c) => (text += c));
      res.on("end", () => {
        let code: string | undefined;
        try {
          code = (JSON.parse(text) as { code?: string }).code;
        } catch {
          code = undefined;
        }
        resolve({ status: res.statusCode!, code });
      });
    });
    req.on("error", reject);
    req.end();
  });
}

/** Resolves once `done()` holds (polled every 10 ms); throws `what` after 5 s. */
async function until(done: () => boolean | Promise<boolean>, what: string): Promise<void> {
  const deadline = Date.now() + 5000;
  while (!(await done())) {
    if (Date.now() > deadline) throw new Error(what);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** Connections the server holds now. */
function connections(s: PackageServer): Promise<number> {
  return new Promise((resolve, reject) => s.server.getConnections((e, n) => (e ? reject(e) : resolve(n))));
}

/** The depot router behind a `/healthz` of its own, as `serve` puts its operator endpoints in front. */
function withHealth() {
  const depot = createPackageRouter(createMemoryStore(), { onError: () => undefined });
  return {
    isOpen: false,
    fetch: (request: Request) =>
      new URL(request.url).pathname === "/healthz" ? Promise.resolve(new Response("alive")) : depot.fetch(request),
  };
}

describe("one peer cannot hold the depot port (issue 30 item 3)", () => {
  it("10 idle connections from one peer at maxConnections 10: the peer is capped at 5, another peer is served", async () => {
    server = await servePackageRouter(withHealth(), {
      maxConnections: 10,
      maxConnectionsPerPeer: 5,
      reservedConnections: 0,
    });
    const held: Socket[] = [];
    for (let i = 0; i < 10; i++) held.push(await idle(server.port, "127.0.0.1"));
    // The server has seen all 10 once it has closed the 5 over the peer's cap.
    await until(
      () => held.filter((s) => s.destroyed || s.readableEnded).length === 5,
      "the server did not close the 5 connections over the peer's cap",
    );
    const own = await get(server.port, "/catalog", "127.0.0.1");
    expect(own).toEqual({ status: 503, code: "TOO_MANY_CONNECTIONS" });
    expect(await get(server.port, "/catalog", "127.0.0.2")).toEqual({ status: 200, code: undefined });
    expect((await get(server.port, "/healthz", "127.0.0.2")).status).toBe(200);
  });

  it("the last reserved connections serve /healthz and authenticated requests, not anonymous ones", async () => {
    server = await servePackageRouter(withHealth(), {
      maxConnections: 10,
      maxConnectionsPerPeer: 10,
      reservedConnections: 3,
    });
    for (let i = 0; i < 7; i++) await idle(server.port, "127.0.0.1");
    await until(async () => (await connections(server!)) === 7, "the server never held the 7 idle connections");
    expect(await get(server.port, "/catalog", "127.0.0.2")).toEqual({ status: 503, code: "TOO_MANY_CONNECTIONS" });
    expect((await get(server.port, "/healthz", "127.0.0.2")).status).toBe(200);
    expect((await get(server.port, "/catalog", "127.0.0.2", { authorization: "Bearer any" })).status).toBe(200);
  });
});

describe("descriptors (issue 30 item 3)", () => {
  it("maxConnections follows the descriptor limit, and the readiness check fails when descriptors run short", async () => {
    expect(connectionCapFor(2000, 1024)).toBe(768);
    expect(connectionCapFor(2000, 65536)).toBe(2000);
    expect(connectionCapFor(2000, null)).toBe(2000);
    const used = (await descriptorsInUse())!;
    expect(used).toBeGreaterThan(0);
    await expect(checkDescriptors(used * 10)).resolves.toBeUndefined();
    await expect(checkDescriptors(used)).rejects.toMatchObject({ code: "DESCRIPTORS_SHORT" });
  });
});
