/**
 * The protobuf binary size of a LogItem, computed from its fields without encoding it:
 * the message limit is about that size, and items arrive decoded (Connect, gRPC-Web).
 */
import type { LogItem } from "../../gen/runner/v1/runner_pb.js";

/** Bytes of a varint (a negative int32 takes 10); O(1) below 2^21, else O(log value). */
export function varintSize(value: number): number {
  if (value < 0) return 10;
  if (value < 0x80) return 1;
  if (value < 0x4000) return 2;
  if (value < 0x200000) return 3;
  let size = 4;
  for (let rest = Math.floor(value / 0x200000); rest >= 0x80; rest = Math.floor(rest / 0x80)) size++;
  return size;
}

// The last string measured and its field size: the request ID, the same (often the same
// string object, see runner/protocol/decoder.ts) on every item of a call.
let lastValue = "";
let lastSize = 0;

/** Bytes of a string field (tag, length, UTF-8 text); absent when empty. O(length). */
function stringField(value: string): number {
  if (value.length === 0) return 0;
  if (value === lastValue) return lastSize;
  const len = Buffer.byteLength(value, "utf8");
  const size = 1 + varintSize(len) + len;
  if (value.length <= 64) {
    lastValue = value;
    lastSize = size;
  }
  return size;
}

/**
 * Bytes of an item in protobuf binary form (the message size the limit is about);
 * `lineBytes`: UTF-8 size of a log item's line (the caller has it already). O(1) for a
 * log item past the line's size, O(length of the strings) for an end item or a run.
 */
export function encodedSize(item: LogItem, lineBytes: number): number {
  let size = stringField(item.requestId);
  let inner = 0;
  if (item.event.case === "log") {
    return logItemSize(item.requestId, lineBytes, item.event.value.stderr);
  } else if (item.event.case === "end") {
    const end = item.event.value;
    inner =
      (end.exitCode !== 0 ? 1 + varintSize(end.exitCode) : 0) +
      (end.success ? 2 : 0) +
      stringField(end.repoUrl) +
      stringField(end.commitSha);
  } else if (item.event.case === "run") {
    // O(lines): each line's field, then the stream and the time.
    const run = item.event.value;
    for (const line of run.lines) {
      const len = Buffer.byteLength(line, "utf8");
      inner += 1 + varintSize(len) + len;
    }
    inner += (run.stderr ? 2 : 0) + (run.timeUnixNano !== 0n ? 9 : 0);
  } else {
    return size;
  }
  size += 1 + varintSize(inner) + inner;
  return size;
}

/**
 * Bytes of a log item (request ID, a line of `lineBytes` UTF-8 bytes, its stream) in
 * protobuf binary form, as {@link encodedSize} counts it. O(1) past the request ID's size.
 */
export function logItemSize(requestId: string, lineBytes: number, stderr: boolean): number {
  const inner = (lineBytes === 0 ? 0 : 1 + varintSize(lineBytes) + lineBytes) + (stderr ? 2 : 0);
  return stringField(requestId) + 1 + varintSize(inner) + inner;
}
