/**
 * The archived job log format (docs/decisions/log-archive.md): one object per job, made of independently
 * gzip-compressed chunks of lines, then an index of the chunks, then a fixed 32-byte trailer. A reader that
 * knows the object's size fetches the trailer and the index with one Range read, then only the chunk(s)
 * holding the lines it wants: reading the tail of a 256 MiB log costs two small reads, never the whole
 * object.
 * Why: docs/decisions/log-archive.md, "format.ts: the archived log format".
 */
import { promisify } from "node:util";
import { gunzip, gzip } from "node:zlib";
import { RunnerDepotError } from "../../errors.js";
import type { StoredLine } from "../ports.js";
import { fromMicros, toMicros } from "../protocol/line-time.js";

const gzipAsync = promisify(gzip);
const gunzipAsync = promisify(gunzip);

/**
 * Magic of the trailer; the last digit is the format version. Version 2 (per-line times) is
 * written; version 1 objects (no times) are still read.
 */
const MAGIC_PREFIX = "RDLOGAR";
/** The format version the writer writes. */
export const ARCHIVE_VERSION = 2;
const MAGIC = Buffer.from(`${MAGIC_PREFIX}${ARCHIVE_VERSION}`, "latin1");
/** Version 2 record flags: bit 0 stderr, bit 1 marker, bit 2 server time, bit 3 a time follows. */
const HAS_TIME = 8;
/** Bytes of the trailer. */
export const TRAILER_BYTES = 32;
/** Bytes of one index entry. */
export const INDEX_ENTRY_BYTES = 8;
/** A chunk is closed once its records reach this many bytes (before compression). */
export const CHUNK_TARGET_BYTES = 256 * 1024;
/**
 * Largest inflated chunk a reader accepts: the target plus one record of the longest line
 * a store may hold. A chunk over it is refused (a zip bomb costs this much, no more).
 */
export const MAX_CHUNK_BYTES = CHUNK_TARGET_BYTES + 4 * 1024 * 1024 + 16;
/** Longest line an archive takes (past any line a store holds under the 1 MiB default message limit). */
const MAX_LINE_BYTES = 4 * 1024 * 1024;
/** Largest compressed chunk a reader fetches. */
const MAX_COMPRESSED_CHUNK_BYTES = MAX_CHUNK_BYTES + 64 * 1024;
/**
 * Most lines a chunk may hold: the writer closes a chunk once its records reach
 * CHUNK_TARGET_BYTES and every record takes at least one byte, so no honest chunk holds
 * more. A forged index claiming more is refused before any chunk is fetched, which bounds
 * what one chunk decodes to (about 12 MiB of heap for 262,144 empty lines) instead of one
 * StoredLine per inflated byte (a 20 KB chunk of zeros once gave 4.4 M lines, 290 MB).
 */
export const MAX_CHUNK_LINES = CHUNK_TARGET_BYTES;
/** Most chunks an object may have (an index of 8 MiB). */
const MAX_CHUNKS = 1 << 20;

/** Where each chunk of an archive is and which lines it holds. */
export interface ArchiveIndex {
  /** The format version (1: no times, 2: per-line times), from the trailer's magic. */
  version: number;
  /** Lines in the whole archive. */
  lines: number;
  /** Byte offset of chunk i (n + 1 entries: the last is the index's offset). */
  offsets: number[];
  /** Line position of chunk i's first line (n + 1 entries: the last is `lines`). */
  firsts: number[];
}

function corrupt(message: string): RunnerDepotError {
  return new RunnerDepotError("INTERNAL", `corrupt log archive: ${message}`);
}

/** Writes `value` (a non-negative safe integer) as a LEB128 varint at `pos`; returns the new position. */
function putVarint(out: Buffer, pos: number, value: number): number {
  while (value >= 0x80) {
    out[pos++] = (value % 0x80) | 0x80;
    value = Math.floor(value / 0x80);
  }
  out[pos++] = value;
  return pos;
}

/**
 * Writes the version 2 record of one line into `out` at `pos`: a varint `bytes << 4 | flags`, then (flag bit 3)
 * the time as a zigzag varint of µs since the chunk's previous timed line (the first counts from 0), then the
 * UTF-8 bytes. Returns the new position.
 */
function putRecord(
  out: Buffer,
  pos: number,
  text: Buffer,
  flags: number,
  start: number,
  end: number,
  delta: number,
): number {
  pos = putVarint(out, pos, (end - start) * 16 + flags);
  if (flags & HAS_TIME) pos = putVarint(out, pos, delta >= 0 ? delta * 2 : -delta * 2 - 1);
  text.copy(out, pos, start, end);
  return pos + end - start;
}

/** Bytes of the blocks records are written into before a chunk is joined. */
const RECORD_BLOCK = 64 * 1024;

/**
 * Builds an archive chunk by chunk: `add` lines, take each finished chunk's gzip bytes as
 * it comes, then `finish` for the last chunk, the index and the trailer. Memory: one chunk
 * (about 256 KiB) plus 8 bytes per chunk for the index, whatever the log's size.
 *
 * @example
 * const writer = new ArchiveWriter();
 * for (const line of lines) { const chunk = await writer.add(line); if (chunk) await sink(chunk); }
 * for (const part of await writer.finish()) await sink(part);
 */
export class ArchiveWriter {
  /** The block records are written into, and how much of it is used. */
  private record = Buffer.alloc(0);
  private recordUsed = 0;
  /** Chunks being compressed, until they are (a read page's worth at most: the caller awaits them per page). */
  private readonly compressing = new Set<Promise<Buffer>>();
  private parts: Buffer[] = [];
  private partBytes = 0;
  private partLines = 0;
  private readonly entries: number[] = [];
  /** µs of the current chunk's last timed line (a chunk's times count from 0, so it decodes alone). */
  private lastMicros = 0;
  private offset = 0;
  private total = 0;
  /** Uncompressed bytes of the records written. */
  rawBytes = 0;

  constructor(private readonly level = 6) {}

  /** Adds a line; resolves with a finished chunk's compressed bytes when one closed. O(line). */
  async add(line: StoredLine): Promise<Buffer | null> {
    const text = Buffer.from(line.line, "utf8");
    const flags = (line.stderr ? 1 : 0) | (line.marker ? 2 : 0) | (line.serverTime ? 4 : 0);
    return (await this.addBytes(text, 0, text.length, flags, line.time ?? 0)) ?? null;
  }

  /**
   * Adds a line given as UTF-8 bytes `text[start, end)`, its flags (bit 0 stderr, bit 1
   * marker, bit 2 server time) and its time (ms to the µs, 0 = none), as a store keeps them: no string is made. Synchronous unless a chunk closed (then
   * the promise of its compressed bytes). The record is appended to the current chunk, whose
   * bytes are bounded by CHUNK_TARGET_BYTES plus one line. O(line).
   */
  addBytes(text: Buffer, start: number, end: number, flags: number, time = 0): Promise<Buffer> | null {
    const size = end - start;
    if (size > MAX_LINE_BYTES)
      throw new RunnerDepotError(
        "RESOURCE_EXHAUSTED",
        `log archive: a line of ${size} bytes is over ${MAX_LINE_BYTES}`,
      );
    if (this.record.length - this.recordUsed < size + 20) {
      // Records are written into a shared block (one allocation per 64 KiB, not per line).
      this.record = Buffer.allocUnsafe(Math.max(RECORD_BLOCK, size + 20));
      this.recordUsed = 0;
    }
    const from = this.recordUsed;
    const us = toMicros(time);
    const bits = us > 0 ? (flags & 7) | HAS_TIME : flags & 3;
    this.recordUsed = putRecord(this.record, from, text, bits, start, end, us - this.lastMicros);
    if (us > 0) this.lastMicros = us;
    this.parts.push(this.record.subarray(from, this.recordUsed));
    this.partBytes += this.recordUsed - from;
    this.partLines++;
    this.total++;
    return this.partBytes >= CHUNK_TARGET_BYTES ? this.close() : null;
  }

  /**
   * Closes the current chunk. Its place in the index and its line count are taken now, so
   * several chunks may be compressed at once (addBytes does not wait) and still be indexed in
   * order; the caller writes them in the order they were closed.
   */
  private close(): Promise<Buffer> {
    if (this.entries.length / 2 >= MAX_CHUNKS)
      return Promise.reject(new RunnerDepotError("RESOURCE_EXHAUSTED", "log archive: too many chunks"));
    const raw = Buffer.concat(this.parts, this.partBytes);
    this.lastMicros = 0;
    this.rawBytes += raw.length;
    this.parts = [];
    this.partBytes = 0;
    const slot = this.entries.length;
    this.entries.push(0, this.partLines);
    this.partLines = 0;
    // Async gzip runs on the thread pool: a large archive never blocks the event loop.
    const packed = gzipAsync(raw, { level: this.level }).then((out) => {
      this.entries[slot] = out.length;
      this.offset += out.length;
      return out;
    });
    this.compressing.add(packed);
    // Awaited by the caller (and by finish); never an unhandled rejection meanwhile.
    packed.then(
      () => this.compressing.delete(packed),
      () => this.compressing.delete(packed),
    );
    return packed;
  }

  /** The last chunk (if any lines remain), the index and the trailer. */
  async finish(): Promise<Buffer[]> {
    const out: Buffer[] = [];
    if (this.partLines > 0) out.push(await this.close());
    // Every chunk's size must be known before the index is written.
    await Promise.all(this.compressing);
    const chunks = this.entries.length / 2;
    const tail = Buffer.alloc(chunks * INDEX_ENTRY_BYTES + TRAILER_BYTES);
    for (let i = 0; i < this.entries.length; i++) tail.writeUInt32LE(this.entries[i]!, i * 4);
    const t = chunks * INDEX_ENTRY_BYTES;
    MAGIC.copy(tail, t);
    tail.writeUInt32LE(chunks, t + 8);
    tail.writeDoubleLE(this.total, t + 16);
    tail.writeDoubleLE(this.offset, t + 24);
    out.push(tail);
    return out;
  }

  /** Chunks closed so far (all of them after `finish`). */
  get chunks(): number {
    return this.entries.length / 2;
  }

  /** Lines added so far. */
  get lines(): number {
    return this.total;
  }
}

/** Bytes of an archive's index and trailer, from its chunk count: the reader's first Range read. */
export function tailBytes(chunks: number): number {
  return chunks * INDEX_ENTRY_BYTES + TRAILER_BYTES;
}

/**
 * Reads the trailer at the end of `tail` (the last bytes of an object of `size` bytes,
 * at least the trailer): how many chunks, hence how many bytes the index and trailer take.
 * Throws INTERNAL on anything malformed. O(1).
 */
export function decodeTrailer(
  tail: Uint8Array,
  size: number,
): { version: number; chunks: number; lines: number; indexOffset: number } {
  if (tail.length < TRAILER_BYTES) throw corrupt("short trailer");
  const buf = Buffer.from(tail.buffer, tail.byteOffset, tail.byteLength);
  const t = buf.length - TRAILER_BYTES;
  const magic = buf.toString("latin1", t, t + 8);
  const version = magic === `${MAGIC_PREFIX}1` ? 1 : magic === `${MAGIC_PREFIX}2` ? 2 : 0;
  if (version === 0) throw corrupt("bad magic");
  const chunks = buf.readUInt32LE(t + 8);
  const lines = buf.readDoubleLE(t + 16);
  const indexOffset = buf.readDoubleLE(t + 24);
  if (buf.readUInt32LE(t + 12) !== 0) throw corrupt("reserved bits set");
  if (chunks > MAX_CHUNKS) throw corrupt("too many chunks");
  if (!Number.isSafeInteger(lines) || lines < 0) throw corrupt("bad line count");
  if (!Number.isSafeInteger(indexOffset) || indexOffset < 0) throw corrupt("bad index offset");
  if (indexOffset + tailBytes(chunks) !== size) throw corrupt("sizes disagree");
  return { version, chunks, lines, indexOffset };
}

/**
 * Decodes the index from the object's last `tailBytes(chunks)` bytes (index + trailer).
 * Every count is checked against the trailer. O(chunks).
 */
export function decodeIndex(tail: Uint8Array, size: number): ArchiveIndex {
  const { version, chunks, lines, indexOffset } = decodeTrailer(tail, size);
  if (tail.length !== tailBytes(chunks)) throw corrupt("index length");
  const buf = Buffer.from(tail.buffer, tail.byteOffset, tail.byteLength);
  const offsets = new Array<number>(chunks + 1);
  const firsts = new Array<number>(chunks + 1);
  let offset = 0;
  let first = 0;
  for (let i = 0; i < chunks; i++) {
    offsets[i] = offset;
    firsts[i] = first;
    const bytes = buf.readUInt32LE(i * 8);
    const count = buf.readUInt32LE(i * 8 + 4);
    if (bytes === 0 || bytes > MAX_COMPRESSED_CHUNK_BYTES) throw corrupt(`chunk ${i} size`);
    if (count === 0) throw corrupt(`chunk ${i} is empty`);
    if (count > MAX_CHUNK_LINES) throw corrupt(`chunk ${i} claims ${count} lines, over ${MAX_CHUNK_LINES}`);
    offset += bytes;
    first += count;
  }
  if (offset !== indexOffset) throw corrupt("chunk sizes do not add up to the index offset");
  if (first !== lines) throw corrupt("chunk lines do not add up");
  offsets[chunks] = offset;
  firsts[chunks] = first;
  return { version, lines, offsets, firsts };
}

/** The chunk holding line `position` (binary search, O(log chunks)); -1 past the end. */
export function chunkOf(index: ArchiveIndex, position: number): number {
  if (position < 0 || position >= index.lines) return -1;
  let lo = 0;
  let hi = index.firsts.length - 2;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (index.firsts[mid]! <= position) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

/**
 * Inflates one chunk (its compressed bytes exactly) and decodes its records; `expected`
 * is the index's line count for it, `version` the index's format version. Inflation stops at
 * MAX_CHUNK_BYTES. O(chunk bytes).
 */
export async function decodeChunk(
  packed: Uint8Array,
  expected: number,
  version = ARCHIVE_VERSION,
): Promise<StoredLine[]> {
  checkExpected(expected);
  let raw: Buffer;
  try {
    raw = await gunzipAsync(packed, { maxOutputLength: MAX_CHUNK_BYTES });
  } catch (error) {
    throw new RunnerDepotError(
      "INTERNAL",
      `corrupt log archive: chunk does not inflate (${(error as Error).message})`,
      { cause: error },
    );
  }
  return decodeRecords(raw, expected, version);
}

/** A chunk's line count as the index gives it: 1 … MAX_CHUNK_LINES, else corrupt. */
function checkExpected(expected: number): void {
  if (!Number.isSafeInteger(expected) || expected < 1 || expected > MAX_CHUNK_LINES)
    throw corrupt(`a chunk of ${expected} lines`);
}

/** Reads a LEB128 varint of at most `maxBytes` bytes at `at.pos` (advancing it); corrupt past the end. O(1). */
function readVarint(buf: Buffer, at: { pos: number }, maxBytes: number): number {
  let value = 0;
  let scale = 1;
  for (let shift = 0; ; shift++) {
    if (at.pos >= buf.length || shift >= maxBytes) throw corrupt("bad record header");
    const byte = buf[at.pos++]!;
    value += (byte & 0x7f) * scale;
    scale *= 0x80;
    if (byte < 0x80) return value;
  }
}

/**
 * Decodes the records of an inflated chunk of format `version` (1 or 2); exactly `expected` of them must fill it.
 * O(bytes), at most MAX_CHUNK_LINES lines: a record may only start below
 * CHUNK_TARGET_BYTES (the writer closes the chunk there) and never past `expected`.
 */
export function decodeRecords(raw: Uint8Array, expected: number, version = ARCHIVE_VERSION): StoredLine[] {
  if (version === 2) return decodeRecordsV2(raw, expected);
  checkExpected(expected);
  const buf = Buffer.from(raw.buffer, raw.byteOffset, raw.byteLength);
  // Every record takes at least one byte.
  if (expected > buf.length) throw corrupt("fewer bytes than the index says lines");
  const out: StoredLine[] = [];
  let pos = 0;
  while (pos < buf.length) {
    if (pos >= CHUNK_TARGET_BYTES) throw corrupt("a record starts past the chunk target");
    let header = 0;
    let scale = 1;
    for (let shift = 0; ; shift++) {
      if (pos >= buf.length || shift > 6) throw corrupt("bad record header");
      const byte = buf[pos++]!;
      header += (byte & 0x7f) * scale;
      scale *= 0x80;
      if (byte < 0x80) break;
    }
    const bytes = Math.floor(header / 4);
    if (bytes > buf.length - pos) throw corrupt("record runs past its chunk");
    if (out.length >= expected) throw corrupt("more lines than the index says");
    const line: StoredLine = { line: buf.toString("utf8", pos, pos + bytes), stderr: (header & 1) === 1 };
    if (header & 2) line.marker = true;
    out.push(line);
    pos += bytes;
  }
  if (out.length !== expected) throw corrupt("fewer lines than the index says");
  return out;
}

/** {@link decodeRecords} for version 2: each record may carry a time (format.ts putRecord). O(bytes). */
function decodeRecordsV2(raw: Uint8Array, expected: number): StoredLine[] {
  checkExpected(expected);
  const buf = Buffer.from(raw.buffer, raw.byteOffset, raw.byteLength);
  if (expected > buf.length) throw corrupt("fewer bytes than the index says lines");
  const out: StoredLine[] = [];
  const at = { pos: 0 };
  let micros = 0;
  while (at.pos < buf.length) {
    if (at.pos >= CHUNK_TARGET_BYTES) throw corrupt("a record starts past the chunk target");
    const header = readVarint(buf, at, 7);
    const flags = header % 16;
    const bytes = Math.floor(header / 16);
    if (flags & HAS_TIME) {
      // A zigzag delta of at most 8 bytes (56 bits): µs stay within a double's exact integers.
      const z = readVarint(buf, at, 8);
      micros += z % 2 === 0 ? z / 2 : -(z + 1) / 2;
      if (micros <= 0 || !Number.isSafeInteger(micros)) throw corrupt("bad line time");
    } else if (flags & 4) throw corrupt("a server-time flag without a time");
    if (bytes > buf.length - at.pos) throw corrupt("record runs past its chunk");
    if (out.length >= expected) throw corrupt("more lines than the index says");
    const line: StoredLine = { line: buf.toString("utf8", at.pos, at.pos + bytes), stderr: (flags & 1) === 1 };
    if (flags & 2) line.marker = true;
    if (flags & HAS_TIME) {
      line.time = fromMicros(micros);
      if (flags & 4) line.serverTime = true;
    }
    out.push(line);
    at.pos += bytes;
  }
  if (out.length !== expected) throw corrupt("fewer lines than the index says");
  return out;
}
