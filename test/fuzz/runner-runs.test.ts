/**
 * Fuzz target: the fast path's run decoder (decodeReceivedRun) and the item reader's walk
 * of a run against protobuf-es as the oracle. Random runs (0–50 lines of random bytes:
 * multi-byte UTF-8, empty lines, invalid UTF-8; stderr, a time or none; fields in any
 * order, repeated stderr and time fields, unknown fields, a second event, non-minimal
 * lengths), encoded by protobuf-es or by hand: the decoder either returns null or gives
 * exactly the lines `fromBinary` gives (text, stderr, time), line by line as the item
 * reader walks them, and it never accepts what protobuf-es refuses. Seeds: test/fuzz/settings.ts.
 */
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { LogItemSchema, type LogItem } from "../../src/gen/runner/v1/runner_pb.js";
import { decodeReceivedRun } from "../../src/runner/protocol/decoder.js";
import { ReceivedLine } from "../../src/runner/protocol/received-line.js";
import { MAX_RUN_LINES, countRunLines } from "../../src/runner/protocol/received-run.js";
import { nanosToMs } from "../../src/runner/protocol/line-time.js";
import { readerOf, takeItem, unread } from "../../src/runner/server/item-reader.js";
import { kItemBatches } from "../../src/runner/server/call-context.js";
import { fuzzParams, fuzzTimeout } from "./settings.js";

function varint(value: number | bigint, pad = 0): number[] {
  let v = BigInt(value);
  const out: number[] = [];
  do {
    const low = Number(v & 0x7fn);
    v >>= 7n;
    out.push(v > 0n || pad > 0 ? low | 0x80 : low);
  } while (v > 0n);
  // Non-minimal: continuation bytes of zero (valid protobuf, a form the decoder leaves to protobuf-es).
  for (let i = 0; i < pad; i++) out.push(i === pad - 1 ? 0 : 0x80);
  return out;
}

function lengthDelimited(tag: number, body: number[], pad = 0): number[] {
  return [tag, ...varint(body.length, pad), ...body];
}

function fixed64(value: bigint): number[] {
  const b = Buffer.alloc(8);
  b.writeBigUInt64LE(value);
  return [...b];
}

/** A line's bytes: valid UTF-8 (ASCII, multi-byte, empty, JSON specials) or arbitrary bytes (often invalid). */
const lineBytes: fc.Arbitrary<number[]> = fc.oneof(
  fc.string({ unit: "grapheme-ascii", maxLength: 30 }).map((s) => [...Buffer.from(s, "utf8")]),
  fc.string({ unit: "grapheme", maxLength: 12 }).map((s) => [...Buffer.from(s, "utf8")]),
  fc.string({ unit: "binary", maxLength: 12 }).map((s) => [...Buffer.from(s, "utf8")]),
  fc.constant<number[]>([]),
  fc.constantFrom<number[]>(
    [0x22, 0x5c, 0x0a],
    [0xef, 0xbf, 0xbd],
    [0xc3],
    [0xff, 0x41],
    [0xed, 0xa0, 0x80],
    [0xe2, 0x82],
  ),
  fc.uint8Array({ maxLength: 12 }).map((a) => [...a]),
);

/** One field of a LogRun as bytes. */
const runField: fc.Arbitrary<number[]> = fc.oneof(
  { weight: 12, arbitrary: lineBytes.map((b) => lengthDelimited(0x0a, b)) },
  {
    weight: 1,
    arbitrary: fc.tuple(lineBytes, fc.integer({ min: 1, max: 2 })).map(([b, pad]) => lengthDelimited(0x0a, b, pad)),
  },
  {
    weight: 2,
    arbitrary: fc.constantFrom<number[]>([0x10, 0], [0x10, 1], [0x10, 2], [0x10, 0x81, 0x00], [0x10, 0xff, 0x01]),
  },
  { weight: 2, arbitrary: fc.bigInt({ min: 0n, max: 2n ** 64n - 1n }).map((t) => [0x19, ...fixed64(t)]) },
  {
    weight: 1,
    arbitrary: fc.constantFrom<number[]>(
      [0x28, 5],
      [0x3a, 1, 0x41],
      [0x0d, 1, 2, 3, 4],
      [0x19, 1, 2],
      [0x0a, 5, 0x41],
      [0x12],
      // Known fields with another wire type than their own, which protobuf-es reads as their kind all the same: a
      // line tagged as a varint, a line inside a stream flag tagged as length-delimited.
      [0x08, 0x00],
      [0x12, 0x02, 0x0a, 0x00],
    ),
  },
);

/** A LogItem carrying a run, as bytes: encoded by protobuf-es, or field by field by hand. */
const runMessage: fc.Arbitrary<Uint8Array> = fc.oneof(
  {
    weight: 2,
    arbitrary: fc
      .record({
        id: fc.oneof(fc.uuid(), fc.string({ maxLength: 8 })),
        lines: fc.array(fc.oneof(fc.string({ unit: "grapheme", maxLength: 20 }), fc.constant("")), { maxLength: 50 }),
        stderr: fc.boolean(),
        timeUnixNano: fc.oneof(fc.constant(0n), fc.bigInt({ min: 0n, max: 2n ** 64n - 1n })),
      })
      .map(({ id, ...run }) =>
        toBinary(LogItemSchema, create(LogItemSchema, { requestId: id, event: { case: "run", value: run } })),
      ),
  },
  {
    weight: 3,
    arbitrary: fc
      .record({
        id: fc.oneof(fc.uuid(), fc.constant("")),
        fields: fc.array(runField, { maxLength: 50 }),
        before: fc.constantFrom<number[][]>([], [[0x12, 0]], [[0x1a, 0]], [[0x22, 0]], [[0x0a, 1, 0x41]]),
        after: fc.constantFrom<number[][]>([], [[0x12, 2, 0x0a, 0]], [[0x22, 0]], [[0x28, 1]], [[0x0a, 1, 0x42]]),
        idFirst: fc.boolean(),
        pad: fc.constantFrom(0, 0, 0, 1),
      })
      .map(({ id, fields, before, after, idFirst, pad }) => {
        const idField = id === "" ? [] : lengthDelimited(0x0a, [...Buffer.from(id)]);
        const run = lengthDelimited(0x22, fields.flat(), pad);
        const parts = idFirst ? [idField, ...before, run, ...after] : [...before, run, ...after, idField];
        return Uint8Array.from(parts.flat());
      }),
  },
);

/** The oracle: what protobuf-es makes of `bytes`, or null when it refuses them. */
function oracle(bytes: Uint8Array): LogItem | null {
  try {
    return fromBinary(LogItemSchema, bytes);
  } catch {
    return null;
  }
}

/** The lines the item reader gives for `run` (the first taken, put back and taken again, as runCall does). */
function walk(items: readonly object[]): ReceivedLine[] {
  const source = { [kItemBatches]: () => () => Promise.resolve(null), [Symbol.asyncIterator]: () => ({}) };
  const it = readerOf(source as never);
  it.batch = items as never;
  const first = takeItem(it);
  if (first !== undefined) unread(it, first);
  const out: ReceivedLine[] = [];
  for (let item = takeItem(it); item !== undefined; item = takeItem(it)) out.push(item as ReceivedLine);
  return out;
}

describe("fuzz: the run decoder and the run walk against protobuf-es", () => {
  it(
    "a run the decoder accepts gives exactly protobuf-es's lines, stream and time; it accepts nothing protobuf-es refuses",
    () => {
      let accepted = 0;
      let total = 0;
      for (const params of fuzzParams("run decoder")) {
        fc.assert(
          fc.property(runMessage, fc.nat({ max: 7 }), (bytes, lead) => {
            total++;
            // The message inside a larger buffer, as the fast path sees frames.
            const buf = Buffer.concat([Buffer.alloc(lead, 0x0a), bytes, Buffer.from([0x0a, 0x0a])]);
            const run = decodeReceivedRun(buf, lead, lead + bytes.length, total % 2 === 0);
            const expected = oracle(bytes);
            // The count read before protobuf-es parses a message bounds the lines it will make: never below them. -1
            // (not well-formed: the server refuses it unparsed) also for what protobuf-es lets pass, such as a line
            // that runs on past its run's end into the fields after it.
            const counted = countRunLines(buf, lead, lead + bytes.length);
            if (counted >= 0 && expected?.event.case === "run")
              expect(counted).toBeGreaterThanOrEqual(expected.event.value.lines.length);
            if (run !== null) expect(counted).toBe(run.count);
            if (run === null) return;
            accepted++;
            expect(expected, "accepted what protobuf-es refuses").not.toBeNull();
            expect(expected!.event.case).toBe("run");
            if (expected!.event.case !== "run") return;
            const want = expected!.event.value;
            expect(run.requestId).toBe(expected!.requestId);
            expect(run.count).toBe(want.lines.length);
            expect(run.stderr).toBe(want.stderr);
            expect(run.timeAt < 0 ? 0n : buf.readBigUInt64LE(run.timeAt)).toBe(want.timeUnixNano);
            expect(run.time).toBe(nanosToMs(want.timeUnixNano));
            expect(run.toLogItem()).toEqual(expected);
            if (run.count === 0 || run.count > MAX_RUN_LINES) return;
            const lines = walk([run]);
            expect(lines.map((l) => l.line)).toEqual(want.lines);
            // Between other items of a batch: a line before it, and the same run again after it.
            const single = create(LogItemSchema, {
              requestId: "r",
              event: { case: "log", value: { line: "before" } },
            });
            const around = walk([single, run, run]) as unknown as (ReceivedLine | LogItem)[];
            expect(
              around.map((l) =>
                l instanceof ReceivedLine ? l.line : l.event.case === "log" ? l.event.value.line : null,
              ),
            ).toEqual(["before", ...want.lines, ...want.lines]);
            for (const l of lines) {
              expect(l).toBeInstanceOf(ReceivedLine);
              expect(l.requestId).toBe(expected!.requestId);
              expect(l.stderr).toBe(want.stderr);
              expect(l.time).toBe(run.time);
              expect(l.timeAt < 0 ? 0n : buf.readBigUInt64LE(l.timeAt)).toBe(want.timeUnixNano);
              // plainJson is a promise: when true, the line is its own JSON string body.
              if (l.plainJson) expect(JSON.stringify(l.line)).toBe(`"${l.line}"`);
            }
            // A run message (what protobuf-es or the connect path gives) walks to the same lines, as LogChunks.
            const messages = walk([expected!]) as unknown as LogItem[];
            expect(messages.map((m) => (m.event.case === "log" ? m.event.value.line : null))).toEqual(want.lines);
            for (const m of messages) {
              expect(m.event.case).toBe("log");
              if (m.event.case === "log") {
                expect(m.event.value.stderr).toBe(want.stderr);
                expect(m.event.value.timeUnixNano).toBe(want.timeUnixNano);
              }
            }
          }),
          params,
        );
      }
      // The target means something only if both answers are common.
      expect(accepted).toBeGreaterThan(total / 5);
      expect(accepted).toBeLessThan(total);
    },
    fuzzTimeout(60_000),
  );
  it(
    "plainJson is exact for runs of ASCII lines: true for every line when all of the run's lines are their own JSON string body, false else (empty lines true)",
    () => {
      const plain = (line: string) => JSON.stringify(line) === `"${line}"`;
      let mixed = 0;
      for (const params of fuzzParams("run plainJson")) {
        fc.assert(
          fc.property(
            fc.array(
              fc.oneof(fc.string({ unit: "grapheme-ascii", maxLength: 20 }), fc.constantFrom('"', "\\", "a\tb")),
              {
                minLength: 1,
                maxLength: 8,
              },
            ),
            fc.bigInt({ min: 0n, max: 2n ** 64n - 1n }),
            (lines, timeUnixNano) => {
              const bytes = toBinary(
                LogItemSchema,
                create(LogItemSchema, { requestId: "r", event: { case: "run", value: { lines, timeUnixNano } } }),
              );
              // The run's own tag (0x22, a `"`) and its time's bytes sit beside the lines in the buffer.
              const run = decodeReceivedRun(Buffer.from(bytes), 0, bytes.length, true);
              expect(run).not.toBeNull();
              const all = lines.every(plain);
              if (!all && lines.some((l) => l !== "" && plain(l))) mixed++;
              for (const l of walk([run!])) expect(l.plainJson, JSON.stringify(lines)).toBe(all || l.line === "");
            },
          ),
          params,
        );
      }
      expect(mixed).toBeGreaterThan(0);
    },
    fuzzTimeout(30_000),
  );
  it(
    "countRunLines counts exactly the lines of a run protobuf-es encoded, whatever else the message holds",
    () => {
      for (const params of fuzzParams("run line count")) {
        fc.assert(
          fc.property(
            fc.array(fc.string({ maxLength: 5 }), { maxLength: 300 }),
            fc.boolean(),
            fc.constantFrom<number[]>([], [0x28, 0x01], [0x5b, 0x08, 0x07, 0x5c], [0x3a, 0x02, 0x0a, 0x00]),
            (lines, stderr, extra) => {
              const bytes = toBinary(
                LogItemSchema,
                create(LogItemSchema, { requestId: "r", event: { case: "run", value: { lines, stderr } } }),
              );
              // Unknown fields after the message, a group among them: skipped, never counted.
              const buf = Buffer.concat([Buffer.from(bytes), Buffer.from(extra)]);
              expect(countRunLines(buf, 0, buf.length)).toBe(lines.length);
              // Cut anywhere inside, it is not a well-formed message (or a shorter one): never more than the lines.
              const cut = Math.floor(buf.length / 2);
              expect(countRunLines(buf, 0, cut)).toBeLessThanOrEqual(lines.length);
            },
          ),
          params,
        );
      }
    },
    fuzzTimeout(30_000),
  );
});
