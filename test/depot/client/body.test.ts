/** Properties of the client's bounded body reader (depot/client/body.ts), over any chunking of any body. */
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { readBounded } from "../../../src/depot/client/body.js";
import { failure } from "../../fixtures/errors.js";

/** A response streaming `chunks` as they are. */
const responseOf = (chunks: Uint8Array[]) =>
  new Response(
    new ReadableStream<Uint8Array>({
      start(controller) {
        for (const chunk of chunks) controller.enqueue(chunk);
        controller.close();
      },
    }),
  );

const chunksArb = fc.array(fc.uint8Array({ maxLength: 64 }), { maxLength: 20 });
const limits = (maxBytes: number) => ({ maxBytes, idleMs: 1000, totalMs: 5000 });

describe("readBounded", () => {
  it("answers every byte, in order, of a body within the bound, and refuses one past it", async () => {
    await fc.assert(
      fc.asyncProperty(chunksArb, fc.nat({ max: 1500 }), async (chunks, maxBytes) => {
        const whole = Buffer.concat(chunks);
        if (whole.length <= maxBytes) {
          const { bytes, truncated } = await readBounded(responseOf(chunks), "GET /x", limits(maxBytes));
          expect(truncated).toBe(false);
          expect(bytes.equals(whole)).toBe(true);
        } else {
          const error = await failure(readBounded(responseOf(chunks), "GET /x", limits(maxBytes)));
          expect(error.code).toBe("TOO_LARGE");
        }
      }),
    );
  });

  it("with truncate, answers exactly the first maxBytes of a longer body", async () => {
    await fc.assert(
      fc.asyncProperty(chunksArb, fc.nat({ max: 1500 }), async (chunks, maxBytes) => {
        const whole = Buffer.concat(chunks);
        const { bytes, truncated } = await readBounded(responseOf(chunks), "GET /x", limits(maxBytes), true);
        expect(truncated).toBe(whole.length > maxBytes);
        expect(bytes.equals(whole.subarray(0, Math.min(maxBytes, whole.length)))).toBe(true);
      }),
    );
  });
});
