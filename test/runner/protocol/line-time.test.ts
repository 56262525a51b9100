/**
 * Per-line time on the wire and in text (runner/protocol/line-time.ts): the encoder writes
 * `time_unix_nano` byte for byte as protobuf-es does, every stamp round-trips to the
 * microsecond, and the RFC 3339 form is the ISO instant with six fractional digits.
 */
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { LogItemSchema } from "../../../src/gen/runner/v1/runner_pb.js";
import { createLogItemEncoder, FRAME_PREFIX_BYTES, utf8Length } from "../../../src/runner/protocol/encoder.js";
import { decodeReceivedLine } from "../../../src/runner/protocol/decoder.js";
import {
  fromMicros,
  msToNanos,
  nanosToMs,
  readNanos,
  rfc3339Micro,
  toMicros,
  writeNanos,
} from "../../../src/runner/protocol/line-time.js";
import { fuzzParams } from "../../fuzz/settings.js";

const ID = "0b6c6f0e-9f8e-4c4b-a0c1-2f3e4d5c6b7a";
/**
 * µs counts whose ms (µs ÷ 1000) a double keeps to the µs: below 2^42 ms (the year 2109), where the ms value's
 * rounding error stays under half a µs.
 */
const MAX_EXACT_MICROS = 2 ** 42 * 1000 - 1;
const micros = fc.oneof(
  fc.integer({ min: 1, max: MAX_EXACT_MICROS }),
  fc.integer({ min: 1_600_000_000_000_000, max: 2_000_000_000_000_000 }),
);

describe("line time", () => {
  it("the encoder writes time_unix_nano byte for byte as protobuf-es (text and bytes paths); the decoder reads it back", () => {
    const enc = createLogItemEncoder(ID);
    for (const params of fuzzParams<[number, string, boolean]>("line time encoder"))
      fc.assert(
        fc.property(micros, fc.string({ unit: "grapheme", maxLength: 40 }), fc.boolean(), (us, line, stderr) => {
          const ms = fromMicros(us);
          const expected = toBinary(
            LogItemSchema,
            create(LogItemSchema, {
              requestId: ID,
              event: { case: "log", value: { line, stderr, timeUnixNano: msToNanos(ms) } },
            }),
          );
          const bytes = utf8Length(line);
          const size = enc.logFrameSize(line, bytes, stderr, ms);
          expect(size).toBe(FRAME_PREFIX_BYTES + expected.length);
          const text = Buffer.alloc(size);
          expect(enc.writeLogFrame(text, 0, line, bytes, stderr, ms)).toBe(size);
          expect(text.subarray(FRAME_PREFIX_BYTES).equals(Buffer.from(expected))).toBe(true);
          const raw = Buffer.alloc(size);
          enc.writeLogFrameBytes(raw, 0, Buffer.from(line, "utf8"), 0, bytes, stderr, ms);
          expect(raw.equals(text)).toBe(true);
          const received = decodeReceivedLine(text, FRAME_PREFIX_BYTES, size);
          expect(received?.time).toBe(ms);
          const message = fromBinary(LogItemSchema, text.subarray(FRAME_PREFIX_BYTES));
          expect(message.event.case === "log" && nanosToMs(message.event.value.timeUnixNano)).toBe(ms);
        }),
        params,
      );
  });

  it("a run's line framer (prebuilt head, line bytes, tail) writes the bytes writeLogFrameBytes writes, over flags, times and lengths", () => {
    // Runs alternate flags and times on one encoder, so a head cached for one flag or time presence would show up in
    // another's frames; lengths cross the varint steps (127/128, 16,383/16,384) and the cache's end (1,024).
    const length = fc.oneof(
      fc.nat(300),
      fc.constantFrom(127, 128, 1023, 1024, 1025, 16_383, 16_384),
      fc.integer({ min: 0, max: 70_000 }),
    );
    const run = fc.record({
      stderr: fc.boolean(),
      time: fc.oneof(fc.constant(0), fc.constant(1e-4), micros.map(fromMicros)),
      lengths: fc.array(length, { minLength: 1, maxLength: 4 }),
    });
    for (const params of fuzzParams<[{ stderr: boolean; time: number; lengths: number[] }[]]>("line framer"))
      fc.assert(
        fc.property(fc.array(run, { minLength: 1, maxLength: 6 }), (runs) => {
          const enc = createLogItemEncoder(ID);
          for (const { stderr, time, lengths } of runs) {
            const framer = enc.lineFramer(stderr, time);
            for (const n of lengths) {
              const src = Buffer.alloc(n + 2, 0x61 + (n % 26));
              const want = Buffer.alloc(enc.logFrameSize("", n, stderr, time));
              enc.writeLogFrameBytes(want, 0, src, 1, n + 1, stderr, time);
              const head = framer.head(n);
              const got = Buffer.concat([head, src.subarray(1, n + 1), framer.tail]);
              expect(got.toString("hex")).toBe(want.toString("hex"));
            }
          }
        }),
        params,
      );
  });

  it("a run of lines with repeated and alternating times (the encoder keeps the last time's bytes) encodes each as protobuf-es", () => {
    for (const params of fuzzParams<[number[], number[]]>("line time encoder runs"))
      fc.assert(
        fc.property(
          fc.array(micros, { minLength: 1, maxLength: 3 }),
          fc.array(fc.nat(3), { maxLength: 30 }),
          (set, picks) => {
            // One encoder for the whole run, as an agent's call has: times from a small set, so most repeat.
            const enc = createLogItemEncoder(ID);
            for (const pick of picks) {
              const ms = pick === 3 ? 0 : fromMicros(set[pick % set.length]!);
              const expected = toBinary(
                LogItemSchema,
                create(LogItemSchema, {
                  requestId: ID,
                  event: {
                    case: "log",
                    value: { line: "x", stderr: false, timeUnixNano: ms > 0 ? msToNanos(ms) : 0n },
                  },
                }),
              );
              const raw = Buffer.alloc(enc.logFrameSize("x", 1, false, ms));
              enc.writeLogFrameBytes(raw, 0, Buffer.from("x"), 0, 1, false, ms);
              expect(raw.subarray(FRAME_PREFIX_BYTES).equals(Buffer.from(expected))).toBe(true);
            }
          },
        ),
        params,
      );
  });

  it("no time (0, negative, below a microsecond) leaves the field out, as protobuf-es leaves out 0", () => {
    const enc = createLogItemEncoder(ID);
    const plain = toBinary(
      LogItemSchema,
      create(LogItemSchema, { requestId: ID, event: { case: "log", value: { line: "x" } } }),
    );
    for (const ms of [0, -5, 0.0004, Number.NaN]) {
      const buf = Buffer.alloc(enc.logFrameSize("x", 1, false, ms));
      enc.writeLogFrame(buf, 0, "x", 1, false, ms);
      expect(buf.subarray(FRAME_PREFIX_BYTES).equals(Buffer.from(plain))).toBe(true);
    }
  });

  it("any double: the field is written exactly when the time rounds to at least a microsecond (toMicros > 0)", () => {
    // The encoder's test is `time * 1000 >= 0.5` (no rounded double made a line); it must agree with toMicros
    // everywhere, the half-microsecond boundary, NaN, infinities and negative zero included.
    const enc = createLogItemEncoder(ID);
    const none = enc.logFrameSize("x", 1, false, 0);
    const time = fc.oneof(
      fc.double(),
      fc.double({ min: 0.0004, max: 0.0006 }),
      fc.constantFrom(0.0005, 0.0005 - Number.EPSILON, 0.0005 + Number.EPSILON, 5e-4, 4.999999999999999e-4, -0),
    );
    for (const params of fuzzParams<[number]>("encoder time presence"))
      fc.assert(
        fc.property(time, (ms) => {
          const size = enc.logFrameSize("x", 1, false, ms);
          expect(size - none).toBe(toMicros(ms) > 0 ? 9 : 0);
          const buf = Buffer.alloc(size);
          expect(enc.writeLogFrame(buf, 0, "x", 1, false, ms)).toBe(size);
        }),
        params,
      );
  });

  it("8 bytes of nanoseconds round-trip every µs count, and any fixed64 reads as its µs floor", () => {
    for (const params of fuzzParams<[number]>("line time nanos"))
      fc.assert(
        fc.property(micros, (us) => {
          const buf = Buffer.alloc(8);
          expect(writeNanos(buf, 0, fromMicros(us))).toBe(8);
          expect(buf.readBigUInt64LE(0)).toBe(BigInt(us) * 1000n);
          expect(readNanos(buf, 0)).toBe(fromMicros(us));
        }),
        params,
      );
    for (const params of fuzzParams<[bigint]>("line time fixed64"))
      fc.assert(
        fc.property(fc.bigInt({ min: 0n, max: 2n ** 64n - 1n }), (nanos) => {
          const buf = Buffer.alloc(8);
          buf.writeBigUInt64LE(nanos);
          if (nanos <= BigInt(MAX_EXACT_MICROS) * 1000n) expect(readNanos(buf, 0)).toBe(nanosToMs(nanos));
          // Past the year 2109 both keep the time to about a µs.
          else expect(Math.abs(readNanos(buf, 0) - nanosToMs(nanos))).toBeLessThanOrEqual(nanosToMs(nanos) * 2 ** -50);
        }),
        params,
      );
  });

  it("RFC 3339 with microseconds: the ISO instant's seconds and the six digits of the µs", () => {
    expect(rfc3339Micro(fromMicros(1614834367123456))).toBe("2021-03-04T05:06:07.123456Z");
    expect(rfc3339Micro(fromMicros(1614834367000001))).toBe("2021-03-04T05:06:07.000001Z");
    for (const params of fuzzParams<[number]>("line time rfc3339"))
      fc.assert(
        fc.property(micros, (us) => {
          const text = rfc3339Micro(fromMicros(us));
          expect(text).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$/);
          expect(Date.parse(text)).toBe(Math.floor(us / 1000));
          expect(Number(text.slice(20, 26))).toBe(us % 1_000_000);
        }),
        params,
      );
  });
});
