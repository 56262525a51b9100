/**
 * How job lines are kept in PostgreSQL: in chunks, one row of `job_chunks` per run of up to
 * CHUNK_LINES lines / CHUNK_BYTES bytes, holding the lines' UTF-8 bytes back to back (`bytes`),
 * where each line ends in it (`ends`, uint32 big-endian, one per line) and per line a flag byte
 * (bit 0 stderr, bit 1 marker, bit 2 server time) and its time as a float64 big-endian count of µs
 * (0 = none) in `flags`: LINE_META_BYTES (9) a line. Rows written before per-line times hold the
 * flag byte alone (1 a line) and still read: a row's stride is `flags` bytes ÷ lines.
 * Why (times): docs/decisions/log-line-time.md, "PostgreSQL".
 * Why: docs/decisions/runner-throughput.md, "log-lines.ts: why chunks and not a row per line".
 */
import type { RawLinePage, StoredLine } from "../../runner/ports.js";
import { ReceivedLine } from "../../runner/protocol/received-line.js";
import { fromMicros, toMicros } from "../../runner/protocol/line-time.js";
import { PageBudget } from "../../runner/service/page-budget.js";

/** Bytes of `flags` a line: the flag byte and the time (float64 BE, µs). */
export const LINE_META_BYTES = 9;

/**
 * The row a cut log keeps at its drop marker's position (flag bit 3): the marker's text is made on read from the
 * job's counts (runner/service/log-tail.ts), so a read whose rows hold it reads the state too.
 */
export const CUT_PLACEHOLDER: StoredLine = Object.freeze({ line: "", stderr: false, marker: true });
const CUT_BIT = 8;

/** True when the row holds a cut's placeholder. O(lines of the row). */
export function holdsCutPlaceholder(row: ChunkRow): boolean {
  if (row.ends === null) return false;
  const count = row.ends.length / 4;
  if (row.flags.length === count) return false;
  for (let k = 0; k < count; k++) if (row.flags[LINE_META_BYTES * k]! & CUT_BIT) return true;
  return false;
}

/** Most lines in one chunk row. */
const CHUNK_LINES = 4096;
/** Most line bytes in one chunk row (a single longer line gets a chunk of its own). */
const CHUNK_BYTES = 256 * 1024;
/** Most line characters one statement carries; a larger batch goes in several statements in one transaction. */
export const MAX_STATEMENT_CHARS = 8 * 1024 * 1024;

/** The parameters of one batch of lines (see {@link encodeLines}). */
interface EncodedLines {
  /** UTF-8 bytes of every line, back to back. */
  bytes: Buffer;
  /** uint32 BE per line: where it ends, counted from the start of its chunk. */
  ends: Buffer;
  /** LINE_META_BYTES per line: the flag byte (bit 0 stderr, bit 1 marker, bit 2 server time), then the time. */
  flags: Buffer;
  /** Four numbers per chunk: first line index, line count, first byte, byte count. */
  cuts: number[];
}

/** An int[] / bigint[] literal of `numbers` (node-postgres would escape each element with a regex). */
export function intArray(numbers: readonly number[]): string {
  return `{${numbers.join(",")}}`;
}

/**
 * Encodes lines `from` (inclusive) to `to` (exclusive) of `lines` and cuts them into chunks
 * (`limits`: the chunk bounds; tests pass small ones).
 * O(bytes of those lines): one `Buffer.write` per line into a buffer that grows only for
 * non-ASCII text.
 *
 * @example
 * const batch = encodeLines([{ line: "hello", stderr: false }], 0, 1);
 * await pool.query(`INSERT INTO job_chunks … ${chunksFrom(1)}`, [
 *   id,
 *   first,
 *   batch.bytes,
 *   batch.ends,
 *   batch.flags,
 *   intArray(batch.cuts),
 * ]);
 */
export function encodeLines(
  lines: readonly StoredLine[],
  from: number,
  to: number,
  limits: { lines: number; bytes: number } = { lines: CHUNK_LINES, bytes: CHUNK_BYTES },
): EncodedLines {
  let chars = 0;
  // A received line's size is its bytes (no string is made for it); others a first guess.
  for (let i = from; i < to; i++) {
    const l = lines[i]!;
    chars += l instanceof ReceivedLine ? l.end - l.start : l.line.length;
  }
  // ASCII is one byte a character: most job output fits the first guess.
  let bytes = Buffer.allocUnsafe(chars + 64);
  const n = to - from;
  const ends = Buffer.allocUnsafe(4 * n);
  const flags = Buffer.allocUnsafe(LINE_META_BYTES * n);
  const cuts: number[] = [];
  let pos = 0;
  let chunkLine = 0;
  let chunkByte = 0;
  for (let k = 0; k < n; k++) {
    const l = lines[from + k]!;
    const received = l instanceof ReceivedLine ? l : null;
    const worst = received !== null ? received.end - received.start : l.line.length * 3;
    if (bytes.length - pos < worst) {
      const grown = Buffer.allocUnsafe(Math.max(bytes.length * 2, pos + worst));
      bytes.copy(grown, 0, 0, pos);
      bytes = grown;
    }
    // Received bytes are copied as they came (valid UTF-8, checked on arrival).
    const end =
      received !== null
        ? pos + received.buf.copy(bytes, pos, received.start, received.end)
        : pos + bytes.write(l.line, pos, "utf8");
    if (k > chunkLine && (k - chunkLine >= limits.lines || end - chunkByte > limits.bytes)) {
      cuts.push(chunkLine, k - chunkLine, chunkByte, pos - chunkByte);
      chunkLine = k;
      chunkByte = pos;
    }
    pos = end;
    ends.writeUInt32BE(pos - chunkByte, 4 * k);
    flags[LINE_META_BYTES * k] =
      (l.stderr ? 1 : 0) | (l.marker ? 2 : 0) | (l.serverTime ? 4 : 0) | (l === CUT_PLACEHOLDER ? CUT_BIT : 0);
    flags.writeDoubleBE(toMicros(l.time ?? 0), LINE_META_BYTES * k + 1);
  }
  if (n > chunkLine) cuts.push(chunkLine, n - chunkLine, chunkByte, pos - chunkByte);
  return { bytes: bytes.subarray(0, pos), ends, flags, cuts };
}

/**
 * The SELECT that turns a batch into `job_chunks` rows (request_id, first, count, bytes, ends,
 * flags): `$p` is the request ID, `$p+1` the batch's first position, then bytes, ends, flags,
 * chunks. `guard` is a relation joined in front (a CTE that returns one row when the lines may
 * go in, none otherwise).
 */
export function chunksFrom(p: number, guard = ""): string {
  const [id, first, bytes, ends, flags, chunks] = [p, p + 1, p + 2, p + 3, p + 4, p + 5].map((n) => `$${n}`);
  return `SELECT ${id}, ${first}::bigint + c.l0, c.n,
            substring(${bytes}::bytea FROM c.b0 + 1 FOR c.bn),
            substring(${ends}::bytea FROM 4 * c.l0 + 1 FOR 4 * c.n),
            substring(${flags}::bytea FROM ${LINE_META_BYTES} * c.l0 + 1 FOR ${LINE_META_BYTES} * c.n)
          FROM ${guard ? `${guard}, ` : ""}(SELECT a[4 * i - 3] AS l0, a[4 * i - 2] AS n, a[4 * i - 1] AS b0, a[4 * i] AS bn
                FROM (SELECT ${chunks}::int[] AS a) AS arr, generate_series(1, cardinality(arr.a) / 4) AS i) AS c`;
}

/** Several jobs' batches as the parameters of one statement (see {@link encodeGroup}). */
interface EncodedGroup {
  bytes: Buffer;
  ends: Buffer;
  flags: Buffer;
  /**
   * bigint[] literal, six numbers per chunk: job number (1-based), first position, first line index, line count, first
   * byte, byte count.
   */
  cuts: string;
}

/**
 * Encodes the batches of several jobs (`first`: the position of each batch's first line) into
 * one set of parameters. O(bytes of all lines).
 *
 * @example
 * const group = encodeGroup([{ first: 0, stored: [{ line: "a", stderr: false }] }]);
 */
export function encodeGroup(batches: readonly { first: number; stored: readonly StoredLine[] }[]): EncodedGroup {
  const parts = batches.map((b) => encodeLines(b.stored, 0, b.stored.length));
  const cuts: number[] = [];
  let lines = 0;
  let bytes = 0;
  parts.forEach((part, j) => {
    for (let c = 0; c < part.cuts.length; c += 4) {
      const [l0, n, b0, bn] = [part.cuts[c]!, part.cuts[c + 1]!, part.cuts[c + 2]!, part.cuts[c + 3]!];
      cuts.push(j + 1, batches[j]!.first + l0, lines + l0, n, bytes + b0, bn);
    }
    lines += part.flags.length / LINE_META_BYTES;
    bytes += part.bytes.length;
  });
  return {
    bytes: parts.length === 1 ? parts[0]!.bytes : Buffer.concat(parts.map((p) => p.bytes)),
    ends: parts.length === 1 ? parts[0]!.ends : Buffer.concat(parts.map((p) => p.ends)),
    flags: parts.length === 1 ? parts[0]!.flags : Buffer.concat(parts.map((p) => p.flags)),
    cuts: intArray(cuts),
  };
}

/**
 * Where to cut `lines` so each statement holds at most MAX_STATEMENT_CHARS characters (and
 * at least one line): the end index of each piece. O(lines).
 */
export function statementCuts(lines: readonly StoredLine[]): number[] {
  const cuts: number[] = [];
  let chars = 0;
  for (let i = 0; i < lines.length; i++) {
    const n = lines[i]!.line.length;
    if (chars > 0 && chars + n > MAX_STATEMENT_CHARS) {
      cuts.push(i);
      chars = 0;
    }
    chars += n;
  }
  if (lines.length > 0) cuts.push(lines.length);
  return cuts;
}

/** One row as read back: a chunk, or a line of the row-per-line table of earlier releases (`ends` null). */
export interface ChunkRow {
  first: string | number;
  bytes: Buffer;
  ends: Buffer | null;
  flags: Buffer;
}

/** Where line `k` of `row` starts in its bytes (a one-line row: 0). O(1). */
function lineStart(row: ChunkRow, k: number): number {
  return k === 0 ? 0 : row.ends!.readUInt32BE(4 * (k - 1));
}

/** Where line `k` of `row` ends in its bytes (a one-line row: its length). O(1). */
function lineEnd(row: ChunkRow, k: number): number {
  return row.ends === null ? row.bytes.length : row.ends.readUInt32BE(4 * k);
}

/**
 * The same lines as {@link decodeRows}, as byte ranges of the rows (no string per line): what
 * the archive copies into its records. O(lines visited).
 */
export function rawRows(
  rows: readonly ChunkRow[],
  from: number,
  limit = Infinity,
  budget: PageBudget = new PageBudget(),
): RawLinePage {
  // The lines the page holds: up to `limit`, and those `budget` takes (the lines' own bytes).
  let count = 0;
  counting: for (const row of rows) {
    const rowCount = row.ends === null ? 1 : row.ends.length / 4;
    for (let k = Math.max(0, from - Number(row.first)); k < rowCount && count < limit; k++) {
      const start = lineStart(row, k);
      const end = lineEnd(row, k);
      if (!budget.take(end - start)) break counting;
      count++;
    }
    if (count >= limit) break;
  }
  return {
    count,
    each(visit) {
      let seen = 0;
      for (const row of rows) {
        const first = Number(row.first);
        const rowCount = row.ends === null ? 1 : row.ends.length / 4;
        for (let k = Math.max(0, from - first); k < rowCount && seen < count; k++, seen++) {
          const start = lineStart(row, k);
          const end = lineEnd(row, k);
          const [flags, time] = metaOf(row, rowCount, k);
          visit(row.bytes, start, end, flags, time);
        }
        if (seen >= count) break;
      }
    },
  };
}

/**
 * Line k's flags (bits 0–2) and time (ms, 0 = none) in a row of `count` lines: a row written before per-line times
 * holds one flag byte a line and no time. O(1).
 */
function metaOf(row: ChunkRow, count: number, k: number): [number, number] {
  if (row.flags.length === count) return [row.flags[k]! & 3, 0];
  const at = LINE_META_BYTES * k;
  return [row.flags[at]! & 7, fromMicros(row.flags.readDoubleBE(at + 1))];
}

/**
 * Lines `from` … `from + limit - 1` out of rows ordered by `first`, ending early at the first line `budget` refuses.
 * O(lines returned + bytes of the chunks touched).
 */
export function decodeRows(
  rows: readonly ChunkRow[],
  from: number,
  limit = Infinity,
  budget: PageBudget = new PageBudget(),
): StoredLine[] {
  const out: StoredLine[] = [];
  for (const row of rows) {
    const first = Number(row.first);
    const count = row.ends === null ? 1 : row.ends.length / 4;
    for (let k = Math.max(0, from - first); k < count && out.length < limit; k++) {
      const start = lineStart(row, k);
      const end = lineEnd(row, k);
      if (!budget.take(end - start)) return out;
      const [flag, time] = metaOf(row, count, k);
      const line: StoredLine = { line: row.bytes.toString("utf8", start, end), stderr: (flag & 1) === 1 };
      if (flag & 2) line.marker = true;
      if (time > 0) {
        line.time = time;
        if (flag & 4) line.serverTime = true;
      }
      out.push(line);
    }
    if (out.length >= limit) break;
  }
  return out;
}
