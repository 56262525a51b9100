/**
 * The number of open streams of a runner server's HTTP/2 session (and whether its windows
 * were widened, with the server's count of widened sessions), kept on each stream (a
 * symbol) so that the session's shared "stream" and "close" listeners need no closure per
 * stream, and so that code holding only a request can ask how busy its connection is
 * (runner/server/flow-window.ts). Only `startRunnerServer` counts; a host's own HTTP/2 server does not.
 */
import type * as http2 from "node:http2";

/** The open-stream count of a stream's session. */
export const kSessionInfo = Symbol("runner session info");

/**
 * A server's count of widened sessions (runner/server/flow-window.ts), shared by all its sessions: the
 * windows a busy connection is given are bounded server-wide, not only per connection.
 */
export interface WideWindows {
  /** Sessions widened now (counted down when a widened session closes). */
  count: number;
  /** Most sessions widened at once. */
  readonly max: number;
  /** The service's store backlog, when known: no session widens while it is over budget. */
  readonly backlog: { readonly over: boolean } | undefined;
}

/** What a counted stream carries under {@link kSessionInfo}. */
export interface SessionInfo {
  /** Streams of the session opened and not yet closed. */
  streams: number;
  /** When the session's last stream closed (or it opened), for the idle-connection limit; 0 while it has streams. */
  idleSince: number;
  /** True once the session's windows were widened (it holds one of `wide.max`). */
  widened: boolean;
  /** The server's widened-session count. */
  wide: WideWindows;
}

/** A stream `startRunnerServer` counts. */
export type CountedStream = { [kSessionInfo]: SessionInfo };

/**
 * The counted session info of `stream`, or undefined when nobody counts (a host's own
 * HTTP/2 server). O(1).
 *
 * @example
 * const info = sessionInfoOf(req.stream);
 * if (info !== undefined && !info.widened) { … }
 */
export function sessionInfoOf(stream: http2.Http2Stream | undefined): SessionInfo | undefined {
  return (stream as Partial<CountedStream> | undefined)?.[kSessionInfo];
}
