/**
 * The S3 log archive's Range reads against an endpoint that ignores Range (a proxy, a CDN,
 * a partial S3 clone): a fake S3 endpoint on 127.0.0.1 answers every GET with 200 and the
 * whole 64 MiB object. A 32-byte head read takes its 32 bytes and drops the connection; a
 * tail read is refused instead of downloading the object. The endpoint counts the bytes
 * it managed to write (the socket buffers hold a few MB at most).
 */
import http from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createS3LogArchive } from "../../../src/adapters/s3/index.js";
import { RunnerDepotError } from "../../../src/errors.js";

const SIZE = 64 * 1024 * 1024;
const BLOCK = 64 * 1024;
/** Byte i of the object is i mod 251, so a read shows which bytes it got. */
function block(offset: number): Buffer {
  const out = Buffer.allocUnsafe(BLOCK);
  for (let i = 0; i < BLOCK; i++) out[i] = (offset + i) % 251;
  return out;
}

describe("S3 log archive: an endpoint that ignores Range", () => {
  let server: http.Server;
  let written = 0;
  let requests = 0;
  let endpoint: string;
  beforeAll(async () => {
    server = http.createServer((req, res) => {
      requests++;
      res.writeHead(200, { "content-length": String(SIZE), "content-type": "application/octet-stream" });
      let offset = 0;
      const pump = () => {
        while (offset < SIZE) {
          const chunk = block(offset);
          offset += BLOCK;
          written += BLOCK;
          if (!res.write(chunk)) return void res.once("drain", pump);
        }
        res.end();
      };
      res.on("close", () => (offset = SIZE));
      pump();
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    endpoint = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(async () => {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  });

  const archive = () =>
    createS3LogArchive({
      bucket: "b",
      clientConfig: {
        endpoint,
        region: "us-east-1",
        forcePathStyle: true,
        credentials: { accessKeyId: "x", secretAccessKey: "y" },
      },
    });

  it("a head read takes the asked bytes and stops reading the body", async () => {
    const store = archive();
    written = 0;
    const bytes = await store.read("job.rdlog", 100, 132);
    expect(bytes).not.toBeNull();
    expect([...bytes!]).toEqual(Array.from({ length: 32 }, (_, i) => (100 + i) % 251));
    // Let the endpoint notice the dropped connection, then count what it wrote.
    await new Promise((r) => setTimeout(r, 200));
    expect(written).toBeLessThan(SIZE / 4);
    await store.close?.();
  });

  it("a tail read of a large object is refused UNAVAILABLE, not downloaded whole", async () => {
    const store = archive();
    written = 0;
    const before = requests;
    const error = await store.read("job.rdlog", SIZE - 32, SIZE).then(
      () => null,
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(RunnerDepotError);
    expect((error as RunnerDepotError).code).toBe("UNAVAILABLE");
    expect((error as Error).message).toMatch(/ignored the Range/);
    expect(requests).toBeGreaterThan(before);
    await new Promise((r) => setTimeout(r, 200));
    expect(written).toBeLessThan(SIZE / 4);
    await store.close?.();
  });
});
