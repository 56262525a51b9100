/**
 * The depot client against a hostile node:http depot on 127.0.0.1 (issue 30, items 2 and
 * 6): endless, inflating and dripping bodies, an endless catalog, and a silent archive.
 * Each read stops at its byte or time bound, and the depot manages to hand the socket
 * only a little more than the bound.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { Writable } from "node:stream";
import { gzipSync } from "node:zlib";
import { afterEach, describe, expect, it } from "vitest";
import { createDepotClient } from "../../../src/depot/client/depot-client.js";
import { failure } from "../../fixtures/errors.js";

const MiB = 2 ** 20;
let servers: Server[] = [];
afterEach(async () => {
  for (const s of servers) {
    s.closeAllConnections();
    await new Promise((r) => s.close(r));
  }
  servers = [];
});

/** A depot answering every request with `handle`; `sent` counts the bytes it handed to sockets. */
async function depot(
  handle: (req: IncomingMessage, res: ServerResponse, sent: { bytes: number }) => void,
): Promise<{ url: string; sent: { bytes: number } }> {
  const sent = { bytes: 0 };
  const server = createServer((req, res) => handle(req, res, sent));
  servers.push(server);
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, sent };
}

/** Writes `chunk` while the peer reads, up to `cap` bytes (so the code before the fix ends too). */
function stream(res: ServerResponse, sent: { bytes: number }, chunk: Buffer, cap: number): void {
  const pump = () => {
    while (sent.bytes < cap && !res.destroyed) {
      sent.bytes += chunk.length;
      if (!res.write(chunk)) return void res.once("drain", pump);
    }
    res.end();
  };
  res.on("close", () => res.destroy());
  pump();
}

/** Writes one byte every `everyMs` for `forMs`, then ends. */
function drip(res: ServerResponse, everyMs: number, forMs: number): void {
  const start = Date.now();
  const timer = setInterval(() => {
    if (res.destroyed || Date.now() - start > forMs) {
      clearInterval(timer);
      return void res.end();
    }
    res.write(" ");
  }, everyMs);
  res.on("close", () => clearInterval(timer));
}

describe("every body the client reads has a byte bound (issue 30, item 2)", () => {
  it("an endless /version stops at maxJsonBytes: TOO_LARGE, the depot sends a few MiB of its 256", async () => {
    const { url, sent } = await depot((_req, res, sent) => {
      res.writeHead(200, { "content-type": "application/json" });
      stream(res, sent, Buffer.alloc(64 * 1024, 0x20), 256 * MiB);
    });
    const client = createDepotClient({ baseUrl: url, maxJsonBytes: MiB });
    const error = await failure(client.versions("evil"));
    expect(error.code).toBe("TOO_LARGE");
    expect(error.message).toMatch(/GET \/version\/evil: the answer is larger than 1048576 bytes/);
    // The bound plus what loopback socket buffers hold.
    expect(sent.bytes).toBeLessThan(32 * MiB);
  });

  it("a gzip bomb counts decoded bytes: 64 MiB of spaces in ~64 KiB stop at maxJsonBytes", async () => {
    const bomb = gzipSync(Buffer.alloc(64 * MiB, 0x20));
    expect(bomb.length).toBeLessThan(MiB);
    const { url } = await depot((_req, res) => {
      res.writeHead(200, { "content-type": "application/json", "content-encoding": "gzip" });
      res.end(bomb);
    });
    const error = await failure(createDepotClient({ baseUrl: url, maxJsonBytes: MiB }).versions("evil"));
    expect(error.code).toBe("TOO_LARGE");
  });

  it("a 500 with an endless body keeps the status, reading at most 64 KiB of it", async () => {
    const { url, sent } = await depot((_req, res, sent) => {
      res.writeHead(500, { "content-type": "application/problem+json" });
      stream(res, sent, Buffer.alloc(64 * 1024, 0x20), 256 * MiB);
    });
    const error = await failure(createDepotClient({ baseUrl: url }).versions("evil"));
    expect(error.code).toBe("UNAVAILABLE");
    expect(error.status).toBe(500);
    expect(sent.bytes).toBeLessThan(32 * MiB);
  });

  it("a catalog whose Link: next never ends stops at maxCatalogPages, and at maxCatalogBytes", async () => {
    let pages = 0;
    const { url } = await depot((req, res) => {
      pages++;
      const n = Number(new URL(req.url!, "http://x").searchParams.get("after") ?? 0);
      // Each page a new package of 100 KB of versions; the code before the fix stopped only after 100,000 pages.
      const versions = Array.from({ length: 10_000 }, (_, i) => `${n}.${i}.0`);
      res.writeHead(200, {
        "content-type": "application/json",
        ...(n < 400 ? { link: `</catalog?after=${n + 1}>; rel="next"` } : {}),
      });
      res.end(JSON.stringify({ packages: { [`p${n}`]: { latest: "1.0.0", versions, updatedAt: "" } }, count: 1 }));
    });
    const byPages = await failure(createDepotClient({ baseUrl: url, maxCatalogPages: 20 }).catalog());
    expect(byPages.code).toBe("TOO_LARGE");
    expect(byPages.message).toMatch(/more than 20 pages/);
    expect(pages).toBe(20);
    pages = 0;
    const byBytes = await failure(createDepotClient({ baseUrl: url, maxCatalogBytes: 2 * MiB }).catalog());
    expect(byBytes.code).toBe("TOO_LARGE");
    expect(byBytes.message).toMatch(/more than 2097152 bytes \(maxCatalogBytes\)/);
    expect(pages).toBeLessThan(30);
  });

  it("a next link back to a page already read is refused at once", async () => {
    const { url } = await depot((_req, res) => {
      res.writeHead(200, { "content-type": "application/json", link: `</catalog?after=1>; rel="next"` });
      res.end(JSON.stringify({ packages: {}, count: 0 }));
    });
    const error = await failure(createDepotClient({ baseUrl: url }).catalog());
    expect(error.code).toBe("TOO_LARGE");
    expect(error.message).toMatch(/leads back to/);
  });
});

describe("a /depend answer of the wrong shape is UNAVAILABLE before the resolver walks it", () => {
  for (const [why, body] of [
    ["requires is a string", { name: "evil", version: "1.0.0", requires: "x" }],
    ["a requirement's range is a number", { name: "evil", version: "1.0.0", requires: [{ name: "lib", range: 1 }] }],
    ["a requirement is null", { name: "evil", version: "1.0.0", requires: [null] }],
    ["the answer is an array", [{ name: "lib", range: "*" }]],
  ] as const) {
    it(`${why}: client.depends fails with the code, naming the request`, async () => {
      const { url } = await depot((req, res) => {
        if (!req.url?.startsWith("/depend/")) return void res.writeHead(404).end();
        res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(body));
      });
      const client = createDepotClient({ baseUrl: url });
      const error = await failure(client.depends("evil@1.0.0"));
      expect(error.code).toBe("UNAVAILABLE");
      expect(error.message).toMatch(/GET \/depend\/evil@1\.0\.0: the answer is not a depend record/);
    });
  }

  it("an answer without requires is a version that requires nothing", async () => {
    const { url } = await depot((_req, res) => {
      res.writeHead(200, { "content-type": "application/json" }).end('{"name":"ok","version":"1.0.0"}');
    });
    expect(await createDepotClient({ baseUrl: url }).depends("ok@1.0.0")).toEqual({
      name: "ok",
      version: "1.0.0",
      requires: [],
    });
  });
});

describe("the client's timeouts cover bodies (issue 30, item 6)", () => {
  it("a /version dripping a byte every 50 ms ends at jsonTimeoutMs: DEADLINE_EXCEEDED", async () => {
    const { url } = await depot((_req, res) => {
      res.writeHead(200, { "content-type": "application/json" });
      drip(res, 50, 20_000);
    });
    const client = createDepotClient({ baseUrl: url, jsonTimeoutMs: 500, idleTimeoutMs: 5_000 });
    const error = await failure(client.versions("evil"));
    expect(error.code).toBe("DEADLINE_EXCEEDED");
    expect(error.message).toMatch(/took longer than 0.5 s/);
  });

  it("an error body that stalls does not hold the error: the status is kept", async () => {
    const { url } = await depot((_req, res) => {
      res.writeHead(503, { "content-type": "application/problem+json" });
      res.write("{");
    });
    const error = await failure(createDepotClient({ baseUrl: url, idleTimeoutMs: 300 }).versions("evil"));
    expect(error.code).toBe("STORE_UNAVAILABLE");
    expect(error.status).toBe(503);
  });

  it("an archive that goes silent after 10 bytes is cut at idleTimeoutMs, resumed, then given up", async () => {
    let requests = 0;
    const { url } = await depot((req, res) => {
      // Ten bytes, then silence until the test ends (the code before the fix waited undici's 300 s).
      if (requests++ === 0) {
        res.writeHead(200, { "content-type": "application/x-tar", "content-length": "1000" });
        res.write(Buffer.alloc(10));
      } else {
        res.writeHead(206, { "content-type": "application/x-tar", "content-range": `bytes 10-999/1000` });
        res.flushHeaders();
      }
    });
    const client = createDepotClient({ baseUrl: url, idleTimeoutMs: 300, retries: 1, retryDelayMs: 1 });
    const sink = new Writable({ write: (_c, _e, cb) => cb() });
    const error = await failure(client.download("evil@1.0.0", { to: sink }));
    expect(error.code).toBe("UNAVAILABLE");
    expect(error.message).toMatch(/no byte of the answer for 0.3 s/);
    expect(requests).toBe(2);
  });

  it("a manifest read that drips within the idle bound is cut at jsonTimeoutMs", async () => {
    // A byte every 50 ms never trips the idle bound (1 s); before, only the 64 MiB bound on the manifest ended it.
    const { url } = await depot((_req, res) => {
      res.writeHead(200, { "content-type": "application/x-tar" });
      drip(res, 50, 30_000);
    });
    const client = createDepotClient({ baseUrl: url, idleTimeoutMs: 1_000, jsonTimeoutMs: 300 });
    const error = await failure(client.manifest("evil@1.0.0"));
    expect(error.code).toBe("DEADLINE_EXCEEDED");
    expect(error.message).toMatch(/took longer than 0.3 s/);
  });

  it("a manifest read of a 206 that runs out of time is not read again whole", async () => {
    let requests = 0;
    const { url } = await depot((_req, res) => {
      requests++;
      res.writeHead(206, { "content-type": "application/x-tar", "content-range": "bytes 0-65535/100000" });
      drip(res, 50, 30_000);
    });
    const client = createDepotClient({ baseUrl: url, idleTimeoutMs: 1_000, jsonTimeoutMs: 300 });
    const error = await failure(client.manifest("evil@1.0.0"));
    expect(error.code).toBe("DEADLINE_EXCEEDED");
    expect(requests).toBe(1);
  });

  it("a depot that accepts and never answers a GET is cut at idleTimeoutMs", async () => {
    const { url } = await depot(() => undefined);
    const error = await failure(createDepotClient({ baseUrl: url, idleTimeoutMs: 300 }).depends("evil@1.0.0"));
    expect(error.code).toBe("DEADLINE_EXCEEDED");
    expect(error.message).toMatch(/no answer within 0.3 s/);
  });
});
