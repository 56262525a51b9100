/**
 * The S3 blob store against a hostile or stalled endpoint on 127.0.0.1 (an attack round, 2026-12-02): one that
 * accepts and never answers held a depot request for as long as the socket lived, and one that answers 500 with a
 * 16 MiB body took a depot from 116 to 1,374 MB of RSS (the SDK read it whole, once per attempt) and came back in the
 * problem's detail. Now the adapter's client has timeouts, reads at most 64 KiB of an error body, and names a
 * failure by its kind and status only. A real S3 server (s3rver, or the radosgw of RUNNER_DEPOT_TEST_S3) shows the
 * default timeouts are the client's.
 */
import { createServer as createHttpServer, type Server as HttpServer } from "node:http";
import { createServer as createTcpServer, type Server as TcpServer, type Socket } from "node:net";
import type { AddressInfo } from "node:net";
import { HeadBucketCommand, type S3Client } from "@aws-sdk/client-s3";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { createS3BlobStore } from "../../../src/adapters/s3/index.js";
import { S3_CONNECT_TIMEOUT_MS, S3_IDLE_TIMEOUT_MS, createS3Client } from "../../../src/adapters/s3/client.js";
import { collectAll, sha256Digest } from "../../../src/testing/helpers.js";
import { fixtureFor, startS3, type S3Fixture } from "../../fixtures/backends.js";
import { tempDir } from "../../fixtures/depot.js";
import { failure } from "../../fixtures/errors.js";

const MiB = 2 ** 20;
let servers: Array<HttpServer | TcpServer> = [];
const sockets = new Set<Socket>();
let spool: Awaited<ReturnType<typeof tempDir>>;

afterEach(async () => {
  for (const s of sockets) s.destroy();
  sockets.clear();
  for (const s of servers) await new Promise((r) => s.close(r));
  servers = [];
});

beforeAll(async () => {
  spool = await tempDir("hostile-s3-spool-");
});
afterAll(async () => {
  await spool?.cleanup();
});

/** An endpoint that accepts connections and never answers. */
async function silent(): Promise<string> {
  const server = createTcpServer((socket) => {
    sockets.add(socket);
    socket.on("error", () => undefined);
  });
  servers.push(server);
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

/** An endpoint answering every request `status` with `bodyBytes` of XML-ish text; `sent` counts what it wrote. */
async function flooding(
  bodyBytes: number,
  status = 500,
): Promise<{ url: string; sent: { bytes: number; requests: number } }> {
  const sent = { bytes: 0, requests: 0 };
  const chunk = Buffer.alloc(64 * 1024, "E");
  const server = createHttpServer((req, res) => {
    sent.requests++;
    req.resume();
    res.writeHead(status, { "content-type": "application/xml" });
    res.write("<Error><Code>InternalError</Code><Message>");
    let written = 0;
    const pump = () => {
      while (written < bodyBytes && !res.destroyed) {
        written += chunk.length;
        sent.bytes += chunk.length;
        if (!res.write(chunk)) return void res.once("drain", pump);
      }
      res.end("</Message></Error>");
    };
    res.on("close", () => res.destroy());
    pump();
  });
  servers.push(server);
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, sent };
}

/** The options of a client's request handler, as resolved once it has sent a request. */
function handlerConfig(client: S3Client): Record<string, unknown> {
  return (
    client.config.requestHandler as unknown as { httpHandlerConfigs(): Record<string, unknown> }
  ).httpHandlerConfigs();
}

describe("the S3 blob store against a hostile endpoint", () => {
  it("an endpoint that never answers fails STORE_UNAVAILABLE once the socket is idle past the timeout", async () => {
    const url = await silent();
    const { clientConfig } = fixtureFor(url, "bucket", { maxAttempts: 2, s3rver: true });
    const blobs = createS3BlobStore({
      spoolDir: spool.dir,
      bucket: "bucket",
      clientConfig: { ...clientConfig, requestHandler: { socketTimeout: 300 } },
    });
    try {
      for (const call of [() => blobs.statBlob(sha256Digest("x")), () => blobs.getBlob(sha256Digest("x"))]) {
        const error = await failure(call());
        expect(error.code).toBe("STORE_UNAVAILABLE");
        expect(error.message).toMatch(/^S3 failed: TimeoutError/);
      }
      // The store's client is the adapter's: the connect timeout it was not given is the default.
      expect(handlerConfig(blobs.client)).toMatchObject({
        connectionTimeout: S3_CONNECT_TIMEOUT_MS,
        socketTimeout: 300,
      });
    } finally {
      await blobs.close?.();
    }
  });

  it("a 500 with a 64 MiB body is read 64 KiB at most an attempt, and its text stays out of the error", async () => {
    const { url, sent } = await flooding(64 * MiB);
    const { clientConfig } = fixtureFor(url, "bucket", { maxAttempts: 3, s3rver: true });
    const blobs = createS3BlobStore({ spoolDir: spool.dir, bucket: "bucket", clientConfig });
    try {
      const error = await failure(blobs.getBlob(sha256Digest("x")));
      expect(error.code).toBe("STORE_UNAVAILABLE");
      // The cut body is no longer XML the SDK can read a code from: the kind is its generic one.
      expect(error.message).toMatch(/^S3 failed: \w+ \(HTTP 500\)$/);
      expect(sent.requests).toBe(3);
      // Each attempt's socket is closed after 64 KiB: the endpoint hands over what the socket buffers take, not 64 MiB.
      expect(sent.bytes).toBeLessThan(3 * 16 * MiB);
    } finally {
      await blobs.close?.();
    }
  });
});

describe("an endpoint whose successful answer never ends", () => {
  it("a listing answered 200 with 256 MiB is read 16 MiB at most and fails STORE_UNAVAILABLE", async () => {
    const { url, sent } = await flooding(256 * MiB, 200);
    const { clientConfig } = fixtureFor(url, "bucket", { maxAttempts: 1, s3rver: true });
    const blobs = createS3BlobStore({ spoolDir: spool.dir, bucket: "bucket", clientConfig });
    try {
      const error = await failure(collectAll(blobs.listBlobs()));
      expect(error.code).toBe("STORE_UNAVAILABLE");
      expect(sent.bytes).toBeLessThan(64 * MiB);
    } finally {
      await blobs.close?.();
    }
  });
});

describe("an endpoint that ignores Range", () => {
  it("a read far into a 64 MiB blob is refused, not downloaded whole to skip to it", async () => {
    const sent = { bytes: 0 };
    const chunk = Buffer.alloc(64 * 1024, "b");
    const server = createHttpServer((req, res) => {
      req.resume();
      // Range ignored: the whole object, every time.
      res.writeHead(200, { "content-type": "application/octet-stream", "content-length": String(64 * MiB) });
      const pump = () => {
        while (sent.bytes < 64 * MiB && !res.destroyed) {
          sent.bytes += chunk.length;
          if (!res.write(chunk)) return void res.once("drain", pump);
        }
        res.end();
      };
      res.on("close", () => res.destroy());
      pump();
    });
    servers.push(server);
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    const { clientConfig } = fixtureFor(`http://127.0.0.1:${(server.address() as AddressInfo).port}`, "bucket", {
      s3rver: true,
    });
    const blobs = createS3BlobStore({ spoolDir: spool.dir, bucket: "bucket", clientConfig });
    try {
      const error = await failure(blobs.getBlob(sha256Digest("x"), { start: 60 * MiB, end: 60 * MiB }));
      expect(error.code).toBe("STORE_UNAVAILABLE");
      expect(error.message).toContain("S3 ignored the Range");
      expect(sent.bytes).toBeLessThan(32 * MiB);
    } finally {
      await blobs.close?.();
    }
  });
});

describe("the adapter's own client", () => {
  let s3: S3Fixture;
  beforeAll(async () => {
    s3 = await startS3();
  }, 60_000);
  afterAll(async () => {
    await s3?.close();
  });

  it("connects within 5 s and lets a socket idle 90 s at most unless the configuration says otherwise", async () => {
    const client = createS3Client(s3.clientConfig);
    const tuned = createS3Client({ ...s3.clientConfig, requestHandler: { socketTimeout: 1_234 } });
    // An option given as undefined is not given: the default stays.
    const unset = createS3Client({ ...s3.clientConfig, requestHandler: { socketTimeout: undefined } });
    try {
      await client.send(new HeadBucketCommand({ Bucket: s3.bucket }));
      await tuned.send(new HeadBucketCommand({ Bucket: s3.bucket }));
      await unset.send(new HeadBucketCommand({ Bucket: s3.bucket }));
      expect(handlerConfig(client)).toMatchObject({
        connectionTimeout: S3_CONNECT_TIMEOUT_MS,
        socketTimeout: S3_IDLE_TIMEOUT_MS,
      });
      expect(handlerConfig(tuned)).toMatchObject({ connectionTimeout: S3_CONNECT_TIMEOUT_MS, socketTimeout: 1_234 });
      expect(handlerConfig(unset)).toMatchObject({ socketTimeout: S3_IDLE_TIMEOUT_MS });
    } finally {
      client.destroy();
      tuned.destroy();
      unset.destroy();
    }
  });
});
