/**
 * The fs log store's record format: one line per record, a flag character (o/e: stdout or
 * stderr; O/E: the same for a server marker) then the line as a JSON string, then "\n".
 * JSON escapes newlines (one record per line) and keeps lone surrogates exact.
 */
import { RunnerDepotError } from "../../errors.js";
import type { StoredLine } from "../../runner/ports.js";
import { isPlainJsonText } from "../../runner/protocol/byte-scan.js";
import { ReceivedLine } from "../../runner/protocol/received-line.js";

const FLAGS: Record<string, { stderr: boolean; marker: boolean }> = {
  o: { stderr: false, marker: false },
  e: { stderr: true, marker: false },
  O: { stderr: false, marker: true },
  E: { stderr: true, marker: true },
};

/** One line's record, as text. O(line). */
function encode(line: StoredLine): string {
  const flag = line.marker ? (line.stderr ? "E" : "O") : line.stderr ? "e" : "o";
  return flag + JSON.stringify(line.line) + "\n";
}

/** Bytes of the batch's records (one line each) and each record's size. O(bytes). */
export function encodeRecords(stored: readonly StoredLine[]): { bytes: Buffer; sizes: Uint32Array } {
  const n = stored.length;
  const sizes = new Uint32Array(n);
  // A line received as bytes whose JSON string is its own bytes between quotes is copied
  // as it came (no string is made for it: the batch outlives a datasync, so every string
  // made here was copied by the GC); other lines go through encode().
  const texts: (string | null)[] = new Array<string | null>(n).fill(null);
  let total = 0;
  for (let i = 0; i < n; i++) {
    const line = stored[i]!;
    if (line instanceof ReceivedLine && isPlainJsonText(line.buf, line.start, line.end)) {
      sizes[i] = line.end - line.start + 4;
    } else {
      const record = encode(line);
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
      bytes[pos] = line.stderr ? 0x65 : 0x6f; // "e" / "o"
      bytes[pos + 1] = 0x22;
      line.buf.copy(bytes, pos + 2, line.start, line.end);
      const at = pos + 2 + (line.end - line.start);
      bytes[at] = 0x22;
      bytes[at + 1] = 0x0a;
    } else {
      bytes.write(text, pos, "utf8");
    }
    pos += sizes[i]!;
  }
  return { bytes, sizes };
}

/** One record (without its "\n") back to its line. O(record). */
export function decodeRecord(record: string): StoredLine {
  const flag = FLAGS[record[0]!];
  if (!flag) throw new RunnerDepotError("INTERNAL", "corrupt job log record");
  const line = JSON.parse(record.slice(1)) as string;
  return flag.marker ? { line, stderr: flag.stderr, marker: true } : { line, stderr: flag.stderr };
}
