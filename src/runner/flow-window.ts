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
 * 1–100 lines a second) never reaches that within one call (calls end after 20 s or
 * 1 MiB), so the memory an idle or slow stream can hold stays at 64 KiB.
 */
import type * as http2 from "node:http2";

/** Bytes one call must have received before its connection's windows are widened. */
export const BUSY_CALL_BYTES = 512 * 1024;
/** The widened windows (the connection's and each stream's). */
export const BUSY_WINDOW_BYTES = 1024 * 1024;

const widened = new WeakSet<http2.Http2Session>();

/**
 * Widens the windows of `session` once a call on it has received `callBytes` ≥
 * {@link BUSY_CALL_BYTES}; at most once per session. O(1).
 *
 * @example
 * widenWhenBusy(req.stream?.session, bytesReceivedThisCall);
 */
export function widenWhenBusy(session: http2.Http2Session | undefined, callBytes: number): void {
  if (callBytes < BUSY_CALL_BYTES || session === undefined || widened.has(session)) return;
  widened.add(session);
  if (session.destroyed || session.closed) return;
  try {
    // The connection's window at once (a WINDOW_UPDATE); each stream's through SETTINGS,
    // which also raises the window of the call already open (RFC 9113 §6.9.2).
    session.setLocalWindowSize(BUSY_WINDOW_BYTES);
    session.settings({ initialWindowSize: BUSY_WINDOW_BYTES });
  } catch {
    // A session closing under us, or SETTINGS not yet acknowledged: it stays narrow.
  }
}
