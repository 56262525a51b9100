/**
 * The number of open streams of a runner server's HTTP/2 session, kept on each stream (a
 * symbol) so that the session's shared "stream" and "close" listeners need no closure per
 * stream, and so that code holding only a request can ask how busy its connection is
 * (flow-window.ts). Only `startRunnerServer` counts; a host's own HTTP/2 server does not.
 */
import type * as http2 from "node:http2";

/** The open-stream count of a stream's session. */
export const kSessionInfo = Symbol("runner session info");

/** What a counted stream carries under {@link kSessionInfo}. */
export interface SessionInfo {
  /** Streams of the session opened and not yet closed. */
  streams: number;
}

/** A stream `startRunnerServer` counts. */
export type CountedStream = { [kSessionInfo]: SessionInfo };

/**
 * Open streams on `stream`'s session, or undefined when nobody counts them (a host's own
 * HTTP/2 server). O(1).
 *
 * @example
 * const open = openStreamsOf(req.stream);
 */
export function openStreamsOf(stream: http2.Http2Stream | undefined): number | undefined {
  return (stream as Partial<CountedStream> | undefined)?.[kSessionInfo]?.streams;
}
