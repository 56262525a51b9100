/**
 * The four-bytes-at-a-time scan the fs store relies on, against JSON.stringify:
 * isPlainJsonText (a line's bytes are copied as its JSON string body only when
 * JSON.stringify would write them so); isAsciiRange (the decoder's UTF-8 check in place),
 * against a byte loop; asciiClass (both in one pass, the server's decoder) against a byte loop, on buffers with and
 * without a quote or backslash anywhere (its chunk-wide shortcut).
 */
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  ASCII,
  NOT_ASCII,
  PLAIN_ASCII,
  asciiClass,
  hasJsonEscapes,
  isAsciiRange,
  isPlainJsonText,
  viewOf,
} from "../../../src/runner/protocol/byte-scan.js";
import { fuzzParams } from "../../fuzz/settings.js";

/** asciiClass's answer by a byte loop: the reference. */
function asciiClassByLoop(buf: Buffer, start: number, end: number): number {
  let special = false;
  for (let i = start; i < end; i++) {
    if (buf[i]! >= 0x80) return NOT_ASCII;
    if (buf[i]! < 0x20 || buf[i] === 0x22 || buf[i] === 0x5c) special = true;
  }
  return special ? ASCII : PLAIN_ASCII;
}

/** The engine's gc(), exposed at run time (the test runner's workers start without --expose-gc). */
function exposeGc(): () => void {
  setFlagsFromString("--expose-gc");
  return runInNewContext("gc") as () => void;
}

/**
 * Scans a fresh 64 KiB chunk (as a request chunk is) with `scan` and returns weak
 * references to it and its memory: nothing else holds it once this returns.
 */
function scanFreshChunk(scan: (buf: Buffer) => unknown): { chunk: WeakRef<Buffer>; memory: WeakRef<ArrayBuffer> } {
  const buf = Buffer.alloc(64 * 1024, 0x61);
  scan(buf);
  return { chunk: new WeakRef(buf), memory: new WeakRef(buf.buffer as ArrayBuffer) };
}

describe("runner byte scans", () => {
  it("agrees with JSON.stringify for every single character at every position and length", () => {
    const specials = [
      '"',
      "\\",
      "\u0000",
      "\u0001",
      "\u001f",
      " ",
      "\u007f",
      "é",
      "€",
      "😀",
      "\u2028",
      "\ufffd",
      "x",
      "\t",
      "\n",
      "/",
    ];
    for (const ch of specials) {
      for (let len = 0; len < 12; len++) {
        for (let at = 0; at <= len; at++) {
          const text = "a".repeat(at) + (at < len ? ch : "") + "b".repeat(Math.max(0, len - at - 1));
          const body = Buffer.from(text);
          // At an offset inside a larger buffer, as a request chunk holds lines.
          for (const pad of [0, 1, 2, 3]) {
            const buf = Buffer.concat([Buffer.alloc(pad, 0x22), body, Buffer.from([0x5c, 0x00, 0x80])]);
            expect(isPlainJsonText(buf, pad, pad + body.length), JSON.stringify(text)).toBe(
              JSON.stringify(text) === `"${text}"`,
            );
          }
        }
      }
    }
  });

  it("random UTF-8 text: plain exactly when JSON.stringify writes the text as it is", () => {
    let seed = 99;
    const rand = () => ((seed = (seed * 1103515245 + 12345) & 0x7fffffff), seed);
    const alphabet = ["a", "Z", " ", '"', "\\", "\u0008", "\u001b", "é", "😀", "~", "\u007f"];
    let plain = 0;
    for (let i = 0; i < 5000; i++) {
      let text = "";
      const n = rand() % 40;
      for (let k = 0; k < n; k++) text += rand() % 8 === 0 ? alphabet[rand() % alphabet.length] : "x";
      const buf = Buffer.from(text);
      const expected = JSON.stringify(text) === `"${text}"`;
      expect(isPlainJsonText(buf, 0, buf.length)).toBe(expected);
      if (expected) plain++;
    }
    expect(plain).toBeGreaterThan(100);
  });

  it("isAsciiRange: false exactly when a byte of the range is 0x80 or above, at any offset, length and position", () => {
    // Non-ASCII bytes around the range must not count; inside it, at every word position.
    for (const high of [0x80, 0xc3, 0xff]) {
      for (let len = 0; len < 14; len++) {
        for (let at = -1; at < len; at++) {
          for (const pad of [0, 1, 2, 3]) {
            const buf = Buffer.alloc(pad + len + 3, 0x7f);
            buf.fill(0xff, 0, pad);
            buf.fill(0x80, pad + len);
            if (at >= 0) buf[pad + at] = high;
            expect(isAsciiRange(buf, pad, pad + len), `len ${len} at ${at} pad ${pad}`).toBe(at < 0);
          }
        }
      }
    }
  });

  it("asciiClass: the byte loop's class (not ASCII, ASCII, plain) for random bytes at any offset and length", () => {
    // Bytes drawn mostly from the ones that matter (quote, backslash, controls, 0x7f, 0x80 and up).
    const byte = fc.oneof(
      fc.constantFrom(0x22, 0x5c, 0x00, 0x1f, 0x20, 0x7f, 0x80, 0xc3, 0xff, 0x0a),
      fc.integer({ min: 0x21, max: 0x7e }),
    );
    for (const params of fuzzParams<[number[], number, number]>("asciiClass"))
      fc.assert(
        fc.property(fc.array(byte, { maxLength: 40 }), fc.nat(), fc.nat(), (bytes, a, b) => {
          const buf = Buffer.from(bytes);
          const start = bytes.length === 0 ? 0 : a % (bytes.length + 1);
          const end = start + (b % (bytes.length - start + 1));
          const got = asciiClass(buf, start, end);
          expect(got).toBe(asciiClassByLoop(buf, start, end));
          // The two scans it stands for.
          expect(got !== NOT_ASCII).toBe(isAsciiRange(buf, start, end));
          if (got !== NOT_ASCII) expect(got === PLAIN_ASCII).toBe(isPlainJsonText(buf, start, end));
        }),
        params,
      );
  });

  it("asciiClass: the same class whether or not the rest of the buffer holds a quote or a backslash", () => {
    // A buffer with neither `"` nor `\\` anywhere takes the two-test path (hasJsonEscapes false); one with either
    // outside the range takes the full one: both must give the byte loop's class for the range.
    const byte = fc.oneof(
      fc.constantFrom(0x00, 0x01, 0x0a, 0x1f, 0x20, 0x7f, 0x80, 0xc3, 0xff),
      fc.integer({ min: 0x20, max: 0x7e }).filter((b) => b !== 0x22 && b !== 0x5c),
    );
    for (const params of fuzzParams<[number[], number, number, number]>("asciiClass without escapes"))
      fc.assert(
        fc.property(
          fc.array(byte, { maxLength: 48 }),
          fc.nat(),
          fc.nat(),
          fc.integer({ min: 0, max: 2 }),
          (bytes, a, b, pad) => {
            const start0 = bytes.length === 0 ? 0 : a % (bytes.length + 1);
            const end0 = start0 + (b % (bytes.length - start0 + 1));
            // pad 0: the bytes alone; 1: a quote before the range; 2: a backslash after it.
            const head = pad === 1 ? [0x22] : [];
            const buf = Buffer.from([...head, ...bytes, ...(pad === 2 ? [0x5c] : [])]);
            const start = start0 + head.length;
            const end = end0 + head.length;
            expect(hasJsonEscapes(buf)).toBe(pad !== 0);
            expect(asciiClass(buf, start, end, true)).toBe(asciiClassByLoop(buf, start, end));
            expect(asciiClass(buf, start, end)).toBe(asciiClassByLoop(buf, start, end));
          },
        ),
        params,
      );
  });

  it("keeps no request chunk alive after the call that scanned it (review: the view cache pinned the last one)", async () => {
    const gc = exposeGc();
    const scans: Array<[string, (buf: Buffer) => unknown]> = [
      ["isAsciiRange", (buf) => isAsciiRange(buf, 0, 99)],
      ["isPlainJsonText", (buf) => isPlainJsonText(buf, 100, 199)],
      ["viewOf", (buf) => viewOf(buf).getUint8(0)],
      ["asciiClass", (buf) => asciiClass(buf, 0, 99, true)],
    ];
    for (const [name, scan] of scans) {
      const { chunk, memory } = scanFreshChunk(scan);
      // The call has ended (its job and the microtasks after it): a full GC frees the chunk.
      await new Promise((resolve) => setImmediate(resolve));
      gc();
      expect(chunk.deref(), `${name}: the Buffer`).toBeUndefined();
      expect(memory.deref(), `${name}: its ArrayBuffer`).toBeUndefined();
    }
  });

  it("a chunk's view is made once for all the lines scanned in one go, and again after the cache is dropped", async () => {
    const buf = Buffer.alloc(1024, 0x61);
    const first = viewOf(buf);
    for (let at = 0; at + 99 <= buf.length; at += 100) expect(isAsciiRange(buf, at, at + 99)).toBe(true);
    expect(viewOf(buf)).toBe(first);
    await new Promise((resolve) => setImmediate(resolve));
    const again = viewOf(buf);
    expect(again).not.toBe(first);
    expect(again.byteLength).toBe(1024);
  });
  it("isAsciiRange: the same verdict for a buffer at any byte offset of its ArrayBuffer", () => {
    // Request chunks are views at any offset of a larger allocation: every alignment of
    // buffer and range is checked, with non-ASCII bytes just outside the range on both
    // sides (a word-at-a-time scan must neither miss a byte nor read one outside).
    const backing = new ArrayBuffer(64);
    for (let offset = 0; offset < 8; offset++) {
      const buf = Buffer.from(backing, offset, 40);
      for (let start = 0; start < 9; start++) {
        for (let len = 0; len < 20; len++) {
          for (let at = -1; at < len; at++) {
            new Uint8Array(backing).fill(0xc3);
            buf.fill(0x41, start, start + len);
            if (at >= 0) buf[start + at] = 0x80;
            expect(isAsciiRange(buf, start, start + len), `offset ${offset} start ${start} len ${len} at ${at}`).toBe(
              at < 0,
            );
          }
        }
      }
    }
  });
});
