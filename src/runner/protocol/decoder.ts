/**
 * A specialised decoder for the common runner.v1 `LogItem` (a request ID and a log line, or a run of lines),
 * the mirror of runner/protocol/encoder.ts. It returns exactly what protobuf-es `fromBinary(LogItemSchema, …)`
 * returns for the messages it handles, and `null` for everything else (end items, unknown
 * or repeated fields, invalid UTF-8, bad lengths), which the caller then hands to the
 * full parser, so errors and edge cases stay protobuf-es's. test/runner/protocol/decoder.test.ts
 * checks it against protobuf-es.
 */
import { isUtf8 } from "node:buffer";
import type { LogItem } from "../../gen/runner/v1/runner_pb.js";
import { NOT_ASCII, PLAIN_ASCII, asciiClass, asciiControlClass, hasJsonEscapesIn, viewOf } from "./byte-scan.js";
import { ReceivedLine } from "./received-line.js";
import { ReceivedRun } from "./received-run.js";
import { readNanos } from "./line-time.js";

/**
 * Decodes a length varint of at most 5 bytes (the decoder reads a one-byte length, the common case, inline: the
 * call was ~10 % of a decode's samples); -1 when malformed, out of range or not
 * minimally encoded (valid protobuf, but left to the general parser), so the caller can
 * step over it with lengthBytes(value).
 */
function readLength(buf: Uint8Array, pos: number, end: number): number {
  let value = 0;
  let shift = 0;
  for (let i = 0; i < 5 && pos + i < end; i++) {
    const byte = buf[pos + i]!;
    value += (byte & 0x7f) * 2 ** shift;
    if (byte < 0x80) return value <= 0x7fffffff && lengthBytes(value) === i + 1 ? value : -1;
    shift += 7;
  }
  return -1;
}

function lengthBytes(value: number): number {
  return value < 0x80 ? 1 : value < 0x4000 ? 2 : value < 0x200000 ? 3 : value < 0x10000000 ? 4 : 5;
}

/** UTF-8 text of a byte range, or null when it is not plainly valid (left to the strict parser). */
function text(buf: Buffer, start: number, end: number): string | null {
  if (start === end) return "";
  const s = buf.toString("utf8", start, end);
  // Node replaces invalid sequences with U+FFFD where protobuf-es refuses them; a real
  // U+FFFD in the text takes the slow path too, which decodes it the same.
  return s.indexOf("\ufffd") === -1 ? s : null;
}

// The last request ID decoded, as bytes (big-endian 32-bit words and a tail) and text:
// every item of a call carries the same one, so a hit (an O(length) compare, four bytes
// at a time) saves decoding a string per item.
let lastIdWords: number[] = [];
let lastIdTail: number[] = [];
let lastIdLength = -1;
let lastId = "";

function sameAsLastId(buf: Buffer, start: number, len: number): boolean {
  if (len !== lastIdLength) return false;
  const v = viewOf(buf);
  const words = lastIdWords;
  for (let w = 0; w < words.length; w++) if (v.getUint32(start + 4 * w) !== words[w]) return false;
  const tail = lastIdTail;
  const at = start + 4 * words.length;
  for (let t = 0; t < tail.length; t++) if (v.getUint8(at + t) !== tail[t]) return false;
  return true;
}

function requestIdText(buf: Buffer, start: number, end: number): string | null {
  const len = end - start;
  if (len > 0 && sameAsLastId(buf, start, len)) return lastId;
  const s = text(buf, start, end);
  if (s !== null && len > 0 && len <= 64) {
    const v = viewOf(buf);
    const words: number[] = [];
    let i = start;
    for (; i + 4 <= end; i += 4) words.push(v.getUint32(i));
    const tail: number[] = [];
    for (; i < end; i++) tail.push(v.getUint8(i));
    lastIdWords = words;
    lastIdTail = tail;
    lastIdLength = len;
    lastId = s;
  }
  return s;
}

/**
 * Decodes one LogItem with a log line from `buf[start, end)`, or returns null when the
 * message needs the general parser (as {@link decodeReceivedLine} does, and also for a
 * line holding a literal U+FFFD, which this message-level decoder leaves to protobuf-es).
 * The server's fast path keeps lines as bytes; this one serves as the tests' and fuzz
 * targets' reference in the shape protobuf-es gives. O(bytes).
 *
 * @example
 * const item = decodeLogItem(frame, 5, frame.length) ?? fromBinary(LogItemSchema, frame.subarray(5));
 */
export function decodeLogItem(buf: Buffer, start: number, end: number): LogItem | null {
  const received = decodeReceivedLine(buf, start, end);
  if (received === null) return null;
  const line = received.line;
  if (line.indexOf("\ufffd") !== -1) return null;
  const at = received.timeAt;
  return {
    $typeName: "runner.v1.LogItem",
    requestId: received.requestId,
    event: {
      case: "log",
      value: {
        $typeName: "runner.v1.LogChunk",
        line,
        stderr: received.stderr,
        timeUnixNano: at < 0 ? 0n : buf.readBigUInt64LE(at),
      },
    },
  };
}

/**
 * Decodes the same messages as {@link decodeLogItem} (and those whose line holds a literal
 * U+FFFD) into a {@link ReceivedLine}: the line stays bytes in `buf`, checked to be valid
 * UTF-8 (as protobuf-es checks it), and no string or message object is made for it.
 * Returns null for anything else, which the caller hands to the general parser. `unchanging`: the caller never
 * writes `buf` again (the server's received chunks), so the scan may remember per buffer what it found
 * (byte-scan.ts, asciiClass); a caller reusing one buffer in place leaves it false. O(bytes).
 *
 * @example
 * const item = decodeReceivedLine(frame, 5, frame.length) ?? fromBinary(LogItemSchema, frame.subarray(5));
 */
export function decodeReceivedLine(buf: Buffer, start: number, end: number, unchanging = false): ReceivedLine | null {
  let pos = start;
  let requestId: string | null = null;
  let lineStart = -1;
  let lineEnd = -1;
  let stderr = false;
  let seenLog = false;
  let timeAt = -1;
  let plainJson = false;
  while (pos < end) {
    const tag = buf[pos++]!;
    if (tag === 0x0a && requestId === null) {
      const len = pos < end && buf[pos]! < 0x80 ? buf[pos]! : readLength(buf, pos, end);
      if (len < 0) return null;
      pos += lengthBytes(len);
      if (pos + len > end) return null;
      requestId = requestIdText(buf, pos, pos + len);
      if (requestId === null) return null;
      pos += len;
    } else if (tag === 0x12 && !seenLog) {
      seenLog = true;
      const len = pos < end && buf[pos]! < 0x80 ? buf[pos]! : readLength(buf, pos, end);
      if (len < 0) return null;
      pos += lengthBytes(len);
      const stop = pos + len;
      if (stop > end) return null;
      let seenStderr = false;
      let seenTime = false;
      while (pos < stop) {
        const inner = buf[pos++]!;
        if (inner === 0x0a && lineStart < 0) {
          const n = pos < stop && buf[pos]! < 0x80 ? buf[pos]! : readLength(buf, pos, stop);
          if (n < 0) return null;
          pos += lengthBytes(n);
          if (pos + n > stop) return null;
          // The UTF-8 check protobuf-es makes, ASCII first (no view made); one pass that also
          // tells whether the line is its own JSON string body, kept for the log cap and the fs store.
          // Why: docs/decisions/runner-fastpath.md, "decoder.ts: validUtf8".
          const kind = n === 0 ? PLAIN_ASCII : asciiClass(buf, pos, pos + n, unchanging);
          if (kind === NOT_ASCII && !isUtf8(buf.subarray(pos, pos + n))) return null;
          plainJson = kind === PLAIN_ASCII;
          lineStart = pos;
          lineEnd = pos + n;
          pos += n;
        } else if (inner === 0x10 && !seenStderr && pos < stop && buf[pos]! <= 1) {
          seenStderr = true;
          stderr = buf[pos++] === 1;
        } else if (inner === 0x19 && !seenTime && pos + 8 <= stop) {
          // time_unix_nano, fixed64 (line-time.ts); repeated, it is left to protobuf-es (last one wins).
          seenTime = true;
          timeAt = pos;
          pos += 8;
        } else {
          return null;
        }
      }
    } else {
      return null;
    }
  }
  if (!seenLog) return null;
  if (lineStart < 0) lineStart = lineEnd = pos;
  return new ReceivedLine(
    requestId ?? "",
    buf,
    lineStart,
    lineEnd,
    stderr,
    timeAt < 0 ? 0 : readNanos(buf, timeAt),
    timeAt,
    plainJson || lineStart === lineEnd,
  );
}

/**
 * Decodes one LogItem carrying a run of lines (`LogRun`, field 4) from `buf[start, end)` into ONE
 * {@link ReceivedRun}: the whole run is checked here (its structure, each line valid UTF-8 as protobuf-es checks
 * it, stderr and time at most once each, no unknown field), and nothing is made a line; the lines stay bytes in
 * `buf` until the item reader walks them. Returns null for anything else (a log line, an end, two events, a
 * repeated or unknown field, invalid UTF-8, a non-minimal varint), which the caller hands to protobuf-es.
 * The number of lines is counted, not bounded: the service refuses an empty run or one over MAX_RUN_LINES.
 * `unchanging`: as for {@link decodeReceivedLine}. O(bytes), no allocation a line.
 *
 * @example
 * const item = decodeReceivedLine(frame, 5, end) ?? decodeReceivedRun(frame, 5, end) ?? fromBinary(…);
 */
export function decodeReceivedRun(buf: Buffer, start: number, end: number, unchanging = false): ReceivedRun | null {
  let pos = start;
  let requestId: string | null = null;
  let runStart = -1;
  let runEnd = -1;
  let firstLineAt = -1;
  let count = 0;
  let stderr = false;
  let timeAt = -1;
  let plainJson = true;
  let escapes = true;
  while (pos < end) {
    const tag = buf[pos++]!;
    if (tag === 0x0a && requestId === null) {
      const len = pos < end && buf[pos]! < 0x80 ? buf[pos]! : readLength(buf, pos, end);
      if (len < 0) return null;
      pos += lengthBytes(len);
      if (pos + len > end) return null;
      requestId = requestIdText(buf, pos, pos + len);
      if (requestId === null) return null;
      pos += len;
    } else if (tag === 0x22 && runStart < 0) {
      const len = pos < end && buf[pos]! < 0x80 ? buf[pos]! : readLength(buf, pos, end);
      if (len < 0) return null;
      pos += lengthBytes(len);
      const stop = pos + len;
      if (stop > end) return null;
      runStart = pos;
      runEnd = stop;
      // Whether the run's bytes hold a `"` or `\` at all: its own tag (0x22) is outside them, so most runs hold
      // neither, and each line then needs only the ASCII and control tests (asciiControlClass), not asciiClass's
      // per-buffer answer (which the run's tag in the same buffer always makes "yes"). O(run bytes), once a run.
      escapes = hasJsonEscapesIn(buf, pos, stop);
      let seenStderr = false;
      let seenTime = false;
      while (pos < stop) {
        const fieldAt = pos;
        const inner = buf[pos++]!;
        if (inner === 0x0a) {
          const n = pos < stop && buf[pos]! < 0x80 ? buf[pos]! : readLength(buf, pos, stop);
          if (n < 0) return null;
          pos += lengthBytes(n);
          if (pos + n > stop) return null;
          // The same UTF-8 check as decodeReceivedLine's, ASCII first; one flag for the whole run.
          const kind =
            n === 0
              ? PLAIN_ASCII
              : escapes
                ? asciiClass(buf, pos, pos + n, unchanging)
                : asciiControlClass(buf, pos, pos + n);
          if (kind === NOT_ASCII && !isUtf8(buf.subarray(pos, pos + n))) return null;
          if (kind !== PLAIN_ASCII) plainJson = false;
          if (firstLineAt < 0) firstLineAt = fieldAt;
          count++;
          pos += n;
        } else if (inner === 0x10 && !seenStderr && pos < stop && buf[pos]! <= 1) {
          seenStderr = true;
          stderr = buf[pos++] === 1;
        } else if (inner === 0x19 && !seenTime && pos + 8 <= stop) {
          // Repeated, it is left to protobuf-es (last one wins).
          seenTime = true;
          timeAt = pos;
          pos += 8;
        } else {
          return null;
        }
      }
    } else {
      return null;
    }
  }
  if (runStart < 0) return null;
  return new ReceivedRun(
    requestId ?? "",
    buf,
    runStart,
    runEnd,
    firstLineAt < 0 ? runEnd : firstLineAt,
    count,
    stderr,
    timeAt < 0 ? 0 : readNanos(buf, timeAt),
    timeAt,
    plainJson,
  );
}
