/**
 * Unit tests of the runner client's building blocks: the specialised LogItem encoder
 * (byte for byte against protobuf-es), the line splitter, and the spool.
 */
import { execFileSync } from "node:child_process";
import path from "node:path";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { LogItemSchema } from "../../../src/gen/runner/v1/runner_pb.js";
import { createLogItemEncoder, FRAME_PREFIX_BYTES, utf8Length } from "../../../src/runner/protocol/encoder.js";
import { createLineSplitter, splitUtf8 } from "../../../src/runner/agent/line-splitter.js";
import { createSpool } from "../../../src/runner/client/spool.js";

const ID = "0B6C6A3E-1F1E-4C1A-9B8E-2A2F3B4C5D6E".toLowerCase();

function logFrame(requestId: string, line: string, stderr: boolean): Buffer {
  const enc = createLogItemEncoder(requestId);
  const bytes = utf8Length(line);
  const size = enc.logFrameSize(line, bytes, stderr);
  const buf = Buffer.alloc(size + 7, 0xee);
  const end = enc.writeLogFrame(buf, 3, line, bytes, stderr);
  expect(end - 3).toBe(size);
  // Nothing written outside the frame.
  expect(buf.subarray(0, 3).every((b) => b === 0xee)).toBe(true);
  expect(buf.subarray(end).every((b) => b === 0xee)).toBe(true);
  return buf.subarray(3, end);
}

function expectFrameOf(frame: Buffer, expected: Uint8Array) {
  expect(frame[0]).toBe(0);
  expect(frame.readUInt32BE(1)).toBe(expected.length);
  expect(frame.length).toBe(FRAME_PREFIX_BYTES + expected.length);
  expect(Buffer.from(frame.subarray(FRAME_PREFIX_BYTES)).equals(Buffer.from(expected))).toBe(true);
}

describe("LogItem encoder (byte for byte against protobuf-es toBinary)", () => {
  const lines = [
    "",
    "a",
    "hello world",
    "x".repeat(127),
    "x".repeat(128),
    "x".repeat(300),
    "y".repeat(16_384),
    "y".repeat(70_000),
    "ünïcødé ✓ 日本語 😀",
    "\u001b[31mred\u001b[0m\r progress 50%\r",
    "tab\tand\u0000nul",
    "lone surrogate \ud800 here",
    "é".repeat(200),
  ];
  for (const stderr of [false, true]) {
    for (const line of lines) {
      it(`log line ${JSON.stringify(line.slice(0, 24))}… (${line.length} chars) stderr=${stderr}`, () => {
        const expected = toBinary(
          LogItemSchema,
          create(LogItemSchema, { requestId: ID, event: { case: "log", value: { line, stderr } } }),
        );
        expectFrameOf(logFrame(ID, line, stderr), expected);
      });
    }
  }

  it("a line given as its bytes encodes exactly as the same line given as text", () => {
    const enc = createLogItemEncoder(ID);
    for (const stderr of [false, true]) {
      for (const line of lines) {
        const src = Buffer.concat([Buffer.from("pre"), Buffer.from(line, "utf8"), Buffer.from("post")]);
        const bytes = src.length - 7;
        const buf = Buffer.alloc(enc.logFrameSize("", bytes, stderr) + 2, 0xee);
        const end = enc.writeLogFrameBytes(buf, 1, src, 3, 3 + bytes, stderr);
        expect(end).toBe(buf.length - 1);
        expect(buf[0]).toBe(0xee);
        expect(buf[end]).toBe(0xee);
        expect(buf.subarray(1, end).equals(logFrame(ID, line, stderr))).toBe(true);
      }
    }
  });

  it("an empty request ID is omitted like protobuf-es does", () => {
    const expected = toBinary(
      LogItemSchema,
      create(LogItemSchema, { requestId: "", event: { case: "log", value: { line: "x", stderr: true } } }),
    );
    expectFrameOf(logFrame("", "x", true), expected);
  });

  const ends = [
    { exitCode: 0, success: true, repoUrl: "https://example.com/r.git", commitSha: "0123456789abcdef" },
    { exitCode: 0, success: false, repoUrl: "", commitSha: "" },
    { exitCode: 1, success: false, repoUrl: "r", commitSha: "" },
    { exitCode: 255, success: false, repoUrl: "", commitSha: "c" },
    { exitCode: 137, success: true, repoUrl: "ü://ñ", commitSha: "😀" },
    { exitCode: -1, success: false, repoUrl: "", commitSha: "" },
    { exitCode: -2147483648, success: false, repoUrl: "x".repeat(200), commitSha: "y" },
    { exitCode: 2147483647, success: true, repoUrl: "", commitSha: "" },
  ];
  for (const end of ends) {
    it(`job end ${JSON.stringify(end).slice(0, 80)}`, () => {
      const expected = toBinary(
        LogItemSchema,
        create(LogItemSchema, { requestId: ID, event: { case: "end", value: end } }),
      );
      expectFrameOf(createLogItemEncoder(ID).endFrame(end), expected);
      const back = fromBinary(LogItemSchema, expected);
      expect(back.event.case).toBe("end");
    });
  }

  it("utf8Length matches Buffer.byteLength", () => {
    for (const s of lines) expect(utf8Length(s)).toBe(Buffer.byteLength(s, "utf8"));
  });
});

describe("encoder: no global lookups per line", () => {
  it("writes line frames without reading globalThis.Buffer (a getter in Node) once per line", () => {
    // Node's global Buffer is an accessor; read per line it was a getter call through the
    // generic global load IC in the agent's hottest path. Count the reads while encoding.
    const enc = createLogItemEncoder(ID);
    const src = Buffer.from("x".repeat(99));
    const out = Buffer.alloc(200 * 1000);
    const original = Object.getOwnPropertyDescriptor(globalThis, "Buffer")!;
    let reads = 0;
    Object.defineProperty(globalThis, "Buffer", {
      configurable: true,
      enumerable: false,
      get: () => (reads++, original.get ? original.get.call(globalThis) : original.value),
    });
    let pos = 0;
    try {
      for (let i = 0; i < 1000; i++) pos = enc.writeLogFrameBytes(out, pos, src, 0, 99, i % 10 === 9);
    } finally {
      Object.defineProperty(globalThis, "Buffer", original);
    }
    expect(reads).toBe(0);
    expect(
      fromBinary(LogItemSchema, out.subarray(FRAME_PREFIX_BYTES, out.readUInt32BE(1) + FRAME_PREFIX_BYTES)).event.value,
    ).toMatchObject({ line: "x".repeat(99) });
  });
});

describe("encoder: a run's line heads", () => {
  it("are carved from the encoder's own blocks, so they keep no shared Buffer pool memory alive", () => {
    const enc = createLogItemEncoder(ID);
    const buffers = new Set<ArrayBufferLike>();
    let bytes = 0;
    for (const stderr of [false, true]) {
      const framer = enc.lineFramer(stderr, Date.now());
      for (let n = 0; n < 1024; n++) {
        // Other code allocates between runs; a head from Buffer's pool would sit in a new 8 KiB pool block each time.
        Buffer.allocUnsafe(4000);
        const head = framer.head(n);
        buffers.add(head.buffer);
        bytes += head.length;
      }
    }
    expect(bytes).toBeGreaterThan(2048 * 40);
    expect(buffers.size).toBeLessThanOrEqual(Math.ceil(bytes / (16 * 1024)) + 1);
  });
});

describe("splitUtf8", () => {
  it("keeps short lines whole and cuts long ones between code points", () => {
    expect(splitUtf8("abc", 4)).toEqual(["abc"]);
    expect(splitUtf8("ééé", 4)).toEqual(["éé", "é"]);
    const line = "a😀b😀".repeat(1000);
    const pieces = splitUtf8(line, 7);
    expect(pieces.join("")).toBe(line);
    for (const p of pieces) expect(Buffer.byteLength(p)).toBeLessThanOrEqual(7);
    expect(() => splitUtf8("x", 3)).toThrow(RangeError);
  });
});

describe("line splitter", () => {
  function split(chunks: Array<Buffer | string>, maxLineBytes?: number): string[] {
    const out: string[] = [];
    const s = createLineSplitter((l) => out.push(l), { maxLineBytes });
    for (const c of chunks) s.push(typeof c === "string" ? Buffer.from(c) : c);
    s.end();
    return out;
  }

  it("splits on \\n only; \\r, ANSI escapes and empty lines pass through", () => {
    expect(split(["a\r\nb\n\n\u001b[1mc\u001b[0m\rd\n"])).toEqual(["a\r", "b", "", "\u001b[1mc\u001b[0m\rd"]);
  });

  it("joins lines split across chunks, also inside a multi-byte character", () => {
    const text = Buffer.from("héllo wörld\nsecond 😀 line\n");
    const chunks = [...text].map((b) => Buffer.from([b])); // one byte at a time
    expect(split(chunks)).toEqual(["héllo wörld", "second 😀 line"]);
  });

  it("emits a final unterminated line, and nothing for no output", () => {
    expect(split(["a\nlast"])).toEqual(["a", "last"]);
    expect(split([])).toEqual([]);
    expect(split(["only\n"])).toEqual(["only"]);
  });

  it("replaces invalid UTF-8 with U+FFFD like the WHATWG decoder", () => {
    const bad = Buffer.from([0x66, 0x6f, 0xff, 0xfe, 0x6f, 0x20, 0xe2, 0x82, 0x20, 0xc3, 0x0a]);
    const expected = new TextDecoder("utf-8").decode(bad.subarray(0, bad.length - 1));
    expect(expected).toContain("\ufffd");
    expect(split([bad])).toEqual([expected]);
  });

  it("splits over-long lines at a character boundary, complete or still unterminated", () => {
    const line = "é".repeat(50) + "😀".repeat(40) + "z".repeat(33);
    for (const chunks of [[`${line}\n`], [line], [...Buffer.from(line)].map((b) => Buffer.from([b]))]) {
      const out = split(chunks as Array<Buffer | string>, 16);
      expect(out.join("")).toBe(line);
      for (const piece of out) expect(Buffer.byteLength(piece)).toBeLessThanOrEqual(16);
      expect(out.length).toBeGreaterThanOrEqual(Math.ceil(Buffer.byteLength(line) / 16));
    }
  });

  it("never emits a piece over the limit even when replacement grows the text", () => {
    const bad = Buffer.alloc(40, 0xff); // 40 invalid bytes → 40 × U+FFFD = 120 bytes
    const out = split([bad, "\n"], 16);
    expect(out.join("")).toBe("\ufffd".repeat(40));
    for (const piece of out) expect(Buffer.byteLength(piece)).toBeLessThanOrEqual(16);
  });
});

describe("spool", () => {
  it("is an object V8 keeps in fast mode (append, end and bytes are read for every line)", () => {
    // An object literal with getters is kept in dictionary mode: each read of `end` or
    // `append` was then a hash lookup. Checked in a child with the natives syntax on, two
    // spools used as a job uses them; the property loads must not be dictionary lookups.
    const script = [
      `import { createSpool } from ${JSON.stringify(path.resolve("src/runner/client/spool.ts"))};`,
      "const a = createSpool(), b = createSpool();",
      "for (const s of [a, b]) { s.append(3, (buf, pos) => pos + 3); s.drop(1); }",
      "console.log(JSON.stringify([%HasFastProperties(a), %HasFastProperties(b), %HaveSameMap(a, b)]));",
    ].join("\n");
    const out = execFileSync(
      process.execPath,
      ["--allow-natives-syntax", "--import", "tsx", "--input-type=module", "-e", script],
      { encoding: "utf8" },
    );
    expect(JSON.parse(out)).toEqual([true, true, true]);
  });

  function fill(n: number, chunkBytes = 64) {
    const spool = createSpool({ chunkBytes });
    for (let i = 0; i < n; i++) {
      const b = Buffer.from(`item-${i};`);
      spool.append(b.length, (buf, pos) => pos + b.copy(buf, pos));
    }
    return spool;
  }
  const text = (bs: Buffer[]) => Buffer.concat(bs).toString();

  it("slices whole items, across chunks, within a byte budget (at least one item)", () => {
    const spool = fill(30);
    expect(spool.end).toBe(30);
    const all = spool.slice(0, 1 << 20);
    expect(all.to).toBe(30);
    expect(text(all.buffers)).toBe(Array.from({ length: 30 }, (_, i) => `item-${i};`).join(""));
    const some = spool.slice(5, 20);
    expect(text(some.buffers)).toBe("item-5;item-6;");
    expect(some.to).toBe(7);
    const tiny = spool.slice(12, 1);
    expect(text(tiny.buffers)).toBe("item-12;");
    expect(spool.slice(30, 100).to).toBe(30);
  });

  it("drops acknowledged items and replays from any held offset", () => {
    const spool = fill(30);
    spool.drop(17);
    expect(spool.start).toBe(17);
    expect(spool.has(16)).toBe(false);
    expect(spool.has(17)).toBe(true);
    expect(spool.has(30)).toBe(true);
    expect(text(spool.slice(17, 1 << 20).buffers)).toBe(
      Array.from({ length: 13 }, (_, i) => `item-${i + 17};`).join(""),
    );
    expect(spool.slice(3, 100).buffers).toEqual([]);
    spool.drop(30);
    expect(spool.bytes).toBe(0);
  });

  it("truncates and keeps appending in order", () => {
    const spool = fill(20);
    spool.truncate(8);
    expect(spool.end).toBe(8);
    const b = Buffer.from("new;");
    spool.append(b.length, (buf, pos) => pos + b.copy(buf, pos));
    expect(text(spool.slice(6, 1 << 20).buffers)).toBe("item-6;item-7;new;");
    expect(spool.frames(6).map((f) => f.toString())).toEqual(["item-6;", "item-7;", "new;"]);
  });
});
