/** In-memory JobLogStore: the default store of createRunnerService, for tests and embedding. */
import { RunnerDepotError } from "../../errors.js";
import {
  applyAppend,
  applyArchived,
  applyFinish,
  applyOpen,
  cloneJobState,
  isArchivable,
  isPrunable,
  newEntries,
  newJobState,
} from "../../runner/service/job-state.js";
import { JobListIndex } from "../../runner/service/job-list.js";
import { cloneSections, emptySections, foldSections } from "../../runner/service/log-sections.js";
import type { JobLogStore, JobState, LogSections, StoredLine } from "../../runner/ports.js";
import { ReceivedLine, readsLineEntries } from "../../runner/protocol/received-line.js";
import { fromMicros, toMicros } from "../../runner/protocol/line-time.js";

/**
 * A job and its lines, kept as bytes: the lines' UTF-8 back to back in blocks, and per line its end offset in its
 * block, a flag byte (bit 0 stderr, bit 1 marker, bit 2 server time) and its time (µs, 0 = none), in typed arrays.
 * Why: docs/decisions/runner-server.md, "log-store.ts: Job".
 */
interface Job {
  state: JobState;
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
}

const STDERR = 1;
const MARKER = 2;
const SERVER_TIME = 4;
/**
 * First block of a job; each next one doubles, up to MAX_BLOCK (so a short job costs little, a long one few blocks).
 */
const FIRST_BLOCK = 4096;
const MAX_BLOCK = 1024 * 1024;

function newJob(state: JobState): Job {
  return {
    state,
    blocks: [],
    blockFirst: [],
    used: 0,
    ends: new Uint32Array(64),
    flags: new Uint8Array(64),
    times: new Float64Array(64),
    count: 0,
    sections: undefined,
  };
}

/** Room for `bytes` more in the last block (a new block when it is full). Amortised O(1). */
function room(job: Job, bytes: number): Buffer {
  const last = job.blocks[job.blocks.length - 1];
  if (last !== undefined && last.length - job.used >= bytes) return last;
  const size = Math.max(bytes, Math.min(MAX_BLOCK, last === undefined ? FIRST_BLOCK : last.length * 2));
  const block = Buffer.allocUnsafe(size);
  job.blocks.push(block);
  job.blockFirst.push(job.count);
  job.used = 0;
  return block;
}

/** Appends the lines to the job's blocks. O(lines + bytes). */
function keep(job: Job, lines: readonly StoredLine[]): void {
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
      const block = room(job, n);
      // Buffer#copy: ~10 ns for a 100-byte line on Node 22, a JS byte loop ~100 ns.
      end = job.used + line.buf.copy(block, job.used, line.start, line.end);
    } else {
      if (line.marker) flags |= MARKER;
      const text = line.line;
      const block = room(job, text.length * 3);
      end = job.used + block.write(text, job.used, "utf8");
    }
    job.used = end;
    job.ends[job.count] = end;
    job.flags[job.count] = flags;
    job.times[job.count] = toMicros(line.time ?? 0);
    job.count++;
  }
}

/** Keeps `lines` and folds them into the job's sections. O(lines), plus O(sections) when one holds a marker. */
function keepWithSections(job: Job, lines: readonly StoredLine[]): void {
  const first = job.count;
  keep(job, lines);
  job.sections = foldSections(job.sections, lines, first);
}

/**
 * The stored lines `[from, to)` as the port's objects (marker only when set, as the service writes it). O(lines +
 * bytes).
 */
function linesOf(job: Job, from: number, to: number): StoredLine[] {
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
 * Creates a JobLogStore that keeps everything in this process's memory.
 *
 * @example
 * const runner = createRunnerService(queue, { logs: createMemoryLogStore() });
 */
export function createMemoryLogStore(): JobLogStore {
  const jobs = new Map<string, Job>();
  // Newest-first order for list(): a page costs O(log jobs + page), not a scan.
  const order = new JobListIndex();
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
        keepWithSections(job, applyAppend(job.state, fresh, now));
        return cloneJobState(job.state);
      }
      const fresh = newEntries(job.state, at, entries);
      keepWithSections(job, applyAppend(job.state, fresh, now));
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
    async read(requestId, from = 0, limit = Number.MAX_SAFE_INTEGER) {
      live();
      const job = jobs.get(requestId);
      if (!job) return [];
      return linesOf(job, Math.max(0, from), Math.min(job.count, from + limit));
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
      if (applyArchived(job.state, archived)) Object.assign(job, newJob(job.state), { sections: job.sections });
      return cloneJobState(job.state);
    },
    async prune(before) {
      live();
      let count = 0;
      for (const [id, job] of jobs) {
        if (isPrunable(job.state, before)) {
          jobs.delete(id);
          order.remove(job.state);
          count++;
        }
      }
      return count;
    },
    async close() {
      closed = true;
    },
  });
}
