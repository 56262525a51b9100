/**
 * Reading an fs log store's log file: a sparse index of record offsets (every STRIDE-th
 * line), built by one scan on a job's first read and kept current by appends, and a read
 * of `limit` lines from line `from` that starts at the nearest indexed offset, so a read
 * costs O(STRIDE + lines read), not O(lines before `from`).
 */
import { open, type FileHandle } from "node:fs/promises";
import type { StoredLine } from "../../runner/ports.js";
import { decodeRecord } from "./log-records.js";
import { PageBudget } from "../../runner/service/page-budget.js";

/** Lines between two indexed offsets. */
export const STRIDE = 256;
const READ_CHUNK = 1024 * 1024;

/**
 * Where a run of records lies in a file written circularly (log-tail-file.ts): its byte `p` is at `(at + p) mod
 * size`. Without one, byte `p` is at `p`.
 */
export interface RingPlace {
  at: number;
  size: number;
}

/** Reads up to `length` bytes of the run from its byte `pos`; at the ring's end it stops short (callers loop). O(length). */
function readAt(fh: FileHandle, buf: Buffer, length: number, pos: number, ring: RingPlace | undefined) {
  if (!ring) return fh.read(buf, 0, length, pos);
  const at = (ring.at + pos) % ring.size;
  return fh.read(buf, 0, Math.min(length, ring.size - at), at);
}

/**
 * The offset of every STRIDE-th record of the first `total` bytes of `path` (or of the run at `ring` in it; none if
 * it is gone). O(total).
 */
export async function scanIndex(path: string, total: number, ring?: RingPlace): Promise<number[]> {
  const index: number[] = [];
  let fh: FileHandle | undefined;
  try {
    fh = await open(path, "r");
    const buf = Buffer.allocUnsafe(READ_CHUNK);
    let pos = 0;
    let line = 0;
    let lineStart = 0;
    while (pos < total) {
      const { bytesRead } = await readAt(fh, buf, Math.min(READ_CHUNK, total - pos), pos, ring);
      if (bytesRead === 0) break;
      for (let i = 0; i < bytesRead; i++) {
        if (buf[i] === 0x0a) {
          if (line % STRIDE === 0) index.push(lineStart);
          line++;
          lineStart = pos + i + 1;
        }
      }
      pos += bytesRead;
    }
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== "ENOENT") throw error;
  } finally {
    await fh?.close();
  }
  return index;
}

/**
 * Adds the offsets of an append's records (their sizes, from `offset`, the first being line `line`) to `index`.
 * O(records).
 */
export function extendIndex(index: number[], offset: number, line: number, sizes: Uint32Array): void {
  for (const size of sizes) {
    if (line % STRIDE === 0) index.push(offset);
    offset += size;
    line++;
  }
}

/**
 * Up to `limit` lines from line `from` of the first `end` bytes of `path` (or of the run at `ring` in it), starting
 * at `index`'s nearest offset; record times count from `baseUs` (log-records.ts timeBase). The page ends early at
 * the first record `budget` refuses.
 */
export async function readLines(
  path: string,
  index: number[],
  end: number,
  from: number,
  limit: number,
  baseUs = 0,
  ring?: RingPlace,
  budget: PageBudget = new PageBudget(),
): Promise<StoredLine[]> {
  const checkpoint = Math.floor(from / STRIDE);
  let line = checkpoint * STRIDE;
  let pos = index[checkpoint] ?? 0;
  const out: StoredLine[] = [];
  const fh = await open(path, "r");
  try {
    let carry: Buffer = Buffer.alloc(0);
    const buf = Buffer.allocUnsafe(READ_CHUNK);
    let full = false;
    while (pos < end && out.length < limit && !full) {
      const { bytesRead } = await readAt(fh, buf, Math.min(READ_CHUNK, end - pos), pos, ring);
      if (bytesRead === 0) break;
      pos += bytesRead;
      const data = carry.length > 0 ? Buffer.concat([carry, buf.subarray(0, bytesRead)]) : buf.subarray(0, bytesRead);
      // Decode up to the last newline only, so no UTF-8 character is split across chunks.
      const lastNl = data.lastIndexOf(0x0a);
      if (lastNl < 0) {
        carry = Buffer.from(data);
        continue;
      }
      const chunk = data.toString("utf8", 0, lastNl + 1);
      carry = Buffer.from(data.subarray(lastNl + 1));
      let start = 0;
      for (;;) {
        const nl = chunk.indexOf("\n", start);
        if (nl < 0) break;
        if (line >= from) {
          // A record's characters stand for its line's bytes (the read's byte bound).
          if (!budget.take(nl - start)) {
            full = true;
            break;
          }
          out.push(decodeRecord(chunk.slice(start, nl), baseUs));
          if (out.length >= limit) break;
        }
        line++;
        start = nl + 1;
      }
    }
  } finally {
    await fh.close();
  }
  return out;
}
