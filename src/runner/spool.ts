/**
 * The runner client's spool: every item not yet acknowledged, kept as ready-to-send
 * gRPC frames packed into large chunks, so a call writes a few big slices instead of
 * one small buffer per line, and a replay after a failure costs no re-encoding.
 */

interface Chunk {
  buf: Buffer;
  used: number;
  /** Job offset of the chunk's first item. */
  first: number;
  /** End position (exclusive) in `buf` of each item, in order. */
  ends: number[];
  /** No more appends (set when items were cut off: their bytes may still be in flight). */
  sealed: boolean;
}

/** Slices of frames to write for a range of items. */
export interface SpoolSlice {
  /** Buffers to write, in order (views into the spool; never mutated afterwards). */
  buffers: Buffer[];
  /** Total bytes of `buffers`. */
  bytes: number;
  /** Job offset one past the last item included. */
  to: number;
}

/** Options of {@link createSpool}. */
export interface SpoolOptions {
  /** Size of one packed chunk; a frame larger than this gets a chunk of its own. Default 64 KiB. */
  chunkBytes?: number;
  /** Job offset of the first item the spool will hold. Default 0. */
  start?: number;
}

/**
 * Creates an empty spool.
 *
 * @example
 * const spool = createSpool();
 * spool.append(size, (buf, pos) => enc.writeLogFrame(buf, pos, line, bytes, false));
 */
export function createSpool(options: SpoolOptions = {}): Spool {
  const chunkBytes = options.chunkBytes ?? 64 * 1024;
  const chunks: Chunk[] = [];
  let end = options.start ?? 0;
  let start = end;
  let bytes = 0;

  function chunkFor(offset: number): number {
    // Few chunks are held (about spool bytes ÷ 64 KiB); scan from the newest.
    for (let i = chunks.length - 1; i >= 0; i--) if (chunks[i]!.first <= offset) return i;
    return -1;
  }

  return {
    get start() {
      return start;
    },
    get end() {
      return end;
    },
    get bytes() {
      return bytes;
    },
    append(size, write) {
      let tail = chunks[chunks.length - 1];
      if (tail === undefined || tail.sealed || tail.buf.length - tail.used < size) {
        tail = { buf: Buffer.allocUnsafe(Math.max(chunkBytes, size)), used: 0, first: end, ends: [], sealed: false };
        chunks.push(tail);
      }
      const pos = write(tail.buf, tail.used);
      tail.used = pos;
      tail.ends.push(pos);
      bytes += size;
      return end++;
    },
    has(offset) {
      return offset >= start && offset <= end;
    },
    slice(from, maxBytes) {
      const buffers: Buffer[] = [];
      let total = 0;
      let to = from;
      if (from >= end || from < start) return { buffers, bytes: 0, to: from };
      for (let ci = chunkFor(from); ci < chunks.length; ci++) {
        const c = chunks[ci]!;
        const i0 = to - c.first;
        const s = i0 === 0 ? 0 : c.ends[i0 - 1]!;
        const budget = maxBytes - total;
        if (c.used - s <= budget) {
          if (c.used > s) buffers.push(c.buf.subarray(s, c.used));
          total += c.used - s;
          to = c.first + c.ends.length;
          continue;
        }
        let i = i0;
        while (i < c.ends.length && c.ends[i]! - s <= budget) i++;
        if (i === i0 && total === 0) i = i0 + 1; // always make progress, even past the budget
        if (i > i0) {
          buffers.push(c.buf.subarray(s, c.ends[i - 1]!));
          total += c.ends[i - 1]! - s;
          to = c.first + i;
        }
        break;
      }
      return { buffers, bytes: total, to };
    },
    drop(before) {
      if (before <= start) return;
      start = Math.min(before, end);
      while (chunks.length > 0) {
        const c = chunks[0]!;
        if (c.first + c.ends.length > start) break;
        // Only whole chunks are released; a partly acknowledged one stays until it is done.
        bytes -= c.used;
        chunks.shift();
      }
      if (chunks.length === 0) bytes = 0;
    },
    frames(from) {
      const out: Buffer[] = [];
      for (let o = Math.max(from, start); o < end; o++) {
        const c = chunks[chunkFor(o)]!;
        const i = o - c.first;
        out.push(c.buf.subarray(i === 0 ? 0 : c.ends[i - 1]!, c.ends[i]!));
      }
      return out;
    },
    truncate(to) {
      // Forget items from `to` on (they are re-encoded by the caller); keeps order intact.
      if (to >= end) return;
      while (chunks.length > 0) {
        const c = chunks[chunks.length - 1]!;
        if (c.first >= to) {
          bytes -= c.used;
          chunks.pop();
          continue;
        }
        const keep = to - c.first;
        const newUsed = keep === 0 ? 0 : c.ends[keep - 1]!;
        bytes -= c.used - newUsed;
        c.ends.length = keep;
        c.used = newUsed;
        c.sealed = true;
        break;
      }
      end = to;
    },
  };
}

/** What {@link createSpool} returns. */
export interface Spool {
  /** Offset of the first item still held. */
  readonly start: number;
  /** Offset one past the last item. */
  readonly end: number;
  /** Bytes of memory the held chunks use (approximately, whole chunks). */
  readonly bytes: number;
  /** Appends one frame of `size` bytes written by `write(buf, pos)` → end position; returns its offset. */
  append(size: number, write: (buf: Buffer, pos: number) => number): number;
  /** True when a replay from `offset` is possible (start ≤ offset ≤ end). */
  has(offset: number): boolean;
  /** Frames from `from` on, up to about `maxBytes` (at least one item). */
  slice(from: number, maxBytes: number): SpoolSlice;
  /** Forgets items before `before` (they are acknowledged). */
  drop(before: number): void;
  /** Each frame from `from` on, one buffer per item (slow path: re-splitting). */
  frames(from: number): Buffer[];
  /** Forgets items from `to` on. */
  truncate(to: number): void;
}
