/** Properties of the compressed first message's peek (runner/server/first-message-peek.ts): any LogItem, any size. */
import * as zlib from "node:zlib";
import { create, toBinary } from "@bufbuild/protobuf";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { LogItemSchema } from "../../../src/gen/runner/v1/runner_pb.js";
import { PEEK_BYTES, peekDecompressed, requestIdAtStart } from "../../../src/runner/server/first-message-peek.js";

const item = fc.record({
  requestId: fc.string({ maxLength: 300, unit: "grapheme" }),
  line: fc.string({ maxLength: 5000 }),
  repeat: fc.integer({ min: 1, max: 200 }),
  end: fc.boolean(),
});

describe("first-message peek", () => {
  it("finds the request_id of any serialized LogItem whose field 1 fits in the peeked bytes, and never reads more than PEEK_BYTES", async () => {
    await fc.assert(
      fc.asyncProperty(item, fc.constant("gzip"), async (v, encoding) => {
        const bytes = toBinary(
          LogItemSchema,
          create(LogItemSchema, {
            requestId: v.requestId,
            event: v.end
              ? { case: "end", value: { exitCode: 1 } }
              : { case: "log", value: { line: v.line.repeat(v.repeat) } },
          }),
        );
        const packed = zlib.gzipSync(bytes);
        const peeked = await peekDecompressed(encoding, packed)!;
        expect(peeked.length).toBeLessThanOrEqual(PEEK_BYTES);
        expect(Buffer.compare(peeked, Buffer.from(bytes).subarray(0, peeked.length))).toBe(0);
        expect(peeked.length).toBe(Math.min(PEEK_BYTES, bytes.length));
        const idBytes = Buffer.byteLength(v.requestId, "utf8");
        const found = requestIdAtStart(peeked);
        if (idBytes === 0) expect(found).toBeNull();
        else if (idBytes + 3 <= PEEK_BYTES) expect(found).toBe(v.requestId);
      }),
      { numRuns: 200 },
    );
  });

  it("requestIdAtStart never throws and never reads past its input, for any bytes", () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 300 }), (bytes) => {
        const found = requestIdAtStart(bytes);
        if (found !== null) expect(Buffer.byteLength(found, "utf8")).toBeLessThanOrEqual(bytes.length);
      }),
    );
  });

  it("corrupt input rejects; any encoding but gzip gives null", async () => {
    await expect(peekDecompressed("gzip", Buffer.from("not gzip at all"))!).rejects.toThrow();
    expect(peekDecompressed("zstd", Buffer.alloc(4))).toBeNull();
    expect(peekDecompressed("br", Buffer.alloc(4))).toBeNull();
  });
});
