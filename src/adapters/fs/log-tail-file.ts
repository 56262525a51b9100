/**
 * The fs log store's kept tail (docs/decisions/log-tail.md, "fs: one ring file a job"): a cut log's tail segments
 * live back to back in one file a job, `<id>.ring-<generation>`, written circularly. An append writes its tail's
 * records in one positional write at the ring's end (two when it wraps) into bytes no committed state names, and
 * the job's state (renamed in after the write) says where each kept segment lies; dropping a segment is a state
 * change only. The ring holds the tail, the largest append seen at its making and a segment; an append whose tail
 * bytes pass the free space (one larger than any before) copies the kept segments and its own into a ring of the
 * next generation, sized for it (O(tailBytes); rare, as appends keep a size). Stores written before kept a file a segment
 * (`<id>.tail-<first>`, format 1): still read, and copied into a ring on the job's next append.
 */
import { open, rm, truncate, unlink } from "node:fs/promises";
import { join } from "node:path";
import type { LogCut, StoredLine } from "../../runner/ports.js";
import { TAIL_SEGMENTS, type StoredRun } from "../../runner/service/log-tail.js";
import { PageBudget } from "../../runner/service/page-budget.js";
import type { LogHandle, OpenLogs } from "./log-descriptors.js";
import { extendIndex, readLines, scanIndex, type RingPlace } from "./log-read.js";
import { encodeRecords } from "./log-records.js";

/** A format-1 tail segment file (`<id>.tail-<first>`) and its valid bytes. */
export interface TailSegmentFile {
  first: number;
  bytes: number;
}

/** A kept segment in the ring: its first position, where its first byte is, and its bytes (they may wrap). */
export interface RingSegment {
  first: number;
  at: number;
  bytes: number;
}

/** The ring file of a cut log (format 2): its generation (in its name), its size, and its segments, oldest first. */
export interface TailRing {
  format: 2;
  gen: number;
  size: number;
  segments: RingSegment[];
}

/** What a job's state file says of its tail files: a state has one of them, or neither (no tail written yet). */
export interface TailRecord {
  cut?: LogCut;
  /** Format 1 (read, never written): a file a segment, oldest first; a file not listed is a leftover. */
  tailFiles?: TailSegmentFile[];
  /** Format 2: the ring file; another generation's file is a leftover. */
  tailRing?: TailRing;
}

/** What the tail files of every job in one directory share. */
export interface TailContext {
  jobsDir: string;
  openLogs: OpenLogs;
  sync: boolean;
}

const SEGMENT_FILE = /^(.+)\.tail-(\d+)$/;
const RING_FILE = /^(.+)\.ring-(\d+)$/;

/** True for the name of a tail file (either format), which {@link settleTailFiles} handles. O(name). */
export function isTailFile(name: string): boolean {
  return SEGMENT_FILE.test(name) || RING_FILE.test(name);
}

/**
 * At load: cuts a listed format-1 segment file to its valid bytes and removes every tail file its job's state does
 * not name (a dropped segment or an old ring whose removal a crash cut off, or a file a torn append made). A
 * listed ring needs no cut: bytes past its segments are free space. O(names).
 */
export async function settleTailFiles(
  jobsDir: string,
  names: readonly string[],
  stateOf: (id: string) => TailRecord | undefined,
): Promise<void> {
  for (const name of names) {
    const segment = SEGMENT_FILE.exec(name);
    const ring = segment ? null : RING_FILE.exec(name);
    const id = (segment ?? ring)?.[1];
    if (id === undefined) continue;
    const state = stateOf(id);
    const number = Number((segment ?? ring)![2]);
    const listed = segment ? state?.tailFiles?.find((t) => t.first === number) : undefined;
    if (listed) await truncate(join(jobsDir, name), listed.bytes);
    else if (!ring || state?.tailRing?.gen !== number) await rm(join(jobsDir, name), { force: true });
  }
}

/**
 * A job's tail files: writes an append's tail runs, reads them back, removes what a committed state no longer
 * names. The store calls it under the job's lock; it keeps descriptors in the store's pool and a line index a
 * segment.
 *
 * @example
 * const tail = new TailFiles({ jobsDir, openLogs, sync: true }, id);
 * const written = tail.write(job.state, next, plan.runs, base); // next.tailRing set
 * await commitState(next, written);
 * await tail.committed(job.state, next);
 */
export class TailFiles {
  /** Descriptors of ring files, by generation (the committed one, and a new one while an append makes it). */
  private readonly rings = new Map<number, LogHandle>();
  /** Byte offset of every STRIDE-th line of a segment (log-read.ts), by its first position; built on first read. */
  private readonly indexes = new Map<number, number[]>();

  constructor(
    private readonly ctx: TailContext,
    private readonly id: string,
  ) {}

  /**
   * Writes the tail runs of an append (its head run is the caller's) and sets `next.tailRing` to what they and the
   * kept segments of `prev` make; the promise settles when they are written (and synced). Nothing a committed state
   * names is overwritten: the bytes go where `prev`'s segments are not. `headBytes`: what the same append writes
   * to the head (a new ring is sized for the whole append). O(bytes) (plus the kept tail on a copy).
   */
  write(prev: TailRecord, next: TailRecord, runs: readonly StoredRun[], baseUs: number, headBytes = 0): Promise<void> {
    const tail = runs.filter((r) => r.segment !== null);
    const lines = tail.length === 1 ? tail[0]!.lines : joinRuns(tail);
    // One encoding and one write for the whole append, however many segments it spans.
    const { bytes, sizes } = lines.length > 0 ? encodeRecords(lines, baseUs) : { bytes: EMPTY, sizes: NO_SIZES };
    const kept = new Set((next.cut?.segments ?? []).map((s) => s.first));
    delete next.tailFiles;
    const ring = prev.tailRing;
    const used = ring ? sumBytes(ring.segments) : 0;
    if (!ring || prev.tailFiles || used + bytes.length > ring.size) {
      if (bytes.length === 0 && !prev.tailFiles && !ring) return Promise.resolve();
      return this.copyInto(prev, next, kept, tail, bytes, sizes, headBytes);
    }
    const segments = ring.segments.map((s) => ({ ...s }));
    // Where the newest segment ends (the oldest's start when the ring holds none).
    const end = ring.segments.length > 0 ? (ring.segments[0]!.at + used) % ring.size : 0;
    this.place(segments, ring.size, end, tail, sizes);
    next.tailRing = { format: 2, gen: ring.gen, size: ring.size, segments: segments.filter((s) => kept.has(s.first)) };
    return this.writeRing(ring.gen, ring.size, end, bytes, false);
  }

  /** After the state `next` is committed: drops the indexes of dropped segments and removes unnamed files. */
  async committed(prev: TailRecord, next: TailRecord): Promise<void> {
    const kept = new Set((next.tailRing?.segments ?? []).map((s) => s.first));
    for (const first of [...this.indexes.keys()]) if (!kept.has(first)) this.indexes.delete(first);
    if (prev.tailRing && prev.tailRing.gen !== next.tailRing?.gen) await this.removeRing(prev.tailRing.gen);
    for (const t of prev.tailFiles ?? [])
      if (!next.tailFiles?.some((n) => n.first === t.first)) await this.removeSegment(t);
  }

  /** After a failed append: its writes may have been cut short, so indexes are rebuilt and an unnamed ring closed. */
  failed(committed: TailRecord): void {
    this.indexes.clear();
    for (const [gen, handle] of [...this.rings]) {
      if (gen === committed.tailRing?.gen) continue;
      this.ctx.openLogs.close(handle);
      this.rings.delete(gen);
    }
  }

  /**
   * Stored lines `[from, to)` of the tail of a job in state `state`, within `budget`. O(lines read + STRIDE a segment
   * met).
   */
  async readRun(
    state: TailRecord,
    from: number,
    to: number,
    baseUs: number,
    budget: PageBudget = new PageBudget(),
  ): Promise<StoredLine[]> {
    const out: StoredLine[] = [];
    const segments = state.cut?.segments ?? [];
    for (let i = 0; i < segments.length && out.length < to - from; i++) {
      const segment = segments[i]!;
      const end = segment.first + segment.lines;
      if (end <= from || segment.first >= to) continue;
      const where = this.where(state, segment.first);
      if (!where) continue;
      let index = this.indexes.get(segment.first);
      if (!index) {
        index = await scanIndex(where.path, where.bytes, where.ring);
        this.indexes.set(segment.first, index);
      }
      const start = Math.max(from, segment.first);
      const count = Math.min(to, end) - start;
      const lines = await readLines(
        where.path,
        index,
        where.bytes,
        start - segment.first,
        count,
        baseUs,
        where.ring,
        budget,
      );
      for (const line of lines) out.push(line);
      // Cut short by the read's byte bound: the page ends here, with no gap.
      if (budget.full || lines.length < count) break;
    }
    return out;
  }

  /** Closes the tail's descriptors (a finished job takes no more lines). O(rings). */
  close(): void {
    for (const handle of this.rings.values()) this.ctx.openLogs.close(handle);
    this.rings.clear();
  }

  /** Removes every tail file `state` names (archive, prune); gone already is fine. O(files). */
  async remove(state: TailRecord): Promise<void> {
    this.close();
    this.indexes.clear();
    if (state.tailRing) await this.removeRing(state.tailRing.gen);
    for (const t of state.tailFiles ?? []) await this.removeSegment(t);
  }

  /** Where segment `first`'s bytes are read from, in either format; null when none were written. O(segments). */
  private where(state: TailRecord, first: number): { path: string; bytes: number; ring?: RingPlace } | null {
    const ring = state.tailRing;
    if (ring) {
      const s = ring.segments.find((t) => t.first === first);
      return s ? { path: this.ringPath(ring.gen), bytes: s.bytes, ring: { at: s.at, size: ring.size } } : null;
    }
    const file = state.tailFiles?.find((t) => t.first === first);
    return file ? { path: this.segmentPath(first), bytes: file.bytes } : null;
  }

  /**
   * Lays the append's runs out after `end` (a run of the newest segment continues it; the others start a segment
   * each) and extends the built indexes. O(runs + lines).
   */
  private place(segments: RingSegment[], size: number, end: number, runs: readonly StoredRun[], sizes: Uint32Array) {
    let cursor = end;
    let line = 0;
    for (const run of runs) {
      let segment = segments[segments.length - 1];
      if (segment?.first !== run.segment) {
        segment = { first: run.segment!, at: cursor, bytes: 0 };
        segments.push(segment);
      }
      const stop = line + run.lines.length;
      // Indexed, not for…of a subarray: no iterator nor view made a run.
      let bytes = 0;
      for (let i = line; i < stop; i++) bytes += sizes[i]!;
      const index = this.indexes.get(segment.first);
      if (index) extendIndex(index, segment.bytes, run.first - segment.first, sizes.subarray(line, stop));
      segment.bytes += bytes;
      cursor = (cursor + bytes) % size;
      line = stop;
    }
  }

  /**
   * Makes the next generation's ring, large enough for the tail and one more such append: the kept segments of `prev`
   * (copied, format 1's files or the old ring), then the append's bytes. `next.tailRing` is set before it returns
   * (the caller writes the state at once); the copy and the write are the promise. O(kept tail + bytes).
   */
  private copyInto(
    prev: TailRecord,
    next: TailRecord,
    kept: ReadonlySet<number>,
    runs: readonly StoredRun[],
    bytes: Buffer,
    sizes: Uint32Array,
    headBytes: number,
  ): Promise<void> {
    const old = (prev.tailRing?.segments ?? prev.tailFiles ?? []).filter((s) => kept.has(s.first));
    const cut = next.cut!;
    const segment = Math.ceil(cut.tailBytes / TAIL_SEGMENTS);
    // The tail, one more append as large as this one, and a segment: appends no larger never copy again (the
    // server's appends of ~1.7 MB copied a 4 MiB tail every time with two segments of slack). The append that cuts
    // the log writes only its end to the tail: it is sized by the whole append (its head records too), else the
    // next ones, all tail, copied the tail once more a job. At most 2 × tailBytes + a segment + a line, since an
    // append writes no more than the tail keeps.
    const append = Math.max(bytes.length, Math.min(bytes.length + headBytes, cut.tailBytes));
    const size = Math.max(
      cut.tailBytes + 2 * segment,
      cut.tailBytes + append + segment,
      sumBytes(old) + bytes.length,
      1,
    );
    const gen = (prev.tailRing?.gen ?? 0) + 1;
    const segments: RingSegment[] = [];
    let at = 0;
    for (const s of old) {
      segments.push({ first: s.first, at, bytes: s.bytes });
      at += s.bytes;
    }
    this.place(segments, size, at, runs, sizes);
    next.tailRing = { format: 2, gen, size, segments: segments.filter((s) => kept.has(s.first)) };
    return (async () => {
      const copies: Buffer[] = [];
      for (const s of old) copies.push(await this.readBytes(prev, s.first, s.bytes));
      const handle = this.ring(gen);
      // A descriptor of this generation left by an earlier failed copy is dropped: the file is made anew.
      this.ctx.openLogs.close(handle);
      await this.ctx.openLogs.write(handle, Buffer.concat([...copies, bytes]), 0, this.ctx.sync, true);
    })();
  }

  /** `bytes` at `end` of generation `gen`'s ring, split where it wraps; synced once. O(bytes). */
  private async writeRing(gen: number, size: number, end: number, bytes: Buffer, fresh: boolean): Promise<void> {
    if (bytes.length === 0) return;
    const handle = this.ring(gen);
    const first = Math.min(bytes.length, size - end);
    if (first === bytes.length) return this.ctx.openLogs.write(handle, bytes, end, this.ctx.sync, fresh);
    // Sequential, not concurrent: the pool closes a descriptor only while no write holds it.
    await this.ctx.openLogs.write(handle, bytes.subarray(0, first), end, false, fresh);
    await this.ctx.openLogs.write(handle, bytes.subarray(first), 0, this.ctx.sync, false);
  }

  /** The `bytes` bytes of segment `first` as `state` names them. O(bytes). */
  private async readBytes(state: TailRecord, first: number, bytes: number): Promise<Buffer> {
    const where = this.where(state, first)!;
    const out = Buffer.allocUnsafe(bytes);
    const fh = await open(where.path, "r");
    try {
      let done = 0;
      while (done < bytes) {
        const at = where.ring ? (where.ring.at + done) % where.ring.size : done;
        const length = where.ring ? Math.min(bytes - done, where.ring.size - at) : bytes - done;
        const { bytesRead } = await fh.read(out, done, length, at);
        if (bytesRead === 0) throw new Error(`tail file ${where.path} is shorter than its state says`);
        done += bytesRead;
      }
    } finally {
      await fh.close();
    }
    return out;
  }

  private ring(gen: number): LogHandle {
    let handle = this.rings.get(gen);
    if (!handle) {
      handle = { id: `${this.id}.ring-${gen}`, path: this.ringPath(gen) };
      this.rings.set(gen, handle);
    }
    return handle;
  }

  private async removeRing(gen: number): Promise<void> {
    const handle = this.rings.get(gen);
    if (handle) this.ctx.openLogs.close(handle);
    this.rings.delete(gen);
    await unlinkGone(this.ringPath(gen));
  }

  private async removeSegment(file: TailSegmentFile): Promise<void> {
    await unlinkGone(this.segmentPath(file.first));
  }

  private ringPath(gen: number): string {
    return join(this.ctx.jobsDir, `${this.id}.ring-${gen}`);
  }

  private segmentPath(first: number): string {
    return join(this.ctx.jobsDir, `${this.id}.tail-${first}`);
  }
}

const EMPTY = Buffer.alloc(0);
const NO_SIZES = new Uint32Array(0);

/** The lines of several runs in one array, sized up front (flatMap made ~3× the garbage). O(lines). */
function joinRuns(runs: readonly StoredRun[]): StoredLine[] {
  let total = 0;
  for (const run of runs) total += run.lines.length;
  const out = new Array<StoredLine>(total);
  let n = 0;
  for (const run of runs) for (let i = 0; i < run.lines.length; i++) out[n++] = run.lines[i]!;
  return out;
}

function sumBytes(segments: readonly { bytes: number }[]): number {
  let sum = 0;
  for (const s of segments) sum += s.bytes;
  return sum;
}

/** One unlink (rm's lstat first is a pool trip more); gone already is fine. */
async function unlinkGone(path: string): Promise<void> {
  await unlink(path).catch((error: NodeJS.ErrnoException) => {
    if (error.code !== "ENOENT") throw error;
  });
}
