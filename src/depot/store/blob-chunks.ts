/**
 * Reading a blob's bytes without allocating per chunk. A read stream (the fs store's `getBlob`) allocates a
 * fresh Buffer for every chunk; at 256 MiB per download or commit that garbage, not the copying, was the
 * largest cost after the kernel's own copies (the `--cpu-prof` of the bench server showed the garbage
 * collector ahead of hashing).
 * Why: docs/decisions/depot-archives.md, "blob-chunks.ts: blob reads without garbage per chunk".
 */
import { RunnerDepotError } from "../../errors.js";
import type { BlobReader } from "../ports.js";

/** Bytes per pooled buffer: few enough reads (one threadpool round trip each), a bounded 1 MiB per transfer. */
const CHUNK_BYTES = 512 * 1024;
/** Buffers kept for reuse between transfers (8 MiB); more concurrent transfers allocate and drop theirs. */
const POOL_BUFFERS = 16;

const pool: Buffer[] = [];
const borrowed = new WeakSet<ArrayBufferLike>();

function take(): Buffer {
  const buffer = pool.pop();
  if (buffer) return buffer;
  // Its own ArrayBuffer (not a slice of Node's shared pool), so isBorrowed is exact.
  const fresh = Buffer.allocUnsafeSlow(CHUNK_BYTES);
  borrowed.add(fresh.buffer);
  return fresh;
}

function give(buffer: Buffer): void {
  if (pool.length < POOL_BUFFERS) pool.push(buffer);
}

/** True when `chunk` came from {@link readBorrowed}: its bytes change once the next chunk is read. */
export function isBorrowed(chunk: Uint8Array): boolean {
  return borrowed.has(chunk.buffer);
}

/**
 * The bytes `from`..`to` (inclusive) of an opened blob as borrowed chunks of up to
 * {@link CHUNK_BYTES}, reading the next chunk while the consumer holds the current one.
 * O(to − from) bytes read, two buffers held. Fails (INTERNAL) when the blob is shorter
 * than `to + 1`, before yielding anything when the reader's size already says so.
 * It does not close `reader`.
 *
 * @example
 * const reader = await store.openBlob!(digest);
 * try {
 *   for await (const chunk of readBorrowed(reader!, 0, reader!.size - 1, digest)) hash.update(chunk);
 * } finally {
 *   await reader!.close();
 * }
 */
export async function* readBorrowed(
  reader: BlobReader,
  from: number,
  to: number,
  digest: string,
): AsyncGenerator<Uint8Array> {
  if (from > to) return;
  if (reader.size <= to) throw short(digest, reader.size, to);
  const buffers = [take(), take()];
  let reading: Promise<Buffer> | undefined;
  try {
    const fill = async (buffer: Buffer, at: number): Promise<Buffer> => {
      const want = Math.min(buffer.length, to + 1 - at);
      let got = 0;
      while (got < want) {
        const n = await reader.read(buffer, got, want - got, at + got);
        if (n === 0) throw short(digest, at + got, to);
        got += n;
      }
      return buffer.subarray(0, want);
    };
    let at = from;
    let turn = 0;
    reading = fill(buffers[0]!, at);
    while (reading) {
      const chunk = await reading;
      at += chunk.length;
      turn ^= 1;
      // The other buffer was released when the consumer asked for this chunk.
      reading = at <= to ? fill(buffers[turn]!, at) : undefined;
      reading?.catch(() => undefined); // awaited on the next turn; never unhandled meanwhile
      yield chunk;
    }
  } finally {
    // A read still landing in a buffer must finish before the buffer is handed out again.
    await reading?.catch(() => undefined);
    for (const buffer of buffers) give(buffer);
  }
}

function short(digest: string, size: number, to: number): RunnerDepotError {
  return new RunnerDepotError(
    "INTERNAL",
    `Blob ${digest} has ${size} bytes, fewer than the ${to + 1} its manifest names`,
  );
}
