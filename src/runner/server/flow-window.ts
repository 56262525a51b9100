/**
 * HTTP/2 receive windows for busy runner connections. A connection starts with the
 * protocol's 64 KiB windows (per stream and for the connection), which bound what an idle
 * or slow stream can leave buffered in the server. A job streaming a heavy log, though,
 * must then wait for a WINDOW_UPDATE every ~32 KiB (about 230 lines of 100 bytes): each
 * one a wake-up of both processes. Measured end to end (child → runJob → server, 300k
 * lines, memory store): ~1,500 context switches a side with 64 KiB windows, ~400 with
 * 1 MiB ones, at the same CPU per line.
 *
 * So a connection whose call, authenticated by a token (RequestReader.authenticated; a
 * Health call read on without one never counts), has received {@link BUSY_CALL_BYTES} gets 1 MiB windows
 * (connection and streams) for the rest of its life. A quiet job (a CI fleet's usual one:
 * 1–100 lines a second) never reaches that within one call (the agent cuts its calls
 * after at most 20 s or 4 MiB), so the memory an idle or slow stream can hold stays at 64 KiB.
 *
 * A stream's window bounds what it can leave buffered while the server does not read it
 * (a call waiting for its `authorize` hook, or paused behind a lagging store), so a
 * widened connection would let a client holding one job token pin 1 MiB in each of 1,000
 * streams. A connection is therefore widened only while it has at most
 * {@link BUSY_MAX_STREAMS} open streams, and the same SETTINGS frame lowers its
 * SETTINGS_MAX_CONCURRENT_STREAMS to that number (streams beyond it, even ones in flight,
 * are refused with REFUSED_STREAM; clients queue or retry): a widened connection holds at
 * most 16 × 1 MiB, the per-connection read budget.
 *
 * Server-wide, at most {@link wideWindowSessions}(`limits.queuedBytes`) connections are
 * widened at once (32 with the 32 MiB default), and none while the store backlog is over
 * its budget: while the backlog pauses the calls, each widened stream may leave up to 1 MiB
 * in Node's buffers, so fifty loud jobs on a lagging store held ~50 MiB beyond the budget
 * (~50 KiB per open stream of the fleet's heavy mix), and a host with many job tokens in
 * hostile hands could have 1,000 connections × 16 MiB of window. Widening cannot speed a
 * store that lags; it only buffers more. A connection refused a slot keeps 64 KiB and may
 * widen on a later chunk once a widened session has closed (its slot is given back then).
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
