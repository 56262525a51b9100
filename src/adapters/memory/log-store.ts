/** In-memory JobLogStore: the default store of createRunnerService, for tests and embedding. */
import { RunnerDepotError } from "../../errors.js";
import {
  applyArchived,
  applyFinish,
  applyOpen,
  cloneJobState,
  isArchivable,
  isPrunable,
  newEntries,
  newJobState,
  planAppend,
} from "../../runner/service/job-state.js";
import { readKept, tailSegmentBytes, type AppendPlan } from "../../runner/service/log-tail.js";
import { pageBudget, type PageBudget } from "../../runner/service/page-budget.js";
import { JobListIndex } from "../../runner/service/job-list.js";
import { cloneSections, emptySections, foldSections } from "../../runner/service/log-sections.js";
import type { JobLogStore, JobState, LogSections, StoredLine } from "../../runner/ports.js";
import { ReceivedLine, readsLineEntries } from "../../runner/protocol/received-line.js";
import { fromMicros, toMicros } from "../../runner/protocol/line-time.js";
import { BlockPool } from "./block-pool.js";

/**
 * A job and its lines, kept as bytes: the lines' UTF-8 back to back in blocks, and per line its end offset in its
 * block, a flag byte (bit 0 stderr, bit 1 marker, bit 2 server time) and its time (µs, 0 = none), in typed arrays.
 * Why: docs/decisions/runner-server.md, "log-store.ts: Job".
 */
interface Job extends Lines {
  state: JobState;
  /** A cut log's tail segments, oldest first (log-tail.ts); the head is the job's own lines. */
  tail: { first: number; lines: Lines }[];
}

/** Lines kept as bytes (the head, or one tail segment): line k of it is position `first + k`. */
interface Lines {
  /** Blocks of line bytes; a line never spans two. */
  blocks: Buffer[];
  /** Index of the first line held by each block. */
  blockFirst: number[];
  /** Bytes used in the last block. */
  used: number;
  /** End offset of each line in its block. */
  ends: Uint32Array;
  flags: Uint8Array;
  /** Each line's time as an integer count of µs since the epoch (8 bytes a line; 0 = none). */
  times: Float64Array;
  /** Lines held. */
  count: number;
  /** The job's sections (log-sections.ts), kept when the lines are archived; undefined: none so far. */
  sections: LogSections | undefined;
  /** Size of the first block (a tail segment's: its share of the tail, so one block holds it). */
  firstBlock: number;
}

const STDERR = 1;
const MARKER = 2;
const SERVER_TIME = 4;
/**
 * First block of a job; each next one doubles, up to MAX_BLOCK (so a short job costs little, a long one few blocks).
 */
const FIRST_BLOCK = 4096;
const MAX_BLOCK = 1024 * 1024;
/** Most let-go blocks a store keeps by default (block-pool.ts): 32 MiB, about a 300,000-line job of 100 bytes. */
const POOLED_BLOCKS = 32;

/** Options of {@link createMemoryLogStore}. */
export interface MemoryLogStoreOptions {
  /**
   * Most 1 MiB line blocks of let-go jobs (pruned or archived) and of dropped tail segments kept for new lines
   * (default 32).
   * An idle store holds up to this much more than its jobs; 0 lets every block go to the GC.
   * Why: docs/decisions/ingest-limit.md, "The memory store's block pool".
   */
  pooledBlocks?: number;
}

function newJob(state: JobState): Job {
  return { state, tail: [], ...newLines() };
}

function newLines(firstBlock = FIRST_BLOCK): Lines {
  return {
    blocks: [],
    blockFirst: [],
    used: 0,
    ends: new Uint32Array(64),
    flags: new Uint8Array(64),
    times: new Float64Array(64),
    count: 0,
    sections: undefined,
    firstBlock,
  };
}

/**
 * A dropped tail segment made empty for the next one: its largest block and its typed arrays are kept (their
 * memory is warm and already counted in the tail), the rest given to the pool. Without it every segment was
 * allocated anew (blocks doubling from 4 KiB) and every dropped one left to the GC: the store alone, fed received
 * lines, cost ~+78 % against the peer (docs/decisions/log-tail.md, "Where the end-to-end cost went"). O(blocks).
 */
function recycled(lines: Lines, pool: BlockPool): Lines {
  let largest: Buffer | undefined;
  for (const block of lines.blocks) if (largest === undefined || block.length > largest.length) largest = block;
  pool.give(lines.blocks.filter((block) => block !== largest));
  lines.blocks = largest === undefined ? [] : [largest];
  lines.blockFirst = largest === undefined ? [] : [0];
  lines.used = 0;
  lines.count = 0;
  lines.sections = undefined;
  return lines;
}

/**
 * Room for `bytes` more in the last block (a new block when it is full; a full-size one from the pool when it has
 * one). Amortised O(1).
 */
function room(job: Lines, bytes: number, pool: BlockPool): Buffer {
  const last = job.blocks[job.blocks.length - 1];
  if (last !== undefined && last.length - job.used >= bytes) return last;
  const size = Math.max(bytes, Math.min(MAX_BLOCK, last === undefined ? job.firstBlock : last.length * 2));
  const block = size === MAX_BLOCK ? pool.take() : Buffer.allocUnsafe(size);
  job.blocks.push(block);
  job.blockFirst.push(job.count);
  job.used = 0;
  return block;
}

/** Appends the lines to the job's blocks. O(lines + bytes). */
function keep(job: Lines, lines: readonly StoredLine[], pool: BlockPool): void {
  if (job.count + lines.length > job.ends.length) {
    const cap = Math.max(job.ends.length * 2, job.count + lines.length);
    const ends = new Uint32Array(cap);
    ends.set(job.ends.subarray(0, job.count));
    const flags = new Uint8Array(cap);
    flags.set(job.flags.subarray(0, job.count));
    const times = new Float64Array(cap);
    times.set(job.times.subarray(0, job.count));
    job.ends = ends;
    job.flags = flags;
    job.times = times;
  }
  for (const line of lines) {
    let end: number;
    let flags = line.stderr ? STDERR : 0;
    if (line.serverTime === true) flags |= SERVER_TIME;
    if (line instanceof ReceivedLine) {
      const n = line.end - line.start;
      const block = room(job, n, pool);
      // Buffer#copy: ~10 ns for a 100-byte line on Node 22, a JS byte loop ~100 ns.
      end = job.used + line.buf.copy(block, job.used, line.start, line.end);
    } else {
      if (line.marker) flags |= MARKER;
      const text = line.line;
      const block = room(job, text.length * 3, pool);
      end = job.used + block.write(text, job.used, "utf8");
    }
    job.used = end;
    job.ends[job.count] = end;
    job.flags[job.count] = flags;
    job.times[job.count] = toMicros(line.time ?? 0);
    job.count++;
  }
}

/** Stores an append's runs and folds the job's sections over them, in position order. O(lines). */
function storeWithSections(job: Job, plan: AppendPlan, pool: BlockPool): void {
  store(job, plan, pool);
  for (const run of plan.runs) job.sections = foldSections(job.sections, run.lines, run.first);
}

/**
 * The stored lines `[from, to)` as the port's objects (marker only when set, as the service writes it). O(lines +
 * bytes).
 */
function linesOf(job: Lines, from: number, to: number, budget: PageBudget): StoredLine[] {
  const out: StoredLine[] = [];
  if (from >= to) return out;
  // The block holding `from`: the last one starting at or before it (binary search).
  let lo = 0;
  let hi = job.blocks.length - 1;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (job.blockFirst[mid]! <= from) lo = mid;
    else hi = mid - 1;
  }
  let b = lo;
  for (let i = from; i < to; i++) {
    while (b + 1 < job.blocks.length && job.blockFirst[b + 1]! <= i) b++;
    const start = i === job.blockFirst[b] ? 0 : job.ends[i - 1]!;
    if (!budget.take(job.ends[i]! - start)) break;
    const line = job.blocks[b]!.toString("utf8", start, job.ends[i]!);
    const f = job.flags[i]!;
    const stored: StoredLine =
      f & MARKER ? { line, stderr: (f & STDERR) !== 0, marker: true } : { line, stderr: (f & STDERR) !== 0 };
    const us = job.times[i]!;
    if (us > 0) {
      stored.time = fromMicros(us);
      if (f & SERVER_TIME) stored.serverTime = true;
    }
    out.push(stored);
  }
  return out;
}

/**
 * Stores an append's plan: head runs into the job's own lines, tail runs into their segments, drops. A dropped
 * segment's storage is reused by a segment this append starts; what is left unused goes to the pool at once, so
 * the job never holds more than its kept segments. O(lines + segments).
 */
function store(job: Job, plan: AppendPlan, pool: BlockPool): void {
  const spare: Lines[] = [];
  for (const { first } of plan.drop) {
    const i = job.tail.findIndex((s) => s.first === first);
    if (i >= 0) spare.push(job.tail.splice(i, 1)[0]!.lines);
  }
  for (const run of plan.runs) {
    if (run.segment === null) {
      keep(job, run.lines, pool);
      continue;
    }
    let segment = job.tail[job.tail.length - 1];
    if (segment === undefined || segment.first !== run.segment) {
      const lines = spare.pop();
      // Sized to the segment's share: its lines' text is within it (each counts 16 bytes more than its text).
      segment = {
        first: run.segment,
        lines: lines ? recycled(lines, pool) : newLines(Math.min(MAX_BLOCK, tailSegmentBytes(job.state.cut!))),
      };
      job.tail.push(segment);
    }
    keep(segment.lines, run.lines, pool);
  }
  for (const lines of spare) pool.give(lines.blocks);
}

/**
 * Gives a let-go job's blocks (its own and its tail's) to the pool and empties the job of its lines (its sections
 * stay), so a read still under way on it finds no lines rather than blocks another job now writes. O(blocks).
 */
function letGo(job: Job, pool: BlockPool): void {
  pool.give(job.blocks);
  for (const segment of job.tail) pool.give(segment.lines.blocks);
  Object.assign(job, newLines(), { tail: [], sections: job.sections });
}

/** Stored lines `[from, to)` of one run (the head, or the tail's segments). O(segments + lines + bytes). */
function runOf(job: Job, from: number, to: number, budget: PageBudget): StoredLine[] {
  const cut = job.state.cut;
  if (!cut || from < cut.at) return linesOf(job, from, Math.min(to, job.count), budget);
  const out: StoredLine[] = [];
  for (const segment of job.tail) {
    const end = segment.first + segment.lines.count;
    if (end <= from || segment.first >= to) continue;
    const a = Math.max(from, segment.first) - segment.first;
    const b = Math.min(to, end) - segment.first;
    const lines = linesOf(segment.lines, a, b, budget);
    for (const line of lines) out.push(line);
    // Cut short by the read's byte bound: the page ends here, with no gap.
    if (lines.length < b - a) break;
  }
  return out;
}

/**
 * Creates a JobLogStore that keeps everything in this process's memory.
 *
 * @example
 * const runner = createRunnerService(queue, { logs: createMemoryLogStore() });
 */
export function createMemoryLogStore(options: MemoryLogStoreOptions = {}): JobLogStore {
  const pooled = options.pooledBlocks ?? POOLED_BLOCKS;
  if (!Number.isInteger(pooled) || pooled < 0)
    throw new RangeError(`pooledBlocks must be an integer ≥ 0, not ${pooled}`);
  const jobs = new Map<string, Job>();
  // Newest-first order for list(): a page costs O(log jobs + page), not a scan.
  const order = new JobListIndex();
  const pool = new BlockPool(MAX_BLOCK, pooled);
  let closed = false;

  function live(): void {
    if (closed) throw new RunnerDepotError("UNAVAILABLE", "log store is closed");
  }

  // Reads entries by their fields only: handed received lines as entries (runner/protocol/received-line.ts).
  return readsLineEntries({
    async open(requestId, options = {}) {
      live();
      let job = jobs.get(requestId);
      if (!job) {
        job = newJob(newJobState(requestId, options.now ?? new Date(), options.expect ?? false, options.info));
        jobs.set(requestId, job);
        order.add(job.state);
      } else {
        applyOpen(job.state, options);
      }
      return cloneJobState(job.state);
    },
    async get(requestId) {
      live();
      const job = jobs.get(requestId);
      return job ? cloneJobState(job.state) : null;
    },
    async append(requestId, at, entries, now = new Date()) {
      live();
      let job = jobs.get(requestId);
      if (!job) {
        job = newJob(newJobState(requestId, now));
        // Only keep the new job when the append is accepted.
        const fresh = newEntries(job.state, at, entries);
        jobs.set(requestId, job);
        order.add(job.state);
        storeWithSections(job, planAppend(job.state, fresh, now), pool);
        return cloneJobState(job.state);
      }
      const fresh = newEntries(job.state, at, entries);
      storeWithSections(job, planAppend(job.state, fresh, now), pool);
      return cloneJobState(job.state);
    },
    async finish(requestId, result, options = {}) {
      live();
      let job = jobs.get(requestId);
      if (!job) {
        job = newJob(newJobState(requestId, new Date(result.endedAt)));
        applyFinish(job.state, result, options.at);
        jobs.set(requestId, job);
        order.add(job.state);
        return { state: cloneJobState(job.state), first: true };
      }
      const first = applyFinish(job.state, result, options.at);
      return { state: cloneJobState(job.state), first };
    },
    async read(requestId, from = 0, limit = Number.MAX_SAFE_INTEGER, options) {
      live();
      const job = jobs.get(requestId);
      if (!job) return [];
      const budget = pageBudget(options);
      if (!job.state.cut) return linesOf(job, Math.max(0, from), Math.min(job.count, from + limit), budget);
      return readKept(job.state, from, limit, async (a, b) => runOf(job, a, b, budget), budget);
    },
    async sections(requestId) {
      live();
      const job = jobs.get(requestId);
      if (!job) return null;
      return job.sections ? cloneSections(job.sections) : emptySections();
    },
    async stale(before) {
      live();
      const out: JobState[] = [];
      for (const job of jobs.values()) {
        if (job.state.status === "open" && Date.parse(job.state.lastSeenAt) < before.getTime())
          out.push(cloneJobState(job.state));
      }
      return out;
    },
    async list(query) {
      live();
      return order.list(query, (id) => {
        const job = jobs.get(id);
        return job ? cloneJobState(job.state) : null;
      });
    },
    async archivable(endedBefore, limit) {
      live();
      // O(jobs held): the memory store is for tests and small embeddings.
      const out: JobState[] = [];
      for (const job of jobs.values()) if (isArchivable(job.state, endedBefore)) out.push(job.state);
      out.sort((a, b) => Date.parse(a.result!.endedAt) - Date.parse(b.result!.endedAt));
      return out.slice(0, limit).map(cloneJobState);
    },
    async markArchived(requestId, archived) {
      live();
      const job = jobs.get(requestId);
      if (!job) return null;
      if (applyArchived(job.state, archived)) letGo(job, pool);
      return cloneJobState(job.state);
    },
    async prune(before) {
      live();
      let count = 0;
      for (const [id, job] of jobs) {
        if (isPrunable(job.state, before)) {
          jobs.delete(id);
          order.remove(job.state);
          letGo(job, pool);
          count++;
        }
      }
      return count;
    },
    async close() {
      closed = true;
      pool.clear();
    },
  });
}
