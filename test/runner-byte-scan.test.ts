/**
 * The four-bytes-at-a-time scan the fs store relies on, against JSON.stringify:
 * isPlainJsonText (a line's bytes are copied as its JSON string body only when
 * JSON.stringify would write them so); isAsciiRange (the decoder's UTF-8 check in place),
 * against a byte loop.
 */
import { describe, expect, it } from "vitest";
import { isAsciiRange, isPlainJsonText } from "../src/runner/byte-scan.js";

describe("runner byte scans", () => {
  it("agrees with JSON.stringify for every single character at every position and length", () => {
    const specials = ['"', "\\", "\u0000", "\u0001", "\u001f", " ", "\u007f", "é", "€", "😀", "\u2028", "\ufffd", "x", "\t", "\n", "/"];
    for (const ch of specials) {
      for (let len = 0; len < 12; len++) {
        for (let at = 0; at <= len; at++) {
          const text = "a".repeat(at) + (at < len ? ch : "") + "b".repeat(Math.max(0, len - at - 1));
          const body = Buffer.from(text);
          // At an offset inside a larger buffer, as a request chunk holds lines.
          for (const pad of [0, 1, 2, 3]) {
            const buf = Buffer.concat([Buffer.alloc(pad, 0x22), body, Buffer.from([0x5c, 0x00, 0x80])]);
            expect(isPlainJsonText(buf, pad, pad + body.length), JSON.stringify(text)).toBe(JSON.stringify(text) === `"${text}"`);
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
});
