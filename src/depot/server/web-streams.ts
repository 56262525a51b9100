/**
 * The two bridges between Web streams and async iterables that the portable `fetch` path
 * and the native Node handler share. Both are pull-based: nothing is read ahead of the
 * consumer, so back-pressure reaches the socket or the store.
 */

/**
 * The chunks of a Web stream as an async iterable; the reader's lock is released when iteration stops.
 * With `closing` (a Node response), its `close` cancels the stream at once, so a stream that waits
 * for data (the console's live tail) learns that its client left without writing first.
 */
export async function* webChunks(
  body: ReadableStream<Uint8Array>,
  closing?: { once(event: "close", listener: () => void): unknown; off(event: "close", listener: () => void): unknown },
): AsyncGenerator<Uint8Array> {
  const reader = body.getReader();
  const onClose = () => void reader.cancel().catch(() => undefined);
  closing?.once("close", onClose);
  try {
    for (;;) {
      const next = await reader.read();
      if (next.done) return;
      yield next.value;
    }
  } finally {
    closing?.off("close", onClose);
    reader.releaseLock();
  }
}

/**
 * A pull-based Web stream over an async iterable made on the first pull: nothing is read
 * ahead of the client, and nothing at all when nobody reads it (a Node host that takes the
 * native body instead, or a host route that never touches `request.body`).
 */
export function lazyWebStream(open: () => AsyncIterable<Uint8Array>): ReadableStream<Uint8Array> {
  let iterator: AsyncIterator<Uint8Array> | undefined;
  return new ReadableStream<Uint8Array>(
    {
      async pull(controller) {
        iterator ??= open()[Symbol.asyncIterator]();
        const next = await iterator.next();
        if (next.done) controller.close();
        else controller.enqueue(next.value);
      },
      async cancel(reason) {
        await iterator?.return?.(reason);
      },
    },
    { highWaterMark: 0 },
  );
}
