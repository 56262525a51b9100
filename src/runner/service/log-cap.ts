/**
 * What one stored line counts toward a job's log cap (`limits.jobLogBytes`): the one place the
 * rule lives. A line counts LINE_RECORD_OVERHEAD plus its bytes as the most expensive of this
 * package's stores writes them (the fs store's JSON string: `"`, `\` and control characters
 * escaped), so empty lines count and no store holds more than the cap says.
 * Why: docs/decisions/runner-server.md, "log-cap.ts: what the job-log cap counts".
 */
import { isPlainJsonText, viewOf } from "../protocol/byte-scan.js";

/**
 * Bytes a line costs besides its text: at least what any store writes per line, its time
 * included (fs: a flag, a base-36 time of at most 11, two quotes and a newline, 15; memory and
 * PostgreSQL: a 4-byte end, a flag byte and an 8-byte time, 13; the archive: a varint header and
 * a time, at most 14), rounded up.
 */
export const LINE_RECORD_OVERHEAD = 16;

/** Extra bytes JSON.stringify writes for each byte below 0x20 (`\n` style: 1; `\u0001` style: 5). */
const CONTROL_EXTRA = new Uint8Array(32).fill(5);
for (const c of [0x08, 0x09, 0x0a, 0x0c, 0x0d]) CONTROL_EXTRA[c] = 1;

/** Characters JSON.stringify escapes: `"`, `\`, controls and (in a JS string) lone surrogates. */
const ESCAPED = /["\\\u0000-\u001f\ud800-\udfff]/;

/**
 * What a line received as UTF-8 bytes (valid: no lone surrogate can occur) counts toward the cap:
 * LINE_RECORD_OVERHEAD + its bytes + what escaping adds. O(bytes), four bytes a step when nothing
 * is escaped (nearly all output).
 *
 * @example
 * lineCapCost(Buffer.from("a\u0001"), 0, 2) // 16 + 2 + 5 = 23
 */
export function lineCapCost(buf: Buffer, start: number, end: number, plainJson = false): number {
  const bytes = end - start;
  // `plainJson`: the decoder's scan found it so already (runner/protocol/received-line.ts).
  if (plainJson || isPlainJsonText(buf, start, end)) return LINE_RECORD_OVERHEAD + bytes;
  const v = viewOf(buf);
  let extra = 0;
  for (let i = start; i < end; i++) {
    const b = v.getUint8(i);
    if (b < 0x20) extra += CONTROL_EXTRA[b]!;
    else if (b === 0x22 || b === 0x5c) extra += 1;
  }
  return LINE_RECORD_OVERHEAD + bytes + extra;
}

/**
 * What a line given as text counts toward the cap; `utf8Bytes` is its UTF-8 size when the
 * caller has it. A lone surrogate counts 6 (JSON writes `\udxxx`; UTF-8 counts it 3). O(length).
 *
 * @example
 * textCapCost('say "hi"') // 16 + 8 + 2 = 26
 */
export function textCapCost(text: string, utf8Bytes = Buffer.byteLength(text, "utf8")): number {
  if (!ESCAPED.test(text)) return LINE_RECORD_OVERHEAD + utf8Bytes;
  let extra = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c < 0x20) extra += CONTROL_EXTRA[c]!;
    else if (c === 0x22 || c === 0x5c) extra += 1;
    else if (c >= 0xd800 && c <= 0xdfff) {
      const next = text.charCodeAt(i + 1);
      // A pair is 4 bytes either way; a lone half is 6 in JSON against 3 counted.
      if (c <= 0xdbff && next >= 0xdc00 && next <= 0xdfff) i++;
      else extra += 3;
    }
  }
  return LINE_RECORD_OVERHEAD + utf8Bytes + extra;
}
