/**
 * An upload's body for the depot's additions (depot/transactions/additions.ts): streamed, never buffered
 * whole, whichever host delivered it.
 */
import type { UploadBody } from "./additions.js";
import { takeNativeRequestBody } from "../server/native-body.js";
import { contentLength } from "../server/request-headers.js";
import { webChunks } from "../server/web-streams.js";

/**
 * The request body as a stream that is never buffered whole; `empty` after peeking one
 * chunk. From a Node host (depot/server/node-handler.ts) the chunks are the IncomingMessage's own
 * Buffers; elsewhere they come from the Request's Web stream. `count` gets the bytes read
 * once, when the body ends or is dropped.
 */
export async function uploadBody(request: Request, count: (bytes: number) => void): Promise<UploadBody> {
  const length = contentLength(request);
  const nothing = (async function* () {})();
  if (length === 0) return { empty: true, chunks: nothing, length };
  const source = takeNativeRequestBody(request) ?? (request.body ? webChunks(request.body) : null);
  if (source === null) return { empty: true, chunks: nothing, length };
  const iterator = source[Symbol.asyncIterator]();
  let first = await iterator.next();
  while (!first.done && first.value.byteLength === 0) first = await iterator.next();
  if (first.done) return { empty: true, chunks: nothing, length };
  const head = first.value;
  async function* chunks(): AsyncIterable<Uint8Array> {
    let bytes = head.byteLength;
    try {
      yield head;
      for (;;) {
        const next = await iterator.next();
        if (next.done) return;
        bytes += next.value.byteLength;
        yield next.value;
      }
    } finally {
      count(bytes);
      await iterator.return?.();
    }
  }
  return { empty: false, chunks: chunks(), length };
}
