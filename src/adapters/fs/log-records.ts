/**
 * The fs log store's record format: one line per record, a flag character, the line's time
 * when it has one, then the line as a JSON string, then "\n". JSON escapes newlines (one
 * record per line) and keeps lone surrogates exact.
 *
 * Flags without a time (what every store before per-line times wrote; still read): o/e
 * (stdout or stderr), O/E (the same for a server marker). With a time: "p" + bits (bit 0
 * stderr, bit 1 marker, bit 2 server time), i.e. p–w, then the time as signed base-36 µs
 * from the job's `startedAt` (a few characters: 7 cover 21 hours either way, 8 cover 32
 * days). Why: docs/decisions/log-line-time.md, "fs records".
 */
import { RunnerDepotError } from "../../errors.js";
import type { StoredLine } from "../../runner/ports.js";
import { isPlainJsonText } from "../../runner/protocol/byte-scan.js";
import { ReceivedLine } from "../../runner/protocol/received-line.js";
import { fromMicros, toMicros } from "../../runner/protocol/line-time.js";

const FLAGS: Record<string, { stderr: boolean; marker: boolean }> = {
  o: { stderr: false, marker: false },
  e: { stderr: true, marker: false },
  O: { stderr: false, marker: true },
  E: { stderr: true, marker: true },
};

/** Bits of a timed record's flag (its letter is "p" + bits). */
const TIMED_STDERR = 1;
const TIMED_MARKER = 2;
const TIMED_SERVER = 4;
const TIMED_FIRST = 0x70; // "p"

/** The flag and time of a record: o/e/O/E for a line without a time, else the timed letter and the delta. O(1). */
function head(line: StoredLine, baseUs: number): string {
  const us = toMicros(line.time ?? 0);
  if (us === 0) return line.marker ? (line.stderr ? "E" : "O") : line.stderr ? "e" : "o";
  const bits =
    (line.stderr ? TIMED_STDERR : 0) | (line.marker ? TIMED_MARKER : 0) | (line.serverTime ? TIMED_SERVER : 0);
  return String.fromCharCode(TIMED_FIRST + bits) + (us - baseUs).toString(36);
}

/** One line's record, as text. O(line). */
function encode(line: StoredLine, baseUs: number): string {
  return head(line, baseUs) + JSON.stringify(line.line) + "\n";
}

/** The µs a job's record times count from: its `startedAt` (set by the append that stores its first line). O(1). */
export function timeBase(startedAt: string | null): number {
  return startedAt === null ? 0 : Date.parse(startedAt) * 1000;
}

/**
 * Bytes of the batch's records (one line each) and each record's size; times count from `baseUs`
 * ({@link timeBase}). O(bytes).
 */
export function encodeRecords(stored: readonly StoredLine[], baseUs: number): { bytes: Buffer; sizes: Uint32Array } {
  const n = stored.length;
  const sizes = new Uint32Array(n);
  // A line received as bytes whose JSON string is its own bytes between quotes is copied
  // as it came (no string is made for it: the batch outlives a datasync, so every string
  // made here was copied by the GC); other lines go through encode().
  const texts: (string | null)[] = new Array<string | null>(n).fill(null);
  const heads: string[] = new Array<string>(n);
  let total = 0;
  for (let i = 0; i < n; i++) {
    const line = stored[i]!;
    if (line instanceof ReceivedLine && (line.plainJson || isPlainJsonText(line.buf, line.start, line.end))) {
      // The flag and time are ASCII: their length is their bytes.
      heads[i] = head(line, baseUs);
      sizes[i] = heads[i]!.length + line.end - line.start + 3;
    } else {
      const record = encode(line, baseUs);
      texts[i] = record;
      sizes[i] = Buffer.byteLength(record, "utf8");
    }
    total += sizes[i]!;
  }
  const bytes = Buffer.allocUnsafe(total);
  let pos = 0;
  for (let i = 0; i < n; i++) {
    const text = texts[i];
    if (text === null) {
      const line = stored[i] as ReceivedLine;
      const h = bytes.write(heads[i]!, pos, "latin1");
      bytes[pos + h] = 0x22;
      line.buf.copy(bytes, pos + h + 1, line.start, line.end);
      const at = pos + h + 1 + (line.end - line.start);
      bytes[at] = 0x22;
      bytes[at + 1] = 0x0a;
    } else {
      bytes.write(text, pos, "utf8");
    }
    pos += sizes[i]!;
  }
  return { bytes, sizes };
}

/** One record (without its "\n") back to its line; times count from `baseUs` ({@link timeBase}). O(record). */
export function decodeRecord(record: string, baseUs: number): StoredLine {
  const flag = FLAGS[record[0]!];
  if (flag) {
    const line = JSON.parse(record.slice(1)) as string;
    return flag.marker ? { line, stderr: flag.stderr, marker: true } : { line, stderr: flag.stderr };
  }
  const bits = record.charCodeAt(0) - TIMED_FIRST;
  const quote = record.indexOf('"', 1);
  if (bits < 0 || bits > 7 || quote < 2) throw new RunnerDepotError("INTERNAL", "corrupt job log record");
  const delta = parseInt(record.slice(1, quote), 36);
  if (!Number.isSafeInteger(delta)) throw new RunnerDepotError("INTERNAL", "corrupt job log record");
  const line = JSON.parse(record.slice(quote)) as string;
  const out: StoredLine = { line, stderr: (bits & TIMED_STDERR) !== 0 };
  if (bits & TIMED_MARKER) out.marker = true;
  out.time = fromMicros(baseUs + delta);
  if (bits & TIMED_SERVER) out.serverTime = true;
  return out;
}
