/**
 * The fs log store's search fast path (JobLogStore.findLines): the log file's bytes are searched for the needle as
 * a record writes it (its JSON string's inside, UTF-8) — with `Buffer.indexOf`, or for an ASCII needle without case
 * an escaped `i` RegExp over the block read as Latin-1 — 4 MiB at a time, and only the records it occurs in are
 * decoded. A hit's line position comes from the sparse index (log-read.ts): the nearest indexed offset at or before
 * it, then at most STRIDE newlines counted. So a scan costs O(bytes scanned) in native code plus O(hits × STRIDE),
 * never a string per line. Why: docs/decisions/log-search.md, "The fs fast path".
 */
import { open } from "node:fs/promises";
import type { FoundLines } from "../../runner/ports.js";
import { decodeRecord } from "./log-records.js";
import { STRIDE } from "./log-read.js";

/** Bytes per read (the buffer is this, or twice the longest record when that is more). */
const READ_CHUNK = 4 * 1024 * 1024;
/**
 * Read buffers of finished scans, kept for the next (at most SPARE of them): a scan a request would otherwise leave
 * 4 MiB of garbage outside the heap, which the GC does not hurry to free (8 requests in a row left +32 MiB of RSS).
 */
const SPARE = 4;
const spare: Buffer[] = [];

/** Where the scan is: a byte offset of the file known to start line `line`. */
interface Cursor {
  offset: number;
  line: number;
}

/** Finds a needle in a block of records: `block(data, whole)` gives the search of `data`'s first `whole` bytes. */
export interface RecordFinder {
  block(data: Buffer, whole: number): (from: number) => number;
}

/**
 * The search for `needle` as a record holds it (its JSON string's inside, UTF-8), or null when it cannot be found
 * that way: a lone surrogate (half of a pair in a line is kept as UTF-8, not escaped), or a needle without case
 * that is not ASCII. Without case, the block is read as Latin-1 (a byte a character, so string and byte offsets
 * agree) and searched with an escaped RegExp with the `i` flag: JS folds no non-ASCII character onto an ASCII one
 * there, and the characters a record escapes have no case, so a line that holds the needle in any case holds its
 * escaped form in some case.
 */
export function recordFinder(needle: string, ignoreCase: boolean): RecordFinder | null {
  if (/[\uD800-\uDFFF]/.test(needle.replace(/[\uD800-\uDBFF][\uDC00-\uDFFF]/g, ""))) return null;
  const escaped = JSON.stringify(needle).slice(1, -1);
  if (!ignoreCase) {
    const bytes = Buffer.from(escaped, "utf8");
    return { block: (data) => (from) => data.indexOf(bytes, from) };
  }
  if (!/^[\x00-\x7f]*$/.test(escaped)) return null;
  const re = new RegExp(escaped.replace(/[\\^$.*+?()[\]{}|/-]/g, "\\$&"), "gi");
  return {
    block(data, whole) {
      const text = data.toString("latin1", 0, whole);
      return (from) => {
        re.lastIndex = from;
        return re.exec(text)?.index ?? -1;
      };
    },
  };
}

/** The greatest indexed checkpoint at or before `offset` (binary search, O(log lines)). */
function checkpointBefore(index: readonly number[], offset: number): number {
  let lo = 0;
  let hi = index.length - 1;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (index[mid]! <= offset) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

/**
 * Moves `cursor` to byte `target` (a record's start, at or after it) of `data` (which starts at file offset
 * `base`): jumps to the nearest checkpoint when it is ahead, then counts newlines. O(STRIDE) after a jump.
 */
function advance(cursor: Cursor, index: readonly number[], data: Buffer, base: number, target: number): void {
  const c = checkpointBefore(index, target);
  if (c * STRIDE > cursor.line && index[c]! >= base) {
    cursor.offset = index[c]!;
    cursor.line = c * STRIDE;
  }
  let at = cursor.offset - base;
  const end = target - base;
  while (at < end) {
    const nl = data.indexOf(0x0a, at);
    if (nl < 0 || nl >= end) break;
    cursor.line++;
    at = nl + 1;
  }
  cursor.offset = target;
}

/**
 * Candidate lines for `needle` in the first `end` bytes of `path` from line `from` (see JobLogStore.findLines);
 * record times count from `baseUs`.
 */
export async function findLines(
  path: string,
  index: readonly number[],
  end: number,
  from: number,
  finder: RecordFinder,
  limits: { maxBytes: number; maxHits: number },
  baseUs: number,
): Promise<FoundLines> {
  const checkpoint = Math.min(Math.floor(from / STRIDE), Math.max(0, index.length - 1));
  const cursor: Cursor = { offset: index[checkpoint] ?? 0, line: checkpoint * STRIDE };
  const out: FoundLines = { hits: [], next: from, bytes: 0 };
  let scanned = 0;
  const fh = await open(path, "r");
  let buf: Buffer | undefined;
  try {
    // One buffer for the whole scan: the unfinished record moves to its front and the next read lands after it,
    // so no chunk is copied or allocated again (a fresh megabyte a read cost more in page faults than the search).
    buf = spare.pop() ?? Buffer.allocUnsafeSlow(READ_CHUNK);
    let kept = 0;
    let keptAt = 0;
    let pos = cursor.offset;
    while (pos < end && scanned < limits.maxBytes) {
      if (keptAt > 0) buf.copy(buf, 0, keptAt, keptAt + kept);
      // A record longer than the room left: the buffer grows (to the longest record, at most).
      if (buf.length - kept < READ_CHUNK / 2) {
        const bigger = Buffer.allocUnsafeSlow(buf.length * 2);
        buf.copy(bigger, 0, 0, kept);
        buf = bigger;
      }
      const { bytesRead } = await fh.read(buf, kept, Math.min(buf.length - kept, end - pos), pos);
      if (bytesRead === 0) break;
      const base = pos - kept;
      pos += bytesRead;
      const data = buf.subarray(0, kept + bytesRead);
      // Whole records only: the rest waits for the next read.
      const whole = data.lastIndexOf(0x0a) + 1;
      kept = data.length - whole;
      keptAt = whole;
      if (whole === 0) continue;
      // Skip to line `from` first (at most STRIDE records from the checkpoint).
      if (cursor.line < from) {
        let at = cursor.offset - base;
        while (cursor.line < from) {
          const nl = data.indexOf(0x0a, at);
          if (nl < 0 || nl >= whole) break;
          cursor.line++;
          at = nl + 1;
        }
        cursor.offset = base + at;
        if (cursor.line < from) continue;
      }
      const scanStart = cursor.offset - base;
      const find = finder.block(data, whole);
      let at = find(scanStart);
      while (at >= 0 && at < whole) {
        const start = at === 0 ? 0 : data.lastIndexOf(0x0a, at - 1) + 1;
        const quote = data.indexOf(0x22, start);
        // A hit in the record's head (its flag and time, before the opening quote) is no hit: look on from the quote.
        if (at < quote) {
          at = find(quote + 1);
          continue;
        }
        const stop = data.indexOf(0x0a, at);
        advance(cursor, index, data, base, base + start);
        out.hits.push({ position: cursor.line, line: decodeRecord(data.toString("utf8", start, stop), baseUs) });
        if (out.hits.length >= limits.maxHits) {
          out.next = cursor.line + 1;
          out.bytes = scanned + stop + 1 - scanStart;
          return out;
        }
        at = find(stop + 1);
      }
      advance(cursor, index, data, base, base + whole);
      scanned += whole - scanStart;
    }
  } finally {
    if (buf?.length === READ_CHUNK && spare.length < SPARE) spare.push(buf);
    await fh.close();
  }
  out.next = cursor.line;
  out.bytes = scanned;
  return out;
}
