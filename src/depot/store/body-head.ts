/**
 * The start of an upload's body, read to decide where it goes: a store that keeps small blobs as rows (the fs
 * store's records.db, PostgreSQL beside S3) reads up to its threshold, then stores the whole body as a row or sends
 * the head and the rest on to its large-blob path.
 */
import { RunnerDepotError } from "../../errors.js";

/** The start of a body: all of it when `rest` is undefined, else its first chunks past the threshold. */
export interface BodyHead {
  chunks: Uint8Array[];
  size: number;
  /** The body's remaining chunks; undefined when the whole body is in `chunks` (a small blob). */
  rest?: AsyncIterator<Uint8Array>;
}

/**
 * Reads `body` until it ends or passes `threshold` bytes; TOO_LARGE (the body given back) as soon as `maxBytes` is
 * passed. O(threshold + one chunk) memory.
 *
 * @example
 * const head = await readBodyHead(body, 16 * 1024, options.maxBytes);
 * if (head.rest) await large.putBlob(replayBodyHead(head));
 */
export async function readBodyHead(
  body: AsyncIterable<Uint8Array>,
  threshold: number,
  maxBytes?: number,
): Promise<BodyHead> {
  const iterator = body[Symbol.asyncIterator]();
  const chunks: Uint8Array[] = [];
  let size = 0;
  for (;;) {
    const next = await iterator.next();
    if (next.done) return { chunks, size };
    size += next.value.byteLength;
    if (maxBytes !== undefined && size > maxBytes) {
      await iterator.return?.();
      throw new RunnerDepotError("TOO_LARGE", `Blob is larger than ${maxBytes} bytes`);
    }
    chunks.push(next.value);
    if (size > threshold) return { chunks, size, rest: iterator };
  }
}

/** The whole body again: the head's chunks, then the rest of the iterator. */
export async function* replayBodyHead(head: BodyHead): AsyncIterable<Uint8Array> {
  yield* head.chunks;
  if (!head.rest) return;
  for (;;) {
    const next = await head.rest.next();
    if (next.done) return;
    yield next.value;
  }
}
