/**
 * Compressed calls on the connect path (issue 31, item 7): a compressed first message is
 * not decompressed before its token is checked. An 8 MiB gzip bomb sent with a made-up
 * token over raw HTTP/2 is refused PERMISSION_DENIED on the request ID read from its first
 * 256 decompressed bytes (before: connect decompressed it, up to 1 MiB); brotli requests,
 * whose decoder cannot stop that early, are refused UNIMPLEMENTED before any decoding.
 */
import * as zlib from "node:zlib";
import { randomUUID } from "node:crypto";
import { toBinary } from "@bufbuild/protobuf";
import { Code } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { LogItemSchema, type LogItem } from "../../../src/gen/runner/v1/runner_pb.js";
import { createRunnerService, mintJobToken, startRunnerServer } from "../../../src/runner/index.js";
import { createMemoryQueue } from "../../../src/adapters/memory/index.js";
import { end, line, storedTexts } from "../../fixtures/runner-service.js";
import { connect, openCall } from "../../fixtures/runner-raw-calls.js";

const SECRET = "connect-path-secret-0123456789abcdef";

/** A compressed frame (flag 1) of `item` under `encoding`. */
function compressedFrame(item: LogItem | Uint8Array, encoding: "br" | "gzip"): Buffer {
  const bytes = item instanceof Uint8Array ? item : toBinary(LogItemSchema, item);
  const packed = encoding === "br" ? zlib.brotliCompressSync(bytes) : zlib.gzipSync(bytes);
  const out = Buffer.alloc(5 + packed.length);
  out[0] = 1;
  out.writeUInt32BE(packed.length, 1);
  out.set(packed, 5);
  return out;
}

const CASES: Array<[string, string]> = [
  ["grpc", "grpc-encoding"],
  ["grpc-web", "grpc-encoding"],
  ["connect", "connect-content-encoding"],
];

describe("runner connect path: no decompression before the token is checked (issue 31, item 7)", () => {
  for (const [protocol, header] of CASES) {
    it(`${protocol}: an 8 MiB gzip bomb with a made-up token is refused PERMISSION_DENIED unread; a brotli one UNIMPLEMENTED; a valid gzip call is stored`, async () => {
      const runner = createRunnerService(createMemoryQueue(), { secret: SECRET });
      const server = await startRunnerServer(runner, { port: 0 });
      const session = connect(server.url);
      try {
        const id = randomUUID();
        const bomb = line(id, "a".repeat(8 * 1024 * 1024));
        const call = openCall(session, protocol, "made-up-token", { [header]: "gzip" });
        call.stream.end(compressedFrame(bomb, "gzip"));
        // Before: RESOURCE_EXHAUSTED, "larger than configured readMaxBytes 1048576 after decompression".
        expect((await call.status).code).toBe(Code.PermissionDenied);

        const brotli = compressedFrame(bomb, "br");
        expect(brotli.length).toBeLessThan(200);
        const brCall = openCall(session, protocol, "made-up-token", { [header]: "br" });
        brCall.stream.end(brotli);
        const brStatus = await brCall.status;
        expect(brStatus.code).toBe(Code.Unimplemented);
        expect(brStatus.message).toMatch(/gzip/);

        const good = openCall(session, protocol, mintJobToken(SECRET, id), { [header]: "gzip" });
        good.stream.end(Buffer.concat([compressedFrame(line(id, "packed"), "gzip"), compressedFrame(end(id), "gzip")]));
        expect((await good.status).code).toBe(0);
        expect(await storedTexts(runner.logs, id)).toEqual(["packed"]);
      } finally {
        session.destroy();
        await server.close();
        await runner.close();
      }
    });
  }

  it("a compressed first message that does not begin with its request_id is refused INVALID_ARGUMENT", async () => {
    const runner = createRunnerService(createMemoryQueue(), { secret: SECRET });
    const server = await startRunnerServer(runner, { port: 0 });
    const session = connect(server.url);
    try {
      const id = randomUUID();
      // The log field (2) first, then request_id (1): valid protobuf, in an order no serializer writes.
      const logFirst = Buffer.concat([
        toBinary(LogItemSchema, line("", "a".repeat(8 * 1024 * 1024))),
        Buffer.from([0x0a, 36]),
        Buffer.from(id),
      ]);
      const call = openCall(session, "grpc", "made-up-token", { "grpc-encoding": "gzip" });
      call.stream.end(compressedFrame(logFirst, "gzip"));
      const status = await call.status;
      expect(status.code).toBe(Code.InvalidArgument);
      expect(status.message).toMatch(/must begin with its request_id/);
    } finally {
      session.destroy();
      await server.close();
      await runner.close();
    }
  });
});
