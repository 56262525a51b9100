/**
 * Tar-level attacks on the installer's decoder (issue 29: the tar library changed from
 * tar-stream to modern-tar, so what 3.2 of tar-stream guarded is proven here): a metadata
 * entry (PAX or GNU long name) declaring a gigabyte is refused after a bounded read, not
 * buffered; a truncated archive and a header with a bad checksum are ARCHIVE_INVALID.
 */
import { mkdtemp, readdir, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { extractPackage } from "../../../src/depot/install/extract.js";
import { readPackageManifest } from "../../../src/depot/install/tar-entries.js";
import { RunnerDepotError } from "../../../src/errors.js";

/** One ustar header block (512 bytes) with a correct checksum unless `badChecksum`. */
function header(name: string, type: string, size: number, badChecksum = false): Buffer {
  const block = Buffer.alloc(512);
  block.write(name, 0, 100, "utf8");
  block.write("0000644\0", 100);
  block.write("0000000\0", 108);
  block.write("0000000\0", 116);
  block.write(`${size.toString(8).padStart(11, "0")}\0`, 124);
  block.write("00000000000\0", 136);
  block.write(type, 156);
  block.write("ustar\0", 257);
  block.write("00", 263);
  block.fill(" ", 148, 156);
  let sum = 0;
  for (const byte of block) sum += byte;
  if (badChecksum) sum += 1;
  block.write(`${sum.toString(8).padStart(6, "0")}\0 `, 148);
  return block;
}

/** Yields `head`, then zero chunks without end, counting every byte the reader took. */
function endless(head: Buffer, counter: { bytes: number }): AsyncIterable<Uint8Array> {
  const chunk = Buffer.alloc(64 * 1024);
  return {
    async *[Symbol.asyncIterator]() {
      counter.bytes += head.length;
      yield head;
      for (;;) {
        counter.bytes += chunk.length;
        yield chunk;
      }
    },
  };
}

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), "hostile-tar-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

async function refusal(run: Promise<unknown>): Promise<RunnerDepotError> {
  const error = await run.then(
    () => null,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(RunnerDepotError);
  return error as RunnerDepotError;
}

describe("hostile tar headers", () => {
  for (const [kind, type] of [
    ["a PAX header", "x"],
    ["a GNU long name", "L"],
  ] as const) {
    it(`${kind} declaring 1 GiB is refused after reading at most 16 MiB`, async () => {
      const counter = { bytes: 0 };
      const error = await refusal(extractPackage(endless(header("././@meta", type, 2 ** 30), counter), dir));
      expect(error.code).toBe("ARCHIVE_INVALID");
      expect(counter.bytes).toBeLessThanOrEqual(16 * 2 ** 20);
      expect(await readdir(dir)).toEqual([]);
    });
  }

  it("a truncated archive and a header with a wrong checksum are ARCHIVE_INVALID", async () => {
    const manifest = Buffer.from('{"name":"a","version":"1.0.0","items":[]}');
    const truncated = Buffer.concat([header(".pkg/manifest.json", "0", manifest.length), manifest.subarray(0, 10)]);
    expect((await refusal(readPackageManifest([truncated]))).code).toBe("ARCHIVE_INVALID");
    const badSum = Buffer.concat([header(".pkg/manifest.json", "0", 0, true), Buffer.alloc(1024)]);
    expect((await refusal(extractPackage([badSum], dir))).code).toBe("ARCHIVE_INVALID");
  });
});
