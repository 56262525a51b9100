/**
 * A run of lines (runner.v1 `LogRun`, docs/runner-protocol.md §2, "Runs of lines") as the gRPC fast path
 * received it: ONE object for the whole message, its lines left as bytes where they arrived. The decoder
 * (runner/protocol/decoder.ts, decodeReceivedRun) checked the whole run when it made it; the item reader
 * (runner/server/item-reader.ts) walks it and makes a {@link ReceivedLine} for each line only when the service
 * takes it. So before a call is authenticated a run costs one object, whatever its number of lines.
 * Why: docs/decisions/runner-fastpath.md, "received-run.ts: one object a run, walked lazily".
 */
import type { LogItem } from "../../gen/runner/v1/runner_pb.js";
import { ReceivedLine } from "./received-line.js";

/** Most lines a run may hold (docs/runner-protocol.md §7); a run over it, or an empty one, ends INVALID_ARGUMENT. */
export const MAX_RUN_LINES = 4096;

/** The name of the feature in `runner-accepts` (runner/service/contract.ts, ACCEPTS_HEADER). */
export const RUNS_FEATURE = "runs";

/**
 * The refusal of a message {@link countRunLines} counted `count` lines in, before protobuf-es parses it: runs over
 * {@link MAX_RUN_LINES}; null when it may be parsed (-1 included: see {@link MALFORMED_REFUSAL}). O(1).
 */
export function countRefusal(count: number): string | null {
  return count > MAX_RUN_LINES ? runRefusal(count) : null;
}

/**
 * The refusal of a message {@link countRunLines} found not well-formed (-1) but protobuf-es read all the same (a
 * field that runs on past its message's end, a known field tagged with another wire type than its own); the caller
 * gives protobuf-es's own refusal when it has one.
 */
export const MALFORMED_REFUSAL =
  "not a valid runner.v1.LogItem: a field runs on past the end of its message or has the wrong wire type";

/**
 * The one-line refusal of a run of `count` lines, or null when the count is within 1 to {@link MAX_RUN_LINES}.
 * O(1).
 */
export function runRefusal(count: number): string | null {
  if (count === 0) return "a run must hold at least one line";
  if (count > MAX_RUN_LINES) return `a run of ${count} lines is over the ${MAX_RUN_LINES}-line limit; split it`;
  return null;
}

/**
 * How many lines the runs in the LogItem encoded in `buf[start, end)` hold (every `lines` field of every `run` field:
 * protobuf merges a repeated message field), read without decoding anything: what a message the fast decoder leaves
 * to protobuf-es may make it allocate, a string a line. -1 when the bytes are not a well-formed message, which the
 * caller refuses unparsed ({@link countRefusal}): protobuf-es lets some pass (a field that runs on past its message's
 * end), and 128 KiB of runs each holding one such line would be 30,000 lines it made uncounted. The walk reads the
 * bytes as protobuf-es does, or says -1: it checks the fields of `log` and `end` too (one running past its message
 * moves where protobuf-es reads on), and a known field must carry its own wire type (protobuf-es reads a field as its
 * declared kind whatever its tag says: `lines` tagged as a varint is a line all the same). Groups are skipped whole.
 * O(bytes), no allocation.
 *
 * @example
 * const refusal = countRefusal(countRunLines(buf, from, end)); // before fromBinary(LogItemSchema, …)
 */
export function countRunLines(buf: Uint8Array, start: number, end: number): number {
  return walkFields(buf, start, end, 0, TOP, -1);
}

/**
 * Where {@link walkFields} walks: a LogItem's fields, a run's, a group's (skipped, never counted), or a LogChunk's or
 * JobEnd's (checked, never counted).
 */
const TOP = 0;
const RUN = 1;
const GROUP = 2;
const CHUNK = 3;
const END = 4;

/**
 * The wire type of each known field (by field number) where {@link walkFields} walks, as protobuf-es reads it whatever
 * the tag says; a group's fields are all unknown (skipped by their tag's wire type, as protobuf-es skips them).
 */
const WIRE_TYPES: readonly (readonly number[])[] = [
  [-1, 2, 2, 2, 2], // LogItem: request_id, log, end, run
  [-1, 2, 0, 1], // LogRun: lines, stderr, time_unix_nano
  [],
  [-1, 2, 0, 1], // LogChunk: line, stderr, time_unix_nano
  [-1, 0, 0, 2, 2], // JobEnd: exit_code, success, repo_url, commit_sha
];

/** What the LogItem field `log`, `end` or `run` (2 to 4) holds, as {@link walkFields} walks it. */
const EVENT_WHERE = [-1, -1, CHUNK, END, RUN];

/** Where the last group {@link walkFields} walked ended (after its end tag). */
let groupEnd = 0;

/**
 * The count over the fields of `buf[pos, end)` as `where` says; for a group (`group`: its field number), up to its
 * end tag, whose end it leaves in {@link groupEnd}. -1 when malformed. O(bytes).
 */
function walkFields(buf: Uint8Array, pos: number, end: number, depth: number, where: number, group: number): number {
  let count = 0;
  while (pos < end) {
    const tag = readVarint(buf, pos, end);
    if (tag < 0) return -1;
    pos = varintEnd;
    const field = Math.floor(tag / 8);
    const type = tag & 7;
    // protobuf-es refuses a tag over 32 bits and field 0.
    if (tag > 0xffffffff || field === 0) return -1;
    const known = WIRE_TYPES[where]![field];
    if (known !== undefined && type !== known) return -1;
    if (type === 0) {
      if (readVarint(buf, pos, end) < 0) return -1;
      pos = varintEnd;
    } else if (type === 1 || type === 5) {
      pos += type === 1 ? 8 : 4;
      if (pos > end) return -1;
    } else if (type === 2) {
      const len = readVarint(buf, pos, end);
      if (len < 0 || varintEnd + len > end) return -1;
      pos = varintEnd;
      if (where === TOP && field >= 2 && field <= 4) {
        const inner = walkFields(buf, pos, pos + len, depth, EVENT_WHERE[field]!, -1);
        if (inner < 0) return -1;
        count += inner;
      } else if (where === RUN && field === 1) count++;
      pos += len;
    } else if (type === 3) {
      // A group: its fields up to the matching end tag, skipped (never counted).
      if (depth >= MAX_GROUP_DEPTH || walkFields(buf, pos, end, depth + 1, GROUP, field) < 0) return -1;
      pos = groupEnd;
    } else if (type === 4 && field === group) {
      groupEnd = pos;
      return count;
    } else {
      return -1;
    }
  }
  return pos === end && group === -1 ? count : -1;
}

/** Nested groups deeper than this are taken as malformed (protobuf-es's own limit is higher; nothing sends groups). */
const MAX_GROUP_DEPTH = 32;

/** Where the last {@link readVarint} ended. */
let varintEnd = 0;

/** A varint of up to 10 bytes as a number (exact below 2^53; larger ones only need to be stepped over), or -1. */
function readVarint(buf: Uint8Array, pos: number, end: number): number {
  let value = 0;
  let scale = 1;
  for (let i = 0; i < 10 && pos < end; i++) {
    const byte = buf[pos++]!;
    value += (byte & 0x7f) * scale;
    scale *= 128;
    if (byte < 0x80) {
      varintEnd = pos;
      return value;
    }
  }
  return -1;
}

/**
 * One received run whose lines are all valid UTF-8 and whose fields are plain (each of stderr and time at most
 * once, no unknown field): what the decoder accepted. Nothing in it grows with the lines.
 */
export class ReceivedRun {
  /**
   * @param requestId the item's request_id as sent
   * @param buf the buffer holding the run; never written again (a request chunk or a whole envelope)
   * @param start where the run's fields (the inside of `LogRun`) start in `buf`
   * @param end where they end (exclusive)
   * @param firstLineAt where the first line's field (its tag) starts; `end` when the run holds none
   * @param count how many lines the run holds
   * @param stderr the run's stream
   * @param time the agent's stamp in ms to the µs (runner/protocol/line-time.ts), 0 when it sent none
   * @param timeAt where the stamp's 8 bytes are in `buf`, -1 when none
   * @param plainJson true when every line is its own JSON string body (byte-scan.ts `PLAIN_ASCII`); false says
   *   nothing
   */
  constructor(
    readonly requestId: string,
    readonly buf: Buffer,
    readonly start: number,
    readonly end: number,
    readonly firstLineAt: number,
    readonly count: number,
    readonly stderr: boolean,
    readonly time: number,
    readonly timeAt: number,
    readonly plainJson: boolean,
  ) {}

  /**
   * The line whose field is the first line field at or after `at` (a field boundary inside the run, at most the
   * stderr and time fields before it), as a {@link ReceivedLine} with the run's stream and time; its `end` is where
   * the next field starts. Only for a run the decoder accepted, and only while a line is left at or after `at`.
   * O(1): the line's bytes are not read.
   */
  lineAt(at: number): ReceivedLine {
    const buf = this.buf;
    for (;;) {
      const tag = buf[at++]!;
      if (tag === 0x10) at += 1;
      else if (tag === 0x19) at += 8;
      else break;
    }
    // A line field (0x0a): its length, a minimal varint of at most 5 bytes (checked by the decoder).
    let len = 0;
    let shift = 0;
    for (;;) {
      const byte = buf[at++]!;
      len += (byte & 0x7f) * 2 ** shift;
      if (byte < 0x80) break;
      shift += 7;
    }
    return new ReceivedLine(
      this.requestId,
      buf,
      at,
      at + len,
      this.stderr,
      this.time,
      this.timeAt,
      this.plainJson || len === 0,
    );
  }

  /** The protobuf-es message the run stands for (for readers that want messages). O(lines + bytes). */
  toLogItem(): LogItem {
    const lines: string[] = [];
    for (let i = 0, at = this.firstLineAt; i < this.count; i++) {
      const line = this.lineAt(at);
      lines.push(line.line);
      at = line.end;
    }
    return {
      $typeName: "runner.v1.LogItem",
      requestId: this.requestId,
      event: {
        case: "run",
        value: {
          $typeName: "runner.v1.LogRun",
          lines,
          stderr: this.stderr,
          timeUnixNano: this.timeAt < 0 ? 0n : this.buf.readBigUInt64LE(this.timeAt),
        },
      },
    };
  }
}
