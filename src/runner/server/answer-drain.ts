/**
 * A bound on how long a stream may stay open once its answer is written.
 * Why: docs/decisions/runner-server.md, "answer-drain.ts: why answered streams are cut".
 */
import * as http2 from "node:http2";

/**
 * Time a written answer gets to leave. A client that reads at all takes milliseconds (the
 * answer is a few bytes; the session's own outbound queue is what delays it, and the
 * NO_ERROR reset after trailers waits ~2 s for that, runner/server/handler.ts); generous for a loaded host.
 */
const ANSWER_DRAIN_MS = 5_000;

/**
 * Cancels `stream` (RST_STREAM CANCEL) if it is still open {@link ANSWER_DRAIN_MS} from now.
 * One unref'd timer per answered call, gone after that time (not per open call); it holds
 * the stream through a WeakRef, so a stream that closed as usual is not kept for those
 * seconds (an open one is held by its session anyway). O(1).
 *
 * @example
 * stream.end(); // the answer is written
 * cancelIfNotDrained(stream);
 */
export function cancelIfNotDrained(stream: http2.Http2Stream | undefined): void {
  if (stream === undefined || stream.closed || stream.destroyed) return;
  setTimeout(cancelIfOpen, ANSWER_DRAIN_MS, new WeakRef(stream)).unref();
}

function cancelIfOpen(ref: WeakRef<http2.Http2Stream>): void {
  const stream = ref.deref();
  if (stream === undefined || stream.closed || stream.destroyed) return;
  try {
    stream.close(http2.constants.NGHTTP2_CANCEL);
  } catch {
    // The stream went away meanwhile.
  }
}
