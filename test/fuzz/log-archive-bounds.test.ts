/**
 * Fuzz targets: the archived-log decoders' line bound. Whatever bytes and line counts an
 * archive object holds (forged, truncated, a zip bomb of zero bytes: each zero byte is an
 * empty record), decodeIndex, decodeChunk and decodeRecords either refuse with the
 * documented INTERNAL "corrupt log archive" error or give exactly the indexed lines, never
 * more than MAX_CHUNK_LINES a chunk (the most an honest writer puts in one).
 */
import { gzipSync } from "node:zlib";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { RunnerDepotError } from "../../src/errors.js";
import {
  CHUNK_TARGET_BYTES,
  decodeChunk,
  decodeIndex,
  decodeRecords,
  INDEX_ENTRY_BYTES,
  MAX_CHUNK_BYTES,
  MAX_CHUNK_LINES,
  tailBytes,
} from "../../src/runner/archive/format.js";
import { ArchiveWriter } from "../../src/runner/archive/format.js";
import { fuzzParams } from "./settings.js";

function expectCorrupt(error: unknown) {
  expect(error).toBeInstanceOf(RunnerDepotError);
  expect((error as RunnerDepotError).code).toBe("INTERNAL");
  expect((error as Error).message).toMatch(/^corrupt log archive/);
}

/** Record bytes: random, or runs of zero bytes (empty records), sometimes past the chunk target. */
const recordBytes = fc.oneof(
  fc.uint8Array({ maxLength: 512 }),
  fc.integer({ min: 0, max: CHUNK_TARGET_BYTES + 4096 }).map((n) => new Uint8Array(n)),
  fc
    .tuple(fc.integer({ min: 0, max: 64 }), fc.uint8Array({ maxLength: 64 }))
    .map(([n, tail]) => Buffer.concat([Buffer.alloc(n), tail])),
);
/** Line counts an index may claim: small, near the bound, past it, absurd. */
const claimed = fc.oneof(
  fc.integer({ min: -2, max: 600 }),
  fc.integer({ min: MAX_CHUNK_LINES - 2, max: MAX_CHUNK_LINES + 2 }),
  fc.constant(2 ** 32 - 1),
  fc.constant(Number.NaN),
);

describe("log archive decoders: lines per chunk are bounded", () => {
  it("an honest writer's worst chunk (empty lines) is at the bound and decodes", async () => {
    const writer = new ArchiveWriter(1);
    let chunk: Buffer | null = null;
    let lines = 0;
    while (!chunk) {
      chunk = await writer.add({ line: "", stderr: false });
      lines++;
    }
    expect(lines).toBe(MAX_CHUNK_LINES);
    expect((await decodeChunk(chunk, lines)).length).toBe(MAX_CHUNK_LINES);
  });

  it("a chunk of zero bytes claiming one line per byte (the 4.4 M-line bomb) is refused before it decodes", async () => {
    const bomb = gzipSync(Buffer.alloc(MAX_CHUNK_BYTES));
    expect(bomb.length).toBeLessThan(20_000);
    await decodeChunk(bomb, MAX_CHUNK_BYTES).then(
      () => expect.unreachable(),
      (error: unknown) => {
        expectCorrupt(error);
        expect((error as Error).message).toContain(`a chunk of ${MAX_CHUNK_BYTES} lines`);
      },
    );
    // At the bound, the records past the chunk target are refused: no chunk gives more than the bound.
    await decodeChunk(bomb, MAX_CHUNK_LINES).then(
      () => expect.unreachable(),
      (error: unknown) => {
        expectCorrupt(error);
        expect((error as Error).message).toContain("past the chunk target");
      },
    );
  });

  it("decodeRecords on any bytes with any claimed count: exactly the claim (≤ the bound) or the corrupt error", () => {
    for (const params of fuzzParams("log archive records bound")) {
      fc.assert(
        fc.property(recordBytes, claimed, (raw, expected) => {
          let lines;
          try {
            lines = decodeRecords(raw, expected);
          } catch (error) {
            expectCorrupt(error);
            return;
          }
          expect(lines.length).toBe(expected);
          expect(lines.length).toBeLessThanOrEqual(MAX_CHUNK_LINES);
        }),
        params,
      );
    }
  });

  it("decodeChunk on gzip of any bytes with any claimed count: exactly the claim (≤ the bound) or the corrupt error", async () => {
    for (const params of fuzzParams("log archive chunk bound", { numRuns: 200 })) {
      await fc.assert(
        fc.asyncProperty(recordBytes, claimed, fc.boolean(), async (raw, expected, mangle) => {
          const packed = gzipSync(raw, { level: 1 });
          if (mangle && packed.length > 12) packed[packed.length >> 1] ^= 0x55;
          let lines;
          try {
            lines = await decodeChunk(packed, expected);
          } catch (error) {
            expectCorrupt(error);
            return;
          }
          expect(lines.length).toBe(expected);
          expect(lines.length).toBeLessThanOrEqual(MAX_CHUNK_LINES);
        }),
        { ...params, numRuns: Math.min(params.numRuns ?? 200, 200) },
      );
    }
  });

  it("decodeIndex with any per-chunk counts that add up: every accepted chunk is within the bound", () => {
    for (const params of fuzzParams("log archive index bound")) {
      fc.assert(
        fc.property(
          fc.array(
            fc.tuple(
              fc.integer({ min: 1, max: 70_000 }),
              fc.oneof(fc.integer({ min: 0, max: 1000 }), fc.integer({ min: 0, max: 2 ** 32 - 1 })),
            ),
            { minLength: 1, maxLength: 8 },
          ),
          (entries) => {
            const chunks = entries.length;
            const tail = Buffer.alloc(tailBytes(chunks));
            let offset = 0;
            let lines = 0;
            entries.forEach(([bytes, count], i) => {
              tail.writeUInt32LE(bytes, i * INDEX_ENTRY_BYTES);
              tail.writeUInt32LE(count, i * INDEX_ENTRY_BYTES + 4);
              offset += bytes;
              lines += count;
            });
            const t = chunks * INDEX_ENTRY_BYTES;
            tail.write("RDLOGAR1", t, "latin1");
            tail.writeUInt32LE(chunks, t + 8);
            tail.writeDoubleLE(lines, t + 16);
            tail.writeDoubleLE(offset, t + 24);
            let index;
            try {
              index = decodeIndex(tail, offset + tail.length);
            } catch (error) {
              expectCorrupt(error);
              return;
            }
            for (let c = 0; c < chunks; c++)
              expect(index.firsts[c + 1]! - index.firsts[c]!).toBeLessThanOrEqual(MAX_CHUNK_LINES);
            expect(entries.every(([, count]) => count >= 1 && count <= MAX_CHUNK_LINES)).toBe(true);
          },
        ),
        params,
      );
    }
  });
});
