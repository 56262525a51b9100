/**
 * The fast path's LogItem decoder against protobuf-es: for every message it accepts it
 * must return exactly what `fromBinary` returns, and it must decline (null) everything
 * it does not handle plainly, so the general parser decides those.
 */
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { LogItemSchema } from "../../../src/gen/runner/v1/runner_pb.js";
import { decodeLogItem, decodeReceivedLine } from "../../../src/runner/protocol/decoder.js";
import { toLogItem } from "../../../src/runner/protocol/received-line.js";

const ID = "0b6c6f0e-9f8e-4c4b-a0c1-2f3e4d5c6b7a";

function logBytes(requestId: string, line: string, stderr: boolean): Buffer {
  return Buffer.from(
    toBinary(LogItemSchema, create(LogItemSchema, { requestId, event: { case: "log", value: { line, stderr } } })),
  );
}

/** Decodes `bytes` placed at an offset inside a larger buffer, as the fast path sees frames. */
function decodeAt(bytes: Buffer) {
  const buf = Buffer.concat([Buffer.from([9, 9, 9]), bytes, Buffer.from([7, 7])]);
  return decodeLogItem(buf, 3, 3 + bytes.length);
}

describe("fast-path LogItem decoder", () => {
  const lines = [
    "",
    "x".repeat(99),
    "a",
    "x".repeat(127),
    "x".repeat(128),
    "x".repeat(16_383),
    "x".repeat(16_384),
    "x".repeat(70_000),
    "héllo wörld € 😀",
    "\u001b[31mred\u001b[0m\r",
    "\ufeffleading byte-order mark",
    "tab\tand\0nul",
    'say "hi"',
    "back\\slash",
  ];
  const ids = [ID, ID.toUpperCase(), "", "not-a-uuid", "{" + ID + "}"];

  it("equals fromBinary for every line, request ID and stderr flag it accepts", () => {
    let decoded = 0;
    for (const id of ids) {
      for (const text of lines) {
        for (const stderr of [false, true]) {
          const bytes = logBytes(id, text, stderr);
          const fast = decodeAt(bytes);
          expect(fast).not.toBeNull();
          expect(fast).toStrictEqual(fromBinary(LogItemSchema, bytes));
          decoded++;
        }
      }
    }
    expect(decoded).toBe(ids.length * lines.length * 2);
  });

  it("accepts fields in another order and an explicit stderr=false, as fromBinary reads them", () => {
    const inner = Buffer.from([0x10, 0x00, 0x0a, 0x02, 0x68, 0x69]); // stderr=false, then line "hi"
    const idBytes = Buffer.from(ID);
    const bytes = Buffer.concat([
      Buffer.from([0x12, inner.length]),
      inner,
      Buffer.from([0x0a, idBytes.length]),
      idBytes,
    ]);
    expect(decodeAt(bytes)).toStrictEqual(fromBinary(LogItemSchema, bytes));
    expect(decodeAt(bytes)!.event).toMatchObject({ case: "log", value: { line: "hi", stderr: false } });
  });

  it("declines what it does not handle plainly (the general parser takes those)", () => {
    const end = Buffer.from(
      toBinary(
        LogItemSchema,
        create(LogItemSchema, { requestId: ID, event: { case: "end", value: { exitCode: -1, success: false } } }),
      ),
    );
    const empty = Buffer.from(toBinary(LogItemSchema, create(LogItemSchema, { requestId: ID })));
    const unknownField = Buffer.concat([logBytes(ID, "a", false), Buffer.from([0x20, 0x01])]);
    const twoLogs = Buffer.concat([logBytes("", "a", false), logBytes("", "b", false)]);
    const invalidUtf8 = Buffer.from([0x12, 0x04, 0x0a, 0x02, 0xff, 0x41]);
    const realReplacementChar = logBytes(ID, "a\ufffdb", false);
    const nonMinimalLength = Buffer.from([0x12, 0x05, 0x0a, 0x82, 0x00, 0x68, 0x69]); // valid: length 2 written in two bytes
    const truncated = logBytes(ID, "hello", false).subarray(0, 20);
    const boolTwo = Buffer.from([0x12, 0x02, 0x10, 0x02]);
    for (const bytes of [
      end,
      empty,
      unknownField,
      twoLogs,
      invalidUtf8,
      realReplacementChar,
      nonMinimalLength,
      truncated,
      boolTwo,
    ]) {
      expect(decodeAt(bytes)).toBeNull();
    }
    // What the general parser makes of them is protobuf-es's business: e.g. invalid UTF-8 is refused.
    expect(() => fromBinary(LogItemSchema, invalidUtf8)).toThrow(/utf-8/i);
    expect(fromBinary(LogItemSchema, realReplacementChar).event.value).toMatchObject({ line: "a\ufffdb" });
    expect(fromBinary(LogItemSchema, nonMinimalLength).event.value).toMatchObject({ line: "hi" });
  });

  it("random byte strings: whenever it decodes, it agrees with fromBinary", () => {
    let seed = 12345;
    const rand = () => ((seed = (seed * 1103515245 + 12345) & 0x7fffffff), seed);
    let agreed = 0;
    for (let i = 0; i < 20_000; i++) {
      // Mutate a valid message: flip, drop or insert bytes.
      const bytes = Buffer.from(logBytes(i % 2 ? ID : "", "line " + i, i % 3 === 0));
      const op = rand() % 3;
      const at = rand() % bytes.length;
      const mutated =
        op === 0
          ? (bytes.writeUInt8(rand() % 256, at), bytes)
          : op === 1
            ? Buffer.concat([bytes.subarray(0, at), bytes.subarray(at + 1)])
            : Buffer.concat([bytes.subarray(0, at), Buffer.from([rand() % 256]), bytes.subarray(at)]);
      const fast = decodeAt(mutated);
      if (fast === null) continue;
      expect(fast).toStrictEqual(fromBinary(LogItemSchema, mutated));
      agreed++;
    }
    expect(agreed).toBeGreaterThan(1000);
  });
});

/** The received-line decoder on `bytes` placed inside a larger buffer, and the message it stands for. */
function receivedAt(bytes: Buffer) {
  const buf = Buffer.concat([Buffer.from([9, 9, 9]), bytes, Buffer.from([7, 7])]);
  const line = decodeReceivedLine(buf, 3, 3 + bytes.length);
  return { buf, line, item: line === null ? null : toLogItem(line) };
}

describe("fast-path received-line decoder (the line kept as bytes)", () => {
  const lines = [
    "",
    "x".repeat(99),
    "x".repeat(128),
    "x".repeat(70_000),
    "héllo wörld € 😀",
    "\ufeffbom",
    "a\ufffdb",
    "tab\tand\0nul",
  ];

  it("stands for exactly what fromBinary returns, and keeps the line as a range of the frame's buffer", () => {
    for (const id of [ID, ID.toUpperCase(), ""]) {
      for (const text of lines) {
        for (const stderr of [false, true]) {
          const bytes = logBytes(id, text, stderr);
          const { buf, line, item } = receivedAt(bytes);
          expect(line).not.toBeNull();
          expect(item).toStrictEqual(fromBinary(LogItemSchema, bytes));
          // No copy: the bytes are read where they arrived.
          expect(line!.buf).toBe(buf);
          expect(line!.size).toBe(Buffer.byteLength(text));
          expect(buf.toString("utf8", line!.start, line!.end)).toBe(text);
          // The decoder's one scan: set exactly for an ASCII line that is its own JSON string body
          // (a non-ASCII line is left to the scans that read it, which say the same of it).
          const ascii = /^[\u0000-\u007f]*$/.test(text);
          expect(line!.plainJson, JSON.stringify(text)).toBe(ascii && JSON.stringify(text) === `"${text}"`);
          // A store that writes lines as JSON gets the port's plain shape, not the view.
          expect(JSON.parse(JSON.stringify(line))).toStrictEqual({ line: text, stderr });
        }
      }
    }
  });

  it("declines invalid UTF-8 anywhere in the line (protobuf-es refuses it), and what the message decoder declines but a literal U+FFFD", () => {
    const bad = [
      [0xff],
      [0x41, 0xc3], // cut two-byte sequence
      [0xed, 0xa0, 0x80], // an encoded surrogate
      [0xc0, 0x80], // overlong NUL
      [0x41, 0x42, 0xf4, 0x90, 0x80, 0x80], // past U+10FFFF
    ];
    for (const b of bad) {
      const bytes = Buffer.from([0x12, b.length + 2, 0x0a, b.length, ...b]);
      expect(() => fromBinary(LogItemSchema, bytes)).toThrow(/utf-8/i);
      expect(receivedAt(bytes).line).toBeNull();
    }
    const end = Buffer.from(
      toBinary(
        LogItemSchema,
        create(LogItemSchema, { requestId: ID, event: { case: "end", value: { exitCode: 1, success: false } } }),
      ),
    );
    const unknownField = Buffer.concat([logBytes(ID, "a", false), Buffer.from([0x20, 0x01])]);
    for (const bytes of [end, unknownField, Buffer.from([0x12, 0x02, 0x10, 0x02])])
      expect(receivedAt(bytes).line).toBeNull();
  });

  it("random mutations: whenever either decoder decodes, the received line agrees with fromBinary, and it declines nothing the message decoder takes", () => {
    let seed = 777;
    const rand = () => ((seed = (seed * 1103515245 + 12345) & 0x7fffffff), seed);
    let agreed = 0;
    for (let i = 0; i < 20_000; i++) {
      const bytes = Buffer.from(logBytes(i % 2 ? ID : "", i % 5 === 0 ? "é line " + i : "line " + i, i % 3 === 0));
      const op = rand() % 3;
      const at = rand() % bytes.length;
      const mutated =
        op === 0
          ? (bytes.writeUInt8(rand() % 256, at), bytes)
          : op === 1
            ? Buffer.concat([bytes.subarray(0, at), bytes.subarray(at + 1)])
            : Buffer.concat([bytes.subarray(0, at), Buffer.from([rand() % 256]), bytes.subarray(at)]);
      const { item } = receivedAt(mutated);
      if (decodeAt(mutated) !== null) expect(item).not.toBeNull();
      if (item === null) continue;
      expect(item).toStrictEqual(fromBinary(LogItemSchema, mutated));
      agreed++;
    }
    expect(agreed).toBeGreaterThan(1000);
  });

  it("the request ID is right at every alignment of the frame, and when it differs from the last one in any single byte", () => {
    // The decoder compares an item's ID with the last one's four bytes at a time: each
    // placement against a word boundary, and a change of any byte, must be seen.
    const other = (k: number) => ID.slice(0, k) + (ID[k] === "a" ? "b" : "a") + ID.slice(k + 1);
    const backing = new ArrayBuffer(4096);
    for (let offset = 0; offset < 4; offset++) {
      for (let pad = 0; pad < 4; pad++) {
        for (let k = 0; k < ID.length; k++) {
          for (const id of [ID, other(k), ID]) {
            const bytes = logBytes(id, "x".repeat(99), false);
            const buf = Buffer.from(backing, offset, pad + bytes.length + 2);
            bytes.copy(buf, pad);
            expect(decodeReceivedLine(buf, pad, pad + bytes.length)?.requestId).toBe(id);
          }
        }
      }
    }
  });
});
