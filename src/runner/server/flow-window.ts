/**
 * HTTP/2 receive windows for busy runner connections. A connection starts with the protocol's 64 KiB windows
 * (per stream and for the connection), which bound what an idle or slow stream can leave buffered in the
 * server. A job streaming a heavy log, though, must then wait for a WINDOW_UPDATE every ~32 KiB (about 230
 * lines of 100 bytes): each one a wake-up of both processes.
 * Why: docs/decisions/runner-fleet-memory.md, "flow-window.ts: why connections widen".
 */
import type * as http2 from "node:http2";
import { sessionInfoOf } from "./session-streams.js";

/** Bytes one call must have received before its connection's windows are widened. */
export const BUSY_CALL_BYTES = 512 * 1024;
/** The widened windows (the connection's and each stream's). */
export const BUSY_WINDOW_BYTES = 1024 * 1024;
/** Open streams a connection may have to be widened, and its stream limit once it is. */
const BUSY_MAX_STREAMS = 16;

/**
 * Sessions a server widens at once for a store backlog budget of `queuedBytes`: one 1 MiB
 * window each, as many as the budget holds (at least one), so that what paused widened
 * streams can buffer is about the budget again, not a multiple of the number of jobs. O(1).
 *
 * @example
 * wideWindowSessions(32 * 1024 * 1024); // 32
 */
export function wideWindowSessions(queuedBytes: number): number {
  return Math.max(1, Math.floor(queuedBytes / BUSY_WINDOW_BYTES));
}

/**
 * Widens the windows of `stream`'s session once a call on it has received `callBytes` ≥
 * {@link BUSY_CALL_BYTES}, if the session has at most {@link BUSY_MAX_STREAMS} open streams
 * (counted by `startRunnerServer`; a stream nobody counts never widens), the server has a
 * widened-session slot free and its store backlog is within budget; at most once per
 * session. O(1).
 *
 * @example
 * widenWhenBusy(req.stream, bytesReceivedThisCall);
 */
export function widenWhenBusy(stream: http2.Http2Stream | undefined, callBytes: number): void {
  if (callBytes < BUSY_CALL_BYTES || stream === undefined) return;
  const info = sessionInfoOf(stream);
  // Uncounted, or widened already.
  if (info === undefined || info.widened) return;
  // Busy with many streams, every slot taken, or the store lagging: stay narrow; a later
  // chunk (of this call or another) may still widen.
  const wide = info.wide;
  if (info.streams > BUSY_MAX_STREAMS || wide.count >= wide.max || wide.backlog?.over === true) return;
  const session = stream.session;
  // A closed session would never give its slot back (its "close" has been, or is being, handled).
  if (session === undefined || session.destroyed || session.closed) return;
  info.widened = true;
  wide.count++;
  try {
    // The connection's window at once (a WINDOW_UPDATE); each stream's through SETTINGS,
    // which also raises the window of the calls already open (RFC 9113 §6.9.2), and lowers
    // the stream limit in the same frame so no more streams can join the wide windows.
    const limit = Math.min(session.localSettings.maxConcurrentStreams ?? BUSY_MAX_STREAMS, BUSY_MAX_STREAMS);
    session.setLocalWindowSize(BUSY_WINDOW_BYTES);
    session.settings({ initialWindowSize: BUSY_WINDOW_BYTES, maxConcurrentStreams: limit });
  } catch {
    // A session closing under us, or SETTINGS not yet acknowledged: it stays narrow (and
    // keeps its slot until it closes: retrying on every chunk would cost more than a slot).
  }
}
