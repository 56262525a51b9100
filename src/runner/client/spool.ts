/**
 * The runner client's spool: every item not yet acknowledged, kept as ready-to-send
 * gRPC frames packed into large chunks, so a call writes a few big slices instead of
 * one small buffer per line, and a replay after a failure costs no re-encoding.
 */
import { FRAME_PREFIX_BYTES, writeVarint, type LineFramer } from "../protocol/encoder.js";
import { varintSize } from "../protocol/encoded-size.js";

interface Chunk {
  buf: Buffer;
  used: number;
  /** Job offset of the chunk's first item. */
  first: number;
  /**
   * End position (exclusive) in `buf` of the frame of each of the chunk's {@link Chunk.count} items, in order (the
   * lines of one run share their frame's end; two frames never end alike, so equal neighbours are one frame): a typed array kept
   * with the chunk's memory and reused with it, so the spool allocates nothing a line (a `number[]` grown a line
   * was ~8 MB of heap a 300,000-line job, promoted while unacknowledged: a mark-compact a job in the agent).
   */
  ends: Uint32Array;
  /** Items in the chunk. */
  count: number;
  /** No more appends (set when items were cut off: their bytes may still be in flight). */
  sealed: boolean;
}

/** Slices of frames to write for a range of items. */
interface SpoolSlice {
  /**
   * Buffers to write, in order (views into the spool; never mutated while any of their items is held: a chunk whose
   * items are all dropped is written over by later items).
   */
  buffers: Buffer[];
  /** Total bytes of `buffers`. */
  bytes: number;
  /** Job offset one past the last item included. */
  to: number;
}

/**
 * Released chunks kept for reuse: a call's worth at the client's default `maxCallBytes` (4 MiB in 64 KiB chunks), as an
 * Ack releases a call's chunks at once.
 */
const SPARE_CHUNKS = 64;

/** Items a new chunk's `ends` holds before it grows: a 64 KiB chunk of 100-byte lines holds ~420 frames. */
const ENDS_AT_FIRST = 512;

/**
 * Most lines a run frame carries: the server's bound (docs/runner-protocol.md §7, `MAX_RUN_LINES` on its side). A
 * run is also cut where its frame would not fit its chunk.
 */
export const RUN_LINES = 4096;

/**
 * A chunk with less room than this starts a new one for the next run rather than a run of a few lines: a run's
 * framing (~50 bytes) is worth paying once per many lines.
 */
const MIN_RUN_ROOM = 1024;

/** A released chunk's memory: its buffer and the `ends` it grew. */
interface SpareChunk {
  buf: Buffer;
  ends: Uint32Array;
}

/** Options of {@link createSpool}. */
interface SpoolOptions {
  /** Size of one packed chunk; a frame larger than this gets a chunk of its own. Default 64 KiB. */
  chunkBytes?: number;
  /** Job offset of the first item the spool will hold. Default 0. */
  start?: number;
  /** Items a new chunk's index holds before it doubles. Default 512 (a test makes it small, so it grows). */
  endsAtFirst?: number;
}

/**
 * Creates an empty spool.
 *
 * @example
 * const spool = createSpool();
 * spool.append(size, (buf, pos) => enc.writeLogFrame(buf, pos, line, bytes, false));
 */
export function createSpool(options: SpoolOptions = {}): Spool {
  // At least one entry, or doubling would never grow it.
  return new PackedSpool(
    options.chunkBytes ?? 64 * 1024,
    options.start ?? 0,
    Math.max(1, options.endsAtFirst ?? ENDS_AT_FIRST),
  );
}

/**
 * The spool as a class: `append`, `end` and `bytes` are read for every line, and an object literal with getters
 * (what this was) is kept in dictionary mode by V8.
 * Why: docs/decisions/runner-client.md, "spool.ts: PackedSpool".
 */
class PackedSpool implements Spool {
  private readonly chunks: Chunk[] = [];
  /**
   * Buffers of released chunks and their item ends, written again by the next chunks (at most {@link SPARE_CHUNKS}):
   * fresh 64 KiB buffers cost the agent page faults and the GC's external-memory mark-compacts. Never a sealed chunk's.
   * Why: docs/decisions/ingest-limit.md, "spool.ts: spare chunks".
   */
  private readonly spares: SpareChunk[] = [];
  private first: number;
  private next: number;
  private held = 0;
  /** Where each line of the run being framed ends in its source: scratch, reused by every run. */
  private readonly runEnds = new Uint32Array(RUN_LINES);

  constructor(
    private readonly chunkBytes: number,
    start: number,
    private readonly endsAtFirst: number,
  ) {
    this.first = start;
    this.next = start;
  }

  get start(): number {
    return this.first;
  }

  get end(): number {
    return this.next;
  }

  get bytes(): number {
    return this.held;
  }

  /** The chunk holding `offset`. Few chunks are held (about spool bytes ÷ 64 KiB); scan from the newest. O(chunks). */
  private chunkFor(offset: number): number {
    const chunks = this.chunks;
    for (let i = chunks.length - 1; i >= 0; i--) if (chunks[i]!.first <= offset) return i;
    return -1;
  }

  /** A new tail chunk for a frame of `size` bytes: a spare one when it fits, else new memory. O(1). */
  private newTail(size: number): Chunk {
    const spare = size <= this.chunkBytes ? this.spares.pop() : undefined;
    const tail: Chunk = {
      buf: spare?.buf ?? Buffer.allocUnsafe(Math.max(this.chunkBytes, size)),
      used: 0,
      first: this.next,
      // A chunk of its own for an oversized frame rarely takes a second one.
      ends: spare?.ends ?? new Uint32Array(size > this.chunkBytes ? 1 : this.endsAtFirst),
      count: 0,
      sealed: false,
    };
    this.chunks.push(tail);
    return tail;
  }

  /** Whether a frame of `size` bytes goes into `chunk`: never into a sealed one, whose bytes may be in flight. O(1). */
  private fits(chunk: Chunk | undefined, size: number): chunk is Chunk {
    return chunk !== undefined && !chunk.sealed && chunk.buf.length - chunk.used >= size;
  }

  /** The chunk the next frame of `size` bytes goes to: the tail when it has room. O(1). */
  private tailFor(size: number): Chunk {
    const tail = this.chunks[this.chunks.length - 1];
    return this.fits(tail, size) ? tail : this.newTail(size);
  }

  /** Records the frame of `size` bytes just written into `tail`, ending at `pos`; returns its offset. O(1). */
  private placed(tail: Chunk, pos: number, size: number): number {
    tail.used = pos;
    if (tail.count === tail.ends.length) {
      // Doubling: O(1) amortised a frame; the grown array stays with the chunk's memory.
      const grown = new Uint32Array(tail.count * 2);
      grown.set(tail.ends);
      tail.ends = grown;
    }
    tail.ends[tail.count++] = pos;
    this.held += size;
    return this.next++;
  }

  append(size: number, write: (buf: Buffer, pos: number) => number): number {
    const tail = this.tailFor(size);
    return this.placed(tail, write(tail.buf, tail.used), size);
  }

  appendLines(src: Buffer, start: number, end: number, maxLine: number, frames: LineFramer): number {
    const tail = frames.tail;
    const tailBytes = tail.length;
    let chunk = this.chunks[this.chunks.length - 1];
    let pos = start;
    // One pass over the run (O(bytes)): a native newline search (it may look past `end`, never past `src`), then the
    // frame written in place from its prebuilt head; a fresh chunk only when the frame does not fit.
    while (pos < end) {
      const nl = src.indexOf(10, pos);
      if (nl === -1 || nl >= end || nl - pos > maxLine) break;
      const head = frames.head(nl - pos);
      const size = head.length + (nl - pos) + tailBytes;
      if (!this.fits(chunk, size)) chunk = this.newTail(size);
      const buf = chunk.buf;
      let at = chunk.used;
      buf.set(head, at);
      at += head.length;
      // Buffer#copy: a native copy, ~10 ns for 100 bytes on Node 22 (set() of a subarray ~30).
      at += src.copy(buf, at, pos, nl);
      for (let i = 0; i < tailBytes; i++) buf[at + i] = tail[i]!;
      this.placed(chunk, at + tailBytes, size);
      pos = nl + 1;
    }
    return pos;
  }

  appendRuns(src: Buffer, start: number, end: number, maxLine: number, frames: LineFramer, maxFrame: number): number {
    const ends = this.runEnds;
    const id = frames.id;
    const tail = frames.tail;
    // A run frame's bytes besides its lines: prefix, request ID, the run's tag and (at most) 5-byte length, the tail.
    const overhead = FRAME_PREFIX_BYTES + id.length + 1 + 5 + tail.length;
    let pos = start;
    // O(bytes): each pipe read's lines are found once (a native newline search) and copied once into their frame.
    for (;;) {
      let chunk = this.chunks[this.chunks.length - 1];
      let room = chunk !== undefined && !chunk.sealed ? chunk.buf.length - chunk.used : 0;
      if (room < Math.min(MIN_RUN_ROOM, maxFrame)) room = this.chunkBytes;
      // A run's frame stays within what the server takes: the client's line limit, halved on RESOURCE_EXHAUSTED.
      room = Math.min(room, maxFrame);
      let n = 0;
      let fields = 0;
      let at = pos;
      while (at < end && n < RUN_LINES) {
        const nl = src.indexOf(10, at);
        if (nl === -1 || nl >= end || nl - at > maxLine) break;
        const field = 1 + varintSize(nl - at) + (nl - at);
        // A line that fits no chunk still goes, alone, in a chunk of its own size.
        if (n > 0 && overhead + fields + field > room) break;
        fields += field;
        ends[n++] = nl;
        at = nl + 1;
      }
      if (n === 0) return pos;
      const body = fields + tail.length;
      const msg = id.length + 1 + varintSize(body) + body;
      const size = FRAME_PREFIX_BYTES + msg;
      if (!this.fits(chunk, size)) chunk = this.newTail(size);
      const buf = chunk.buf;
      let w = chunk.used;
      buf[w] = 0;
      buf.writeUInt32BE(msg, w + 1);
      w += FRAME_PREFIX_BYTES;
      buf.set(id, w);
      w += id.length;
      buf[w++] = 0x22; // LogItem field 4 (run), wire type 2
      w = writeVarint(buf, w, body);
      let from = pos;
      for (let i = 0; i < n; i++) {
        const nl = ends[i]!;
        buf[w++] = 0x0a; // LogRun field 1 (lines), wire type 2
        w = writeVarint(buf, w, nl - from);
        w += src.copy(buf, w, from, nl);
        from = nl + 1;
      }
      for (let i = 0; i < tail.length; i++) buf[w + i] = tail[i]!;
      w += tail.length;
      // Every line is an item; they share the frame's end, so a call starts only at the frame's first line.
      for (let i = 0; i < n; i++) this.placed(chunk, w, i === 0 ? size : 0);
      pos = from;
    }
  }

  frameStart(offset: number): number {
    // The spool's start may be within a run (acknowledged up to there): its chunk, held whole, has the run's start.
    if (this.chunks.length === 0 || offset < this.chunks[0]!.first || offset >= this.next) return offset;
    const c = this.chunks[this.chunkFor(offset)]!;
    let i = offset - c.first;
    // O(lines of the run): back to the run's first line.
    while (i > 0 && c.ends[i - 1] === c.ends[i]) i--;
    return c.first + i;
  }

  has(offset: number): boolean {
    return offset >= this.first && offset <= this.next;
  }

  slice(from: number, maxBytes: number): SpoolSlice {
    const chunks = this.chunks;
    const buffers: Buffer[] = [];
    let total = 0;
    let to = from;
    // A call may start before the spool's start, at the first line of the run that holds it (frameStart).
    if (from >= this.next || from < (chunks[0]?.first ?? this.first)) return { buffers, bytes: 0, to: from };
    for (let ci = this.chunkFor(from); ci < chunks.length; ci++) {
      const c = chunks[ci]!;
      const i0 = to - c.first;
      const s = i0 === 0 ? 0 : c.ends[i0 - 1]!;
      const budget = maxBytes - total;
      if (c.used - s <= budget) {
        if (c.used > s) buffers.push(c.buf.subarray(s, c.used));
        total += c.used - s;
        to = c.first + c.count;
        continue;
      }
      let i = i0;
      while (i < c.count && c.ends[i]! - s <= budget) i++;
      if (i === i0 && total === 0) {
        // Always make progress, even past the budget: the whole frame (every line of a run).
        i = i0 + 1;
        while (i < c.count && c.ends[i] === c.ends[i0]) i++;
      }
      if (i > i0) {
        buffers.push(c.buf.subarray(s, c.ends[i - 1]!));
        total += c.ends[i - 1]! - s;
        to = c.first + i;
      }
      break;
    }
    return { buffers, bytes: total, to };
  }

  drop(before: number): void {
    if (before <= this.first) return;
    this.first = Math.min(before, this.next);
    this.release();
  }

  /** Releases the chunks whose items are all before `first`. O(chunks released). */
  private release(): void {
    const chunks = this.chunks;
    while (chunks.length > 0) {
      const c = chunks[0]!;
      if (c.first + c.count > this.first) break;
      // Only whole chunks are released; a partly acknowledged one stays until it is done.
      this.held -= c.used;
      chunks.shift();
      // Every item in it is acknowledged by a call that has closed: nothing reads its bytes any more. A sealed one
      // had items cut off whose bytes a call may still be writing, so it is never reused.
      if (!c.sealed && c.buf.length === this.chunkBytes && this.spares.length < SPARE_CHUNKS)
        this.spares.push({ buf: c.buf, ends: c.ends });
    }
    if (chunks.length === 0) this.held = 0;
  }

  frames(from: number): Buffer[] {
    const chunks = this.chunks;
    const out: Buffer[] = [];
    for (let o = this.frameStart(Math.max(from, this.first)); o < this.next;) {
      const c = chunks[this.chunkFor(o)]!;
      let i = o - c.first;
      const frameEnd = c.ends[i]!;
      out.push(c.buf.subarray(i === 0 ? 0 : c.ends[i - 1]!, frameEnd));
      while (i < c.count && c.ends[i] === frameEnd) i++;
      o = c.first + i;
    }
    return out;
  }

  truncate(to: number, next = to): void {
    // Forget items from `to` (a frame's first item) on: they are re-encoded by the caller; keeps order intact.
    if (to >= this.next) return;
    // The lines of a run before the old start either go again (the server skips them as duplicates), or, with
    // `next`, are stored already and never sent again: the items are numbered on from there.
    this.first = next > to ? Math.max(this.first, next) : Math.min(this.first, to);
    const chunks = this.chunks;
    while (chunks.length > 0) {
      const c = chunks[chunks.length - 1]!;
      if (c.first >= to) {
        this.held -= c.used;
        chunks.pop();
        continue;
      }
      const keep = to - c.first;
      const newUsed = keep === 0 ? 0 : c.ends[keep - 1]!;
      this.held -= c.used - newUsed;
      c.count = keep;
      c.used = newUsed;
      c.sealed = true;
      break;
    }
    this.next = Math.max(to, next);
    // A chunk cut down to items already acknowledged is done: held, it waited for a later drop.
    this.release();
  }
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
  /**
   * Appends one frame a line for the lines of `src[start, end)` (each ended by `\n`, which is left out), stopping
   * before a line longer than `maxLine` bytes; returns where it stopped (`end` when every line was taken). The
   * lines' bytes are copied before it returns. O(bytes).
   */
  appendLines(src: Buffer, start: number, end: number, maxLine: number, frames: LineFramer): number;
  /**
   * Appends the lines of `src[start, end)` as appendLines does, but as runs: one frame (a `LogRun`, field 4 of
   * `LogItem`) for up to {@link RUN_LINES} lines that fit a chunk and `maxFrame` bytes (one line alone may be
   * larger), each line still an item of its own. Only for a server that said it takes runs (`runner-accepts:
   * runs`). O(bytes).
   */
  appendRuns(src: Buffer, start: number, end: number, maxLine: number, frames: LineFramer, maxFrame: number): number;
  /**
   * Where a call that should start at item `offset` starts: the first line of the run holding it (a frame is sent
   * whole), else `offset`. O(lines of that run).
   */
  frameStart(offset: number): number;
  /** True when a replay from `offset` is possible (start ≤ offset ≤ end). */
  has(offset: number): boolean;
  /** Frames from `from` on, up to about `maxBytes` (at least one item). */
  slice(from: number, maxBytes: number): SpoolSlice;
  /**
   * Forgets items before `before`: acknowledged by a call that has closed, so no write still reads them (their
   * chunk's memory takes later items).
   */
  drop(before: number): void;
  /** Each frame from the one holding `from` on (slow path: re-splitting): one item each, or a run's lines. */
  frames(from: number): Buffer[];
  /**
   * Forgets items from `to` on (a frame's first item: see frameStart). With `next` > `to` (at most the spool's
   * start, `runner-committed`), the items between are stored already (a run's lines before it): the spool numbers
   * on from `next`.
   */
  truncate(to: number, next?: number): void;
}
