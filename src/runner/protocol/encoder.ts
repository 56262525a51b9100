/**
 * A specialised, allocation-free encoder for runner.v1 `LogItem` messages, written as
 * gRPC length-prefixed frames straight into a caller's buffer. It produces the same
 * bytes as protobuf-es `toBinary(LogItemSchema, …)` (field order, implicit-presence
 * rules, sign-extended negative int32), which test/runner/client/building-blocks.test.ts checks
 * byte for byte; it exists because the generic reflection path is the runner's cost.
 */
// Imported, not the global: Node defines `globalThis.Buffer` as a getter (a deprecation
// path for ES modules), so `Buffer.isBuffer` per line was a getter call through the
// generic global load IC in the agent's hottest function.
import { Buffer } from "node:buffer";
import { varintSize } from "./encoded-size.js";
import { writeNanos } from "./line-time.js";

/** Bytes of the gRPC message prefix: a compressed flag and a big-endian uint32 length. */
export const FRAME_PREFIX_BYTES = 5;

/** Fields a JobEnd carries (runner.v1.JobEnd). */
export interface JobEndFields {
  exitCode: number;
  success: boolean;
  repoUrl?: string;
  commitSha?: string;
}

/** Writes `n` (below 2^31) as a varint at `pos`; returns the position after it. O(1). */
export function writeVarint(buf: Buffer, pos: number, n: number): number {
  while (n > 0x7f) {
    buf[pos++] = (n & 0x7f) | 0x80;
    n >>>= 7;
  }
  buf[pos++] = n;
  return pos;
}

/** UTF-8 length of a string, with a pure-JS path for short ASCII strings (the common log line). */
export function utf8Length(s: string): number {
  const n = s.length;
  if (n > 256) return Buffer.byteLength(s, "utf8");
  for (let i = 0; i < n; i++) {
    if (s.charCodeAt(i) > 0x7f) return Buffer.byteLength(s, "utf8");
  }
  return n;
}

function writeString(buf: Buffer, pos: number, s: string, bytes: number): number {
  // ASCII (one byte a character): latin1 is the same bytes and the cheapest native
  // write (~40 ns for 100 characters on Node 22; a JS charCodeAt loop ~180 ns, utf8 ~70 ns).
  if (bytes === s.length) return pos + buf.write(s, pos, bytes, "latin1");
  return pos + buf.write(s, pos, bytes, "utf8");
}

/**
 * Encodes LogItems of one job as gRPC frames. The request ID field is pre-encoded once.
 *
 * @example
 * const enc = createLogItemEncoder("0b6c…");
 * const buf = Buffer.allocUnsafe(enc.logFrameSize("hello", 5, false));
 * enc.writeLogFrame(buf, 0, "hello", 5, false);
 */
export function createLogItemEncoder(requestId: string): LogItemEncoder {
  const id = Buffer.from(requestId, "utf8");
  // Field 1 (request_id), wire type 2; empty strings are omitted under proto3 rules.
  const idField = id.length === 0 ? Buffer.alloc(0) : Buffer.concat([Buffer.from([0x0a]), varintBytes(id.length), id]);
  const idLen = idField.length;

  // A time (ms, 0 = none) adds field 3, fixed64: a tag and 8 bytes.
  function chunkSize(lineBytes: number, stderr: boolean, time: number): number {
    return (lineBytes > 0 ? 1 + varintSize(lineBytes) + lineBytes : 0) + (stderr ? 2 : 0) + (time > 0 ? 9 : 0);
  }

  /**
   * Writes a log frame up to its line's bytes (gRPC prefix, request id, the log field and,
   * for a non-empty line, the line field's tag and length); returns where the bytes go.
   */
  function writeLogHead(buf: Buffer, pos: number, lineBytes: number, stderr: boolean, time: number): number {
    const c = chunkSize(lineBytes, stderr, time);
    const msg = idLen + 1 + varintSize(c) + c;
    buf[pos] = 0;
    buf.writeUInt32BE(msg, pos + 1);
    pos += FRAME_PREFIX_BYTES;
    // TypedArray#set, a V8 builtin: Buffer#copy's JS wrapper (bounds, arguments) cost twice the copy of 38 bytes.
    buf.set(idField, pos);
    pos += idLen;
    buf[pos++] = 0x12; // field 2 (log), wire type 2: present even when empty (oneof member)
    pos = writeVarint(buf, pos, c);
    if (lineBytes > 0) {
      buf[pos++] = 0x0a;
      pos = writeVarint(buf, pos, lineBytes);
    }
    return pos;
  }

  // The last time written and its 8 bytes: an agent stamps every line of a pipe read with
  // the same time, so the conversion to nanoseconds runs once a read, not once a line.
  let lastTime = 0;
  const lastNanos = new Uint8Array(8);

  /** Writes the stderr flag and the time after the line's bytes, when set; returns the frame's end. */
  function writeLogTail(buf: Uint8Array, pos: number, stderr: boolean, time: number): number {
    if (stderr) {
      buf[pos++] = 0x10;
      buf[pos++] = 0x01;
    }
    if (time > 0) {
      buf[pos++] = 0x19; // field 3 (time_unix_nano), wire type 1 (64-bit)
      if (time !== lastTime) {
        writeNanos(lastNanos, 0, time);
        lastTime = time;
      }
      const n = lastNanos;
      buf[pos] = n[0]!;
      buf[pos + 1] = n[1]!;
      buf[pos + 2] = n[2]!;
      buf[pos + 3] = n[3]!;
      buf[pos + 4] = n[4]!;
      buf[pos + 5] = n[5]!;
      buf[pos + 6] = n[6]!;
      buf[pos + 7] = n[7]!;
      pos += 8;
    }
    return pos;
  }

  // Heads of the lines of a run (see lineFramer), built once a line length: by stderr flag and whether a time is set.
  // Preallocated when first used (holey, fast elements): a sparse array filled at a high index would turn into a
  // dictionary.
  const heads: (Uint8Array | undefined)[][] = [];
  const headsFor = (stderr: boolean, time: number) =>
    (heads[(stderr ? 2 : 0) + (time > 0 ? 1 : 0)] ??= new Array<Uint8Array | undefined>(CACHED_HEADS));
  const headBytes = FRAME_PREFIX_BYTES + idLen + 1 + 5 + 1 + 5;
  // Cached heads are carved from the encoder's own blocks: a head from Buffer's shared pool would keep an 8 KiB pool
  // block alive each. A longer line's head is written into `scratch`, valid until the next head.
  let block = Buffer.allocUnsafeSlow(0);
  let blockUsed = 0;
  const scratch = Buffer.allocUnsafeSlow(headBytes);
  const framers = [false, true].map((stderr) => {
    const tailBytes = new Uint8Array(11);
    const framer = {
      cache: [] as (Uint8Array | undefined)[],
      time: 0,
      ready: false,
      tail: tailBytes.subarray(0, 0),
      id: idField as Uint8Array,
      head(lineBytes: number): Uint8Array {
        if (lineBytes >= CACHED_HEADS)
          return scratch.subarray(0, writeLogHead(scratch, 0, lineBytes, stderr, framer.time));
        const cached = framer.cache[lineBytes];
        if (cached !== undefined) return cached;
        if (block.length - blockUsed < headBytes) {
          block = Buffer.allocUnsafeSlow(HEAD_BLOCK_BYTES);
          blockUsed = 0;
        }
        const end = writeLogHead(block, blockUsed, lineBytes, stderr, framer.time);
        const built = block.subarray(blockUsed, end);
        blockUsed = end;
        framer.cache[lineBytes] = built;
        return built;
      },
      set(time: number): LineFramer {
        const t = stamp(time);
        // The tail holds the time's bytes: rebuilt when the time changes (once a pipe read), the heads only when its
        // presence does.
        if (t !== framer.time || !framer.ready) {
          framer.ready = true;
          framer.time = t;
          framer.cache = headsFor(stderr, t);
          framer.tail = tailBytes.subarray(0, writeLogTail(tailBytes, 0, stderr, t));
        }
        return framer;
      },
    };
    return framer;
  });

  return {
    lineFramer(stderr, time = 0) {
      return framers[stderr ? 1 : 0]!.set(time);
    },
    logFrameSize(_line, lineBytes, stderr, time = 0) {
      const c = chunkSize(lineBytes, stderr, stamp(time));
      return FRAME_PREFIX_BYTES + idLen + 1 + varintSize(c) + c;
    },
    writeLogFrame(buf, pos, line, lineBytes, stderr, time = 0) {
      const t = stamp(time);
      pos = writeLogHead(buf, pos, lineBytes, stderr, t);
      if (lineBytes > 0) pos = writeString(buf, pos, line, lineBytes);
      return writeLogTail(buf, pos, stderr, t);
    },
    writeLogFrameBytes(buf, pos, src, start, end, stderr, time = 0) {
      const lineBytes = end - start;
      const t = stamp(time);
      pos = writeLogHead(buf, pos, lineBytes, stderr, t);
      // Buffer#copy is a fast native call on Node 22 (~10 ns for a 100-byte line; a JS
      // byte loop ~100 ns, set() of a subarray ~30 ns).
      if (Buffer.isBuffer(src)) src.copy(buf, pos, start, end);
      else buf.set(src.subarray(start, end), pos);
      return writeLogTail(buf, pos + lineBytes, stderr, t);
    },
    endFrame(end) {
      const parts: Buffer[] = [];
      if (end.exitCode !== 0) {
        // int32 varint: negative values are sign-extended to 64 bits (10 bytes).
        parts.push(Buffer.from([0x08]), int32VarintBytes(end.exitCode));
      }
      if (end.success) parts.push(Buffer.from([0x10, 0x01]));
      for (const [tag, value] of [
        [0x1a, end.repoUrl ?? ""],
        [0x22, end.commitSha ?? ""],
      ] as const) {
        if (value.length === 0) continue;
        const bytes = Buffer.from(value, "utf8");
        parts.push(Buffer.from([tag]), varintBytes(bytes.length), bytes);
      }
      const body = Buffer.concat(parts);
      const msg = Buffer.concat([idField, Buffer.from([0x1a]), varintBytes(body.length), body]);
      const frame = Buffer.allocUnsafe(FRAME_PREFIX_BYTES + msg.length);
      frame[0] = 0;
      frame.writeUInt32BE(msg.length, 1);
      msg.copy(frame, FRAME_PREFIX_BYTES);
      return frame;
    },
  };
}

/**
 * Line heads are cached per stderr flag and time presence: lines shorter than this (nearly all) get a head built once
 * per length. At most 4 × 1,024 heads of ~50 bytes (a view each, ~100 bytes of heap) an encoder: ~600 KiB; an agent
 * stamps every line, so two of the four are used.
 */
const CACHED_HEADS = 1024;
/** The blocks cached heads are carved from. */
const HEAD_BLOCK_BYTES = 16 * 1024;

/**
 * The frames of a run of lines with one stderr flag and one time: a line's frame is its head, its UTF-8 bytes, then
 * the tail. The bytes are the encoder's own (`writeLogFrameBytes`).
 */
export interface LineFramer {
  /**
   * The frame's bytes before the text of a line of `lineBytes` bytes. O(1). The bytes of a line of 1,024 bytes or
   * more are valid until the next `head` call of the encoder.
   */
  head(lineBytes: number): Uint8Array;
  /**
   * The frame's bytes after the text: the stderr flag and the time, when set. A `LogRun` ends with the same bytes
   * (its stderr and time have `LogChunk`'s field numbers).
   */
  readonly tail: Uint8Array;
  /** The `request_id` field as encoded (tag, length, bytes), which starts a run's frame after its prefix. */
  readonly id: Uint8Array;
}

/** What {@link createLogItemEncoder} returns. */
export interface LogItemEncoder {
  /**
   * The framer of a run of lines (`time` as in {@link LogItemEncoder.logFrameSize}). It stays valid until the next
   * call with the same `stderr`: one object a flag, so a run costs no allocation.
   */
  lineFramer(stderr: boolean, time?: number): LineFramer;
  /**
   * Bytes the frame of one log line takes (`lineBytes` = UTF-8 length of `line`; `time` in ms since the epoch,
   * kept to the µs, 0 or absent for none: the field is then left out).
   */
  logFrameSize(line: string, lineBytes: number, stderr: boolean, time?: number): number;
  /** Writes the frame of one log line at `pos`; returns the position after it. */
  writeLogFrame(buf: Buffer, pos: number, line: string, lineBytes: number, stderr: boolean, time?: number): number;
  /**
   * Writes the frame of one log line given as its UTF-8 bytes `src[start, end)` (valid
   * UTF-8, checked by the caller); the same bytes as `writeLogFrame` with the decoded text.
   */
  writeLogFrameBytes(
    buf: Buffer,
    pos: number,
    src: Uint8Array,
    start: number,
    end: number,
    stderr: boolean,
    time?: number,
  ): number;
  /** The frame of a JobEnd item. */
  endFrame(end: JobEndFields): Buffer;
}

/** A time that rounds to no microsecond is no time (the field would be 0: absent). O(1). */
function stamp(time: number): number {
  // The same test as `toMicros(time) > 0` (Math.round gives ≥ 1 exactly from 0.5 up; NaN and negatives fail it),
  // without its rounded double: boxed on its way out, it was ~16 bytes of garbage a line on the agent.
  return time * 1000 >= 0.5 ? time : 0;
}

function varintBytes(n: number): Buffer {
  const b = Buffer.allocUnsafe(5);
  return b.subarray(0, writeVarint(b, 0, n));
}

function int32VarintBytes(n: number): Buffer {
  if (n >= 0) return varintBytes(n);
  let v = BigInt.asUintN(64, BigInt(n));
  const out: number[] = [];
  while (v > 0x7fn) {
    out.push(Number(v & 0x7fn) | 0x80);
    v >>= 7n;
  }
  out.push(Number(v));
  return Buffer.from(out);
}
