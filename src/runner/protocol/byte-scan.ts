/**
 * Scans over byte ranges of a Buffer, four bytes at a time. A byte loop over a Buffer costs ~0.6 ns a byte in
 * V8 (a bounds check each); 32-bit reads through a DataView about half.
 * Why: docs/decisions/runner-throughput.md, "byte-scan.ts: scanning four bytes at a time".
 */

const EMPTY = new DataView(new ArrayBuffer(0));
let viewed: Buffer | null = null;
let view: DataView = EMPTY;
let dropQueued = false;
/** The buffer whose escapes were last looked for ({@link hasJsonEscapes}) and the answer. */
let escapesOf: Buffer | null = null;
let escapes = true;

/** Drops the cached view and escape answer (queued once per fill, run when the current job ends). */
function dropView(): void {
  viewed = null;
  view = EMPTY;
  escapesOf = null;
  dropQueued = false;
}

function queueDrop(): void {
  if (!dropQueued) {
    dropQueued = true;
    queueMicrotask(dropView);
  }
}

/**
 * A DataView over `buf`: the one made last when `buf` is the same buffer and the current
 * job (the synchronous scan of a chunk, and its microtasks) has not ended. O(1).
 */
export function viewOf(buf: Buffer): DataView {
  if (buf !== viewed) {
    viewed = buf;
    view = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
    queueDrop();
  }
  return view;
}

/**
 * Whether `buf` holds a `"` or a `\` anywhere (two native scans of the whole buffer, ~1 µs for a 16 KiB request
 * chunk), remembered for the same buffer like {@link viewOf}'s view. False says no range of it needs either test.
 * The answer is about the bytes when first asked: only for a buffer nobody writes again in the current job.
 * O(buffer bytes) once a buffer, then O(1).
 *
 * @example
 * hasJsonEscapes(Buffer.from("make -j4\n")) // false
 */
export function hasJsonEscapes(buf: Buffer): boolean {
  if (buf !== escapesOf) {
    escapesOf = buf;
    escapes = buf.indexOf(0x22) !== -1 || buf.indexOf(0x5c) !== -1;
    queueDrop();
  }
  return escapes;
}

/** Non-zero when a byte of the 32-bit word `w` is zero (the classic SWAR test). */
function hasZeroByte(w: number): number {
  return (w - 0x01010101) & ~w & 0x80808080;
}

/** Non-zero when a byte of `w` is below 0x20 (bytes ≥ 0x80 never count). */
function hasControlByte(w: number): number {
  return (w - 0x20202020) & ~w & 0x80808080;
}

/**
 * True when the UTF-8 text in `buf[start, end)` is its own JSON string body: no `"`,
 * no `\` and no control character (U+0000–U+001F), the only characters JSON.stringify
 * escapes in valid UTF-8 text. O(bytes).
 *
 * @example
 * isPlainJsonText(Buffer.from('say "hi"'), 0, 8) // false
 */
export function isPlainJsonText(buf: Buffer, start: number, end: number): boolean {
  const v = viewOf(buf);
  let i = start;
  for (; i + 4 <= end; i += 4) {
    const w = v.getUint32(i);
    if ((hasControlByte(w) | hasZeroByte(w ^ 0x22222222) | hasZeroByte(w ^ 0x5c5c5c5c)) !== 0) return false;
  }
  for (; i < end; i++) {
    const b = v.getUint8(i);
    if (b < 0x20 || b === 0x22 || b === 0x5c) return false;
  }
  return true;
}

/**
 * True when every byte of `buf[start, end)` is ASCII (below 0x80): the words ORed
 * together, one test at the end. No view of the range is made (a subarray is ~100 bytes
 * of garbage a line). O(bytes).
 *
 * @example
 * isAsciiRange(Buffer.from("héllo"), 0, 6) // false
 */
export function isAsciiRange(buf: Buffer, start: number, end: number): boolean {
  const v = viewOf(buf);
  let acc = 0;
  let i = start;
  for (; i + 4 <= end; i += 4) acc |= v.getUint32(i);
  for (; i < end; i++) acc |= v.getUint8(i);
  return (acc & 0x80808080) === 0;
}

/** {@link asciiClass}: a byte at or above 0x80 (the text may still be valid UTF-8). */
export const NOT_ASCII = 0;
/** {@link asciiClass}: ASCII holding a `"`, a `\` or a control character. */
export const ASCII = 1;
/** {@link asciiClass}: ASCII that is its own JSON string body ({@link isPlainJsonText}). */
export const PLAIN_ASCII = 2;

/**
 * {@link isAsciiRange} and {@link isPlainJsonText} in one pass: {@link NOT_ASCII}, {@link ASCII}
 * or {@link PLAIN_ASCII}. The server's decoder checks each line's UTF-8 with it and keeps the
 * answer, so the log cap's cost (and the fs store's copy) need no second scan of the line.
 * `unchanging`: the caller never writes `buf` again (a received request chunk), so whether it holds a
 * `"` or `\` at all may be remembered for it ({@link hasJsonEscapes}). O(bytes), four bytes a step.
 *
 * @example
 * asciiClass(Buffer.from('say "hi"'), 0, 8) // ASCII
 */
export function asciiClass(buf: Buffer, start: number, end: number, unchanging = false): number {
  // Most request chunks hold no `"` or `\` at all (the frames' binary fields rarely do either): then each word
  // needs only the ASCII and control tests (~half the work a word). Only for a buffer that never changes: the
  // answer is remembered by identity, and a buffer written over in place would keep a stale "none".
  // Why: docs/decisions/ingest-limit.md, "byte-scan.ts: hasJsonEscapes".
  if (unchanging && !hasJsonEscapes(buf)) return asciiControlClass(buf, start, end);
  const v = viewOf(buf);
  let acc = 0;
  let special = 0;
  let i = start;
  for (; i + 4 <= end; i += 4) {
    const w = v.getUint32(i);
    acc |= w;
    special |= hasControlByte(w) | hasZeroByte(w ^ 0x22222222) | hasZeroByte(w ^ 0x5c5c5c5c);
  }
  for (; i < end; i++) {
    const b = v.getUint8(i);
    acc |= b;
    if (b < 0x20 || b === 0x22 || b === 0x5c) special = 1;
  }
  if ((acc & 0x80808080) !== 0) return NOT_ASCII;
  return special === 0 ? PLAIN_ASCII : ASCII;
}

/**
 * Whether `buf[start, end)` holds a `"` or a `\`: two native scans of the range (through one view of it, so neither
 * runs on past `end`). A caller that finds neither may class the range's parts with {@link asciiControlClass}. For a
 * range much larger than a line (a run of lines): the view costs ~100 bytes. O(range bytes).
 */
export function hasJsonEscapesIn(buf: Buffer, start: number, end: number): boolean {
  const range = buf.subarray(start, end);
  return range.indexOf(0x22) !== -1 || range.indexOf(0x5c) !== -1;
}

/**
 * {@link asciiClass} of a range with no `"` or `\` in it (the caller checked: {@link hasJsonEscapes} or
 * {@link hasJsonEscapesIn} false), which needs only the ASCII and control tests. O(bytes).
 */
export function asciiControlClass(buf: Buffer, start: number, end: number): number {
  const v = viewOf(buf);
  let acc = 0;
  let control = 0;
  let i = start;
  // Little-endian reads: the tests are per byte, so the order does not matter, and no byte swap is made. Four
  // words a step: a 100-byte line ~19 ns against ~29 ns a word a step (one loop test and branch per 16 bytes).
  for (; i + 16 <= end; i += 16) {
    const a = v.getUint32(i, true);
    const b = v.getUint32(i + 4, true);
    const c = v.getUint32(i + 8, true);
    const d = v.getUint32(i + 12, true);
    acc |= a | b | c | d;
    control |= ((a - 0x20202020) & ~a) | ((b - 0x20202020) & ~b) | ((c - 0x20202020) & ~c) | ((d - 0x20202020) & ~d);
  }
  for (; i + 4 <= end; i += 4) {
    const w = v.getUint32(i, true);
    acc |= w;
    control |= (w - 0x20202020) & ~w;
  }
  for (; i < end; i++) {
    const b = v.getUint8(i);
    acc |= b;
    if (b < 0x20) control = 0x80;
  }
  if ((acc & 0x80808080) !== 0) return NOT_ASCII;
  return (control & 0x80808080) === 0 ? PLAIN_ASCII : ASCII;
}
