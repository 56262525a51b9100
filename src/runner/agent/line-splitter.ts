/**
 * Turns a byte stream (a child's stdout or stderr) into log lines: split on `\n` only
 * (`\r` and ANSI escapes pass through), bytes that are not UTF-8 replaced by U+FFFD,
 * lines longer than the line limit cut at a character boundary, and a final line
 * without a newline still emitted at the end.
 */
import { Buffer, isUtf8 } from "node:buffer";

/** The contract's default line limit: 64 KiB of UTF-8. */
export const DEFAULT_MAX_LINE_BYTES = 64 * 1024;

/**
 * Splits a string into pieces of at most `maxBytes` UTF-8 bytes, cut between code points.
 * Lone surrogates become U+FFFD (as any UTF-8 encoder does).
 *
 * @example
 * splitUtf8("ééé", 4) // ["éé", "é"]
 */
export function splitUtf8(line: string, maxBytes: number): string[] {
  if (maxBytes < 4) throw new RangeError("maxBytes must be at least 4 (one UTF-8 code point)");
  if (line.length * 3 <= maxBytes) return [line];
  const b = Buffer.from(line, "utf8");
  if (b.length <= maxBytes) return [line];
  const pieces: string[] = [];
  let pos = 0;
  while (b.length - pos > maxBytes) {
    const cut = charStart(b, pos + maxBytes);
    pieces.push(b.toString("utf8", pos, cut));
    pos = cut;
  }
  pieces.push(b.toString("utf8", pos));
  return pieces;
}

/** The longest prefix of `line` within `max` UTF-8 bytes, cut at a character boundary. */
export function cutUtf8(line: string, max: number): { text: string; bytes: number } {
  const buf = Buffer.from(line, "utf8");
  if (buf.length <= max) return { text: line, bytes: buf.length };
  const cut = charStart(buf, max);
  return { text: buf.subarray(0, cut).toString("utf8"), bytes: cut };
}

/** The nearest index at or before `at` where a character of valid UTF-8 `b` starts. */
function charStart(b: Uint8Array, at: number): number {
  let cut = at;
  // Back off over continuation bytes (10xxxxxx) so no character is split.
  while (cut > 0 && (b[cut]! & 0xc0) === 0x80) cut--;
  return cut;
}

/** Options of {@link createLineSplitter}. */
interface LineSplitterOptions {
  /** Longest line in UTF-8 bytes (after U+FFFD replacement). Default 64 KiB. */
  maxLineBytes?: number;
  /**
   * Called instead of `onLine` for a line that is valid UTF-8 within the limit, with its
   * bytes `buf[start, end)` (a view valid only during the call): the string `onLine`
   * would get has exactly these bytes, so a caller that only forwards bytes skips a
   * decode and a string per line. Other lines (invalid UTF-8, over the limit) still go
   * to `onLine` as strings.
   */
  onBytes?: (buf: Buffer, start: number, end: number) => void;
  /**
   * Called with the complete lines `buf[start, end)` of each chunk the splitter scans (every line ended by `\n`: a
   * read's, or the line a read completes) when they are valid UTF-8, before `onBytes` sees any of them. It takes lines
   * from `start` on, never one over the limit, and returns where it stopped: a line's start in `[start, end]`, `end`
   * when it took them all. The line from there goes to `onBytes` or `onLine` alone, and the lines after it to
   * `onRun` again. Needs `onBytes`.
   */
  onRun?: (buf: Buffer, start: number, end: number) => number;
  /**
   * Secret masking across the line limit's cuts (runner/masking/): `text` masks a line before
   * it is cut, and `cut` moves the cut of an over-long unterminated line off any secret.
   */
  masking?: {
    text(line: string): string;
    cut(buf: Buffer, pos: number, cut: number): number;
    /** Whether `buf[start, end)`, a line's first piece, is a command whose value must not be seen in clear (`::add-mask::`). */
    command?(buf: Buffer, start: number, end: number): boolean;
    /** What a later piece of such a line becomes (the piece is part of the command's value). */
    value?(piece: string): string;
  };
}

/** What {@link createLineSplitter} returns. */
export interface LineSplitter {
  /** Feeds bytes; calls the line callback for every complete (or over-long) line. */
  push(chunk: Uint8Array): void;
  /** Emits the final unterminated line, if any. */
  end(): void;
}

/**
 * Creates a line splitter calling `onLine` for each line, in order.
 *
 * @example
 * const split = createLineSplitter((line) => client.log(line, false));
 * child.stdout.on("data", (b) => split.push(b)).on("end", () => split.end());
 */
export function createLineSplitter(onLine: (line: string) => void, options: LineSplitterOptions = {}): LineSplitter {
  const max = options.maxLineBytes ?? DEFAULT_MAX_LINE_BYTES;
  if (!Number.isInteger(max) || max < 4) throw new RangeError("maxLineBytes must be an integer ≥ 4");
  const onBytes = options.onBytes;
  const onRun = onBytes === undefined ? undefined : options.onRun;
  const masking = options.masking;
  let rest: Buffer | null = null;
  // The line being read was cut already (the next bytes continue it), and began with a command
  // (`::add-mask::`): its later pieces are the command's value, so they go to `masking.value`.
  let cutLine = false;
  let commandLine = false;

  function emit(buf: Buffer, s: number, e: number): void {
    if (commandLine) {
      onLine(masking!.value!(buf.toString("utf8", s, e)));
      return;
    }
    const line = buf.toString("utf8", s, e);
    // Replacement can grow the text (1 bad byte → 3 bytes of U+FFFD), so measure long ones again.
    if ((e - s) * 3 <= max) {
      onLine(line);
      return;
    }
    for (const piece of splitUtf8(masking ? masking.text(line) : line, max)) onLine(piece);
  }

  /** Emits every complete line of `buf` and keeps its unterminated tail in `rest`. O(bytes). */
  function scan(buf: Buffer): void {
    let pos = 0;
    // One native UTF-8 check per chunk (O(chunk bytes)) over its complete lines: a newline
    // is a character boundary, so when the whole run is valid, so is every line in it.
    let valid = false;
    let last = -1;
    if (onBytes !== undefined) {
      last = buf.lastIndexOf(10);
      valid = last !== -1 && isUtf8(last + 1 === buf.length ? buf : buf.subarray(0, last + 1));
      // A line continuing a cut command is its value (emit below); any other run may go whole.
      if (valid && onRun !== undefined && !commandLine) {
        pos = onRun(buf, 0, last + 1);
        // The run's first line ended any cut line: a command cut after the run must be seen as one again.
        if (pos > 0) cutLine = false;
      }
    }
    for (let nl = buf.indexOf(10, pos); nl !== -1; nl = buf.indexOf(10, pos)) {
      if (valid && nl - pos <= max && !commandLine) onBytes!(buf, pos, nl);
      else emit(buf, pos, nl);
      pos = nl + 1;
      cutLine = commandLine = false;
      // The lines after one that went alone (a secret's form, a command, a line over the limit) may go whole again:
      // a read with one secret in it would otherwise send the rest of its lines one by one.
      if (valid && onRun !== undefined && pos <= last) pos = onRun(buf, pos, last + 1);
    }
    // An unterminated line longer than the limit is sent in pieces now instead of
    // buffering without bound; the raw cut steps back to a UTF-8 sequence start.
    while (buf.length - pos > max) {
      let cut = pos + max;
      for (let k = 0; k < 3 && (buf[cut]! & 0xc0) === 0x80; k++) cut--;
      if (masking) {
        cut = masking.cut(buf, pos, cut);
        if (!cutLine) commandLine = masking.command?.(buf, pos, cut) === true && masking.value !== undefined;
      }
      // The command's first piece is emitted as a line of its own (it registers what it holds).
      const first = commandLine && !cutLine;
      if (first) commandLine = false;
      emit(buf, pos, cut);
      if (first) commandLine = true;
      cutLine = true;
      pos = cut;
    }
    if (pos < buf.length) rest = Buffer.from(buf.subarray(pos));
  }

  return {
    push(chunk) {
      let buf = Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
      if (rest !== null) {
        const head = rest;
        rest = null;
        const nl = buf.indexOf(10);
        if (nl === -1) {
          buf = Buffer.concat([head, buf]);
        } else {
          // Only the line the last chunk left open is joined (O(line)), not the whole chunk:
          // a pipe's reads rarely end on a newline, and copying every read into a fresh
          // buffer was a second pass over the job's output (and fresh pages to fault in).
          scan(Buffer.concat([head, buf.subarray(0, nl + 1)]));
          buf = buf.subarray(nl + 1);
          if (buf.length === 0) return;
        }
      }
      scan(buf);
    },
    end() {
      if (rest !== null && rest.length > 0) emit(rest, 0, rest.length);
      rest = null;
      cutLine = commandLine = false;
    },
  };
}
