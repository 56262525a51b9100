/**
 * Fuzz targets: the archived-log decoders (trailer, index, chunk records) on any bytes, the
 * round trip of any lines through the writer and back, and the PostgreSQL change-event
 * payload parser (anything another program NOTIFYs on the channel).
 */
import { gzipSync } from "node:zlib";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { RunnerDepotError } from "../../src/errors.js";
import {
  ArchiveWriter,
  chunkOf,
  decodeChunk,
  decodeIndex,
  decodeRecords,
  decodeTrailer,
  tailBytes,
  TRAILER_BYTES,
} from "../../src/runner/archive/format.js";
import { decodeLogEvent, encodeLogEvent } from "../../src/adapters/postgres/log-notify.js";
import type { StoredLine } from "../../src/runner/ports.js";
import { fuzzParams } from "./settings.js";
import { MAX_MICROS } from "../../src/runner/protocol/line-time.js";

function expectCorrupt(error: unknown) {
  expect(error).toBeInstanceOf(RunnerDepotError);
  expect((error as RunnerDepotError).code).toBe("INTERNAL");
}

async function build(lines: StoredLine[]): Promise<Buffer> {
  const writer = new ArchiveWriter(1);
  const parts: Buffer[] = [];
  for (const line of lines) {
    const chunk = await writer.add(line);
    if (chunk) parts.push(chunk);
  }
  parts.push(...(await writer.finish()));
  return Buffer.concat(parts);
}

/** Reads every line back the way the archiving store does: index from the tail, then chunk by chunk. */
async function readAll(object: Buffer): Promise<StoredLine[]> {
  const { chunks } = decodeTrailer(object.subarray(object.length - TRAILER_BYTES), object.length);
  const index = decodeIndex(object.subarray(object.length - tailBytes(chunks)), object.length);
  const out: StoredLine[] = [];
  for (let c = 0; c < chunks; c++) {
    expect(chunkOf(index, index.firsts[c]!)).toBe(c);
    out.push(
      ...(await decodeChunk(
        object.subarray(index.offsets[c]!, index.offsets[c + 1]!),
        index.firsts[c + 1]! - index.firsts[c]!,
        index.version,
      )),
    );
  }
  return out;
}

const storedLine = fc
  .record({
    line: fc.string({ unit: "grapheme", maxLength: 200 }),
    stderr: fc.boolean(),
    marker: fc.boolean(),
    // No time, or any µs a double keeps exactly as ms (line-time.ts), going back and forth.
    micros: fc.oneof(
      fc.constant(0),
      fc.integer({ min: 1, max: 2 ** 42 * 1000 - 1 }),
      fc.constantFrom(1, MAX_MICROS), // the extremes a hostile agent can make deltas of
    ),
    serverTime: fc.boolean(),
  })
  .map(({ line, stderr, marker, micros, serverTime }): StoredLine => {
    const out: StoredLine = marker ? { line, stderr, marker: true } : { line, stderr };
    if (micros > 0) {
      out.time = micros / 1000;
      if (serverTime) out.serverTime = true;
    }
    return out;
  });

describe("fuzz: log archive format", () => {
  it("any lines round-trip through the writer, the index and the chunks", async () => {
    // Long runs of lines so that several chunks (256 KiB each) are made in some cases.
    const lines = fc.oneof(
      fc.array(storedLine, { maxLength: 50 }),
      fc
        .tuple(storedLine, fc.integer({ min: 1, max: 3000 }))
        .map(([l, n]) => Array.from({ length: n }, (_, i) => ({ ...l, line: `${l.line}${i}`.repeat(12) }))),
    );
    // Each case may build megabytes: a tenth of the usual runs.
    for (const params of fuzzParams("log archive round trip")) {
      await fc.assert(
        fc.asyncProperty(lines, async (input) => {
          expect(await readAll(await build(input))).toEqual(input);
        }),
        { ...params, numRuns: Math.max(1, Math.round((params.numRuns ?? 2000) / 10)) },
      );
    }
  });

  it("any bytes as an object: a clean INTERNAL refusal or lines, never another failure", async () => {
    const objects = fc.oneof(
      fc.uint8Array({ maxLength: 400 }),
      // A valid object with bytes flipped, cut or appended.
      fc
        .tuple(
          fc.array(storedLine, { minLength: 1, maxLength: 20 }),
          fc.array(fc.tuple(fc.nat(), fc.integer({ min: 0, max: 255 })), { maxLength: 4 }),
          fc.integer({ min: -40, max: 8 }),
        )
        .map(([lines, flips, cut]) => ({ lines, flips, cut })),
    );
    for (const params of fuzzParams("log archive decode")) {
      await fc.assert(
        fc.asyncProperty(objects, async (input) => {
          let object: Buffer;
          if (input instanceof Uint8Array) object = Buffer.from(input);
          else {
            object = Buffer.from(await build(input.lines));
            for (const [at, value] of input.flips) object[at % object.length] = value;
            if (input.cut < 0) object = object.subarray(0, Math.max(0, object.length + input.cut));
            else object = Buffer.concat([object, Buffer.alloc(input.cut, 7)]);
          }
          try {
            const lines = await readAll(object);
            for (const line of lines) expect(typeof line.line).toBe("string");
          } catch (error) {
            expectCorrupt(error);
          }
        }),
        params,
      );
    }
  });

  it("any bytes as an inflated chunk: records or INTERNAL", () => {
    for (const params of fuzzParams("log archive records")) {
      fc.assert(
        fc.property(fc.uint8Array({ maxLength: 300 }), fc.nat({ max: 300 }), (raw, expected) => {
          for (const version of [1, 2]) {
            try {
              expect(decodeRecords(raw, expected, version)).toHaveLength(expected);
            } catch (error) {
              expectCorrupt(error);
            }
          }
        }),
        params,
      );
    }
  });

  it("a gzip bomb is refused, not inflated", async () => {
    const bomb = gzipSync(Buffer.alloc(64 * 1024 * 1024));
    await decodeChunk(bomb, 1).then(
      () => expect.fail("inflated a bomb"),
      (error: unknown) => expectCorrupt(error),
    );
  });
});

describe("fuzz: PostgreSQL log event payload", () => {
  it("any payload parses to a valid event or null; events round-trip", () => {
    for (const params of fuzzParams("log event payload")) {
      fc.assert(
        fc.property(
          fc.oneof(
            fc.string({ maxLength: 120 }),
            fc.tuple(fc.nat(), fc.boolean(), fc.uuid()).map(([n, e, u]) => encodeLogEvent(u, n, e)),
          ),
          (payload) => {
            const event = decodeLogEvent(payload);
            if (event === null) return;
            expect(event.requestId).toMatch(/^[0-9a-f-]{36}$/);
            expect(Number.isSafeInteger(event.storedLines)).toBe(true);
            expect(encodeLogEvent(event.requestId, event.storedLines, event.ended)).toBe(payload);
          },
        ),
        params,
      );
      fc.assert(
        fc.property(fc.nat(), fc.boolean(), fc.uuid(), (n, e, u) => {
          expect(decodeLogEvent(encodeLogEvent(u, n, e))).toEqual({ requestId: u, storedLines: n, ended: e });
        }),
        params,
      );
    }
  });
});
