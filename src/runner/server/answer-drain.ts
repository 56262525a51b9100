/**
 * A bound on how long a stream may stay open once its answer is written. The last frames
 * (the Ack's DATA, then the trailers) leave only as the client's flow-control window lets
 * them: a client that announces a window of 0, or never reads, kept every answered stream
 * open for the life of its connection (up to its 1,000 streams, with a made-up token: a call
 * with zero items is answered ok), and on the raw stream entry each counted as a call in
 * flight that held a shutdown up. Such a stream is cancelled {@link ANSWER_DRAIN_MS} after
 * its answer was written.
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
