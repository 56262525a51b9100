/**
 * Property test of the line splitter's byte path (`onBytes`, used by runJob to hand lines
 * to the client without decoding them): for any bytes cut into any reads, the lines given
 * as bytes plus those given as strings are exactly the lines of the string-only splitter,
 * in order, and every line given as bytes is valid UTF-8 within the limit.
 */
import { isUtf8 } from "node:buffer";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { createLineSplitter, splitUtf8 } from "../../src/runner/agent/line-splitter.js";
import { chunksOf } from "../fixtures/chunks.js";
import { fuzzParams, fuzzTimeout } from "./settings.js";

// Pieces that make lines: ASCII, newlines, valid multi-byte characters, and bytes that are
// not UTF-8 (a lone continuation byte, a cut sequence, 0xff).
const piece = fc.oneof(
  fc.constantFrom([0x0a], [0x0a], [0x61], [0x62, 0x63], [0xc3, 0xa9], [0xe2, 0x9c, 0x93], [0xf0, 0x9f, 0x98, 0x80]),
  fc.constantFrom([0x80], [0xff], [0xe2, 0x82], [0xc3]),
  // A command's start, for the masking step of the runs property.
  fc.constant([0x3a, 0x3a]),
  fc.array(fc.integer({ min: 0x20, max: 0x7e }), { minLength: 1, maxLength: 30 }),
);
const input = fc.record({
  bytes: fc.array(piece, { maxLength: 60 }).map((ps) => Buffer.from(ps.flat())),
  cuts: fc.array(fc.nat(), { maxLength: 8 }),
  max: fc.integer({ min: 4, max: 40 }),
});

/**
 * The splitter as it was before it joined only the open line to the next read: every read
 * after an unterminated line was copied whole behind it, then split. The oracle for the
 * property below (string lines only).
 */
function wholeJoinSplitter(onLine: (line: string) => void, max: number) {
  let rest: Buffer | null = null;
  const emit = (buf: Buffer, s: number, e: number) => {
    const line = buf.toString("utf8", s, e);
    if ((e - s) * 3 <= max) onLine(line);
    else for (const piece of splitUtf8(line, max)) onLine(piece);
  };
  return {
    push(chunk: Buffer) {
      let buf = chunk;
      if (rest !== null) {
        buf = Buffer.concat([rest, buf]);
        rest = null;
      }
      let pos = 0;
      for (let nl = buf.indexOf(10, pos); nl !== -1; nl = buf.indexOf(10, pos)) {
        emit(buf, pos, nl);
        pos = nl + 1;
      }
      while (buf.length - pos > max) {
        let cut = pos + max;
        for (let k = 0; k < 3 && (buf[cut]! & 0xc0) === 0x80; k++) cut--;
        emit(buf, pos, cut);
        pos = cut;
      }
      if (pos < buf.length) rest = Buffer.from(buf.subarray(pos));
    },
    end() {
      if (rest !== null && rest.length > 0) emit(rest, 0, rest.length);
      rest = null;
    },
  };
}

type SplitterOptions = NonNullable<Parameters<typeof createLineSplitter>[1]>;

/**
 * A masking step for the property: a line cut over the limit that starts with `::` is a command, and its later pieces
 * are its value (`***`), as `::add-mask::` lines are in runJob; nothing else changes.
 */
const commandMasking: SplitterOptions["masking"] = {
  text: (line) => line,
  cut: (_buf, _pos, cut) => cut,
  command: (buf, start, end) => end - start >= 2 && buf[start] === 0x3a && buf[start + 1] === 0x3a,
  value: () => "***",
};

/**
 * Feeds `chunks` to the string-only splitter and to one with the options `extra` makes (its callbacks push the lines
 * they get to `mixed`), both with `masking`; both must give the same lines in the same order.
 */
function expectSameLines(
  chunks: Buffer[],
  max: number,
  extra: (mixed: string[]) => Omit<SplitterOptions, "maxLineBytes" | "masking">,
  masking?: SplitterOptions["masking"],
): void {
  const plain: string[] = [];
  const a = createLineSplitter((l) => plain.push(l), { maxLineBytes: max, masking });
  const mixed: string[] = [];
  const b = createLineSplitter((l) => mixed.push(l), { maxLineBytes: max, masking, ...extra(mixed) });
  for (const c of chunks) {
    a.push(c);
    b.push(c);
  }
  a.end();
  b.end();
  expect(mixed).toEqual(plain);
}

describe("fuzz: line splitter, bytes path against the string path", () => {
  it(
    "joining only the open line to the next read gives the lines of joining whole reads",
    () => {
      for (const params of fuzzParams<[{ bytes: Buffer; cuts: number[]; max: number }]>("line splitter open line")) {
        fc.assert(
          fc.property(input, ({ bytes, cuts, max }) => {
            const expected: string[] = [];
            const oracle = wholeJoinSplitter((l) => expected.push(l), max);
            const got: string[] = [];
            const split = createLineSplitter((l) => got.push(l), {
              maxLineBytes: max,
              onBytes: (buf, s, e) => got.push(buf.toString("utf8", s, e)),
            });
            for (const c of chunksOf(bytes, cuts)) {
              oracle.push(c);
              split.push(c);
            }
            oracle.end();
            split.end();
            expect(got).toEqual(expected);
          }),
          params,
        );
      }
    },
    fuzzTimeout(20_000),
  );

  it(
    "same lines in the same order; byte lines are valid UTF-8 within the limit",
    () => {
      for (const params of fuzzParams<[{ bytes: Buffer; cuts: number[]; max: number }]>("line splitter bytes")) {
        fc.assert(
          fc.property(input, ({ bytes, cuts, max }) =>
            expectSameLines(chunksOf(bytes, cuts), max, (mixed) => ({
              onBytes: (buf, s, e) => {
                const view = buf.subarray(s, e);
                expect(view.length).toBeLessThanOrEqual(max);
                expect(isUtf8(view)).toBe(true);
                mixed.push(view.toString("utf8"));
              },
            })),
          ),
          params,
        );
      }
    },
    fuzzTimeout(20_000),
  );

  it(
    "runs of lines: a run is complete valid lines, and whatever part of it onRun takes, the lines are the same",
    () => {
      const withTakes = fc.record({ case: input, takes: fc.array(fc.nat(6), { maxLength: 10 }) });
      for (const params of fuzzParams<[{ case: { bytes: Buffer; cuts: number[]; max: number }; takes: number[] }]>(
        "line splitter runs",
      )) {
        fc.assert(
          fc.property(withTakes, ({ case: { bytes, cuts, max }, takes }) => {
            let runs = 0;
            expectSameLines(
              chunksOf(bytes, cuts),
              max,
              (mixed) => ({
                onBytes: (buf, s, e) => mixed.push(buf.toString("utf8", s, e)),
                // Takes the number of lines `takes` says for this run (all of them past its end), stopping before a line
                // over the limit, as the client does; or nothing.
                onRun: (buf, s, e) => {
                  expect(buf[e - 1]).toBe(0x0a);
                  expect(isUtf8(buf.subarray(s, e))).toBe(true);
                  let n = takes[runs++ % Math.max(1, takes.length)] ?? 6;
                  let pos = s;
                  while (n-- > 0 && pos < e) {
                    const nl = buf.indexOf(10, pos);
                    if (nl - pos > max) break;
                    mixed.push(buf.toString("utf8", pos, nl));
                    pos = nl + 1;
                  }
                  return pos;
                },
              }),
              commandMasking,
            );
          }),
          params,
        );
      }
    },
    fuzzTimeout(20_000),
  );
});
