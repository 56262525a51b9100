/**
 * The depot's token goes to the depot's origin only: a download redirected to a signed blob URL on another origin
 * (docs/depot-api.md, package data) and cut mid-transfer resumes there without it, as fetch's own redirect does.
 */
import { createHash } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { Writable } from "node:stream";
import { afterEach, describe, expect, it } from "vitest";
import { createDepotClient } from "../../../src/depot/client/depot-client.js";

const TOKEN = "depot-token-never-for-the-blob-host";
const body = Buffer.alloc(200_000, 7);
const digest = `sha-256=:${createHash("sha256").update(body).digest("base64")}:`;

let servers: Server[] = [];
afterEach(async () => {
  for (const s of servers) {
    s.closeAllConnections();
    await new Promise((r) => s.close(r));
  }
  servers = [];
});

async function listen(handle: (req: IncomingMessage, res: ServerResponse) => void, host: string): Promise<string> {
  const server = createServer(handle);
  servers.push(server);
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return `http://${host}:${(server.address() as AddressInfo).port}`;
}

/** Serves the archive, from a Range if asked; the first answer is cut after 50,000 bytes. */
function archive(seen: { authorization?: string; range?: string }[]) {
  let cut = true;
  return (req: IncomingMessage, res: ServerResponse) => {
    seen.push({ authorization: req.headers.authorization, range: req.headers.range });
    const r = /^bytes=(\d+)-$/.exec(String(req.headers.range ?? ""));
    const start = r ? Number(r[1]) : 0;
    res.writeHead(r ? 206 : 200, {
      "content-length": String(body.length - start),
      "repr-digest": digest,
      etag: '"v1"',
      ...(r ? { "content-range": `bytes ${start}-${body.length - 1}/${body.length}` } : {}),
    });
    if (!cut) return void res.end(body.subarray(start));
    cut = false;
    res.write(body.subarray(start, start + 50_000), () => res.socket?.destroy());
  };
}

const sink = () => new Writable({ write: (_c, _e, cb) => cb() });

describe("the depot's token on a resumed download", () => {
  it("is not sent to the redirect's origin when the transfer resumes there", async () => {
    const seen: { authorization?: string; range?: string }[] = [];
    // "localhost" and "127.0.0.1" are two origins on the same machine.
    const blobs = await listen(archive(seen), "localhost");
    const depot = await listen((_req, res) => {
      res.writeHead(302, { location: `${blobs}/signed/archive?X-Amz-Signature=abc` }).end();
    }, "127.0.0.1");
    const client = createDepotClient({ baseUrl: depot, token: TOKEN, retryDelayMs: 1 });
    const got = await client.download("tool@1.0.0", { to: sink() });
    expect(got.size).toBe(body.length);
    expect(got.resumes).toBe(1);
    expect(seen.map((s) => s.range ?? "whole")).toEqual(["whole", "bytes=50000-"]);
    expect(seen.map((s) => s.authorization ?? "none")).toEqual(["none", "none"]);
  });

  it("is still sent when the depot serves the archive itself and the transfer resumes there", async () => {
    const seen: { authorization?: string; range?: string }[] = [];
    const depot = await listen(archive(seen), "127.0.0.1");
    const client = createDepotClient({ baseUrl: depot, token: TOKEN, retryDelayMs: 1 });
    const got = await client.download("tool@1.0.0", { to: sink() });
    expect(got.resumes).toBe(1);
    expect(seen.map((s) => s.authorization)).toEqual([`Bearer ${TOKEN}`, `Bearer ${TOKEN}`]);
  });
});
