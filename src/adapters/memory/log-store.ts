/** In-memory JobLogStore: the default store of createRunnerService, for tests and embedding. */
import { RunnerDepotError } from "../../errors.js";
import { applyAppend, applyArchived, applyFinish, applyOpen, cloneJobState, isArchivable, isPrunable, newEntries, newJobState } from "../../runner/job-state.js";
import { JobListIndex } from "../../runner/job-list.js";
import type { JobLogStore, JobState, StoredLine } from "../../runner/ports.js";

/**
 * A job and its lines, kept as two parallel arrays (text, and a flag number: bit 0 stderr,
 * bit 1 marker) rather than an object per line: a long log is then one string per line
 * plus packed small integers, which the garbage collector copies and scans far less
 * than an object per line. Objects are made only for the lines a read returns.
 */
interface Job {
  state: JobState;
  texts: string[];
  flags: number[];
}

const STDERR = 1;
const MARKER = 2;

/** Appends the lines to the job's arrays. O(lines). */
function keep(job: Job, lines: readonly StoredLine[]): void {
  for (const line of lines) {
    job.texts.push(line.line);
    job.flags.push((line.stderr ? STDERR : 0) | (line.marker ? MARKER : 0));
  }
}

/** The stored line at `i` as the port's object (marker only when set, as the service writes it). */
function lineAt(job: Job, i: number): StoredLine {
  const f = job.flags[i]!;
  return f & MARKER ? { line: job.texts[i]!, stderr: (f & STDERR) !== 0, marker: true } : { line: job.texts[i]!, stderr: (f & STDERR) !== 0 };
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

  return {
    async open(requestId, options = {}) {
      live();
      let job = jobs.get(requestId);
      if (!job) {
        job = { state: newJobState(requestId, options.now ?? new Date(), options.expect ?? false, options.info), texts: [], flags: [] };
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
        job = { state: newJobState(requestId, now), texts: [], flags: [] };
        // Only keep the new job when the append is accepted.
        const fresh = newEntries(job.state, at, entries);
        jobs.set(requestId, job);
        order.add(job.state);
        keep(job, applyAppend(job.state, fresh, now));
        return cloneJobState(job.state);
      }
      const fresh = newEntries(job.state, at, entries);
      keep(job, applyAppend(job.state, fresh, now));
      return cloneJobState(job.state);
    },
    async finish(requestId, result, options = {}) {
      live();
      let job = jobs.get(requestId);
      if (!job) {
        job = { state: newJobState(requestId, new Date(result.endedAt)), texts: [], flags: [] };
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
      const out: StoredLine[] = [];
      const to = Math.min(job.texts.length, from + limit);
      for (let i = Math.max(0, from); i < to; i++) out.push(lineAt(job, i));
      return out;
    },
    async stale(before) {
      live();
      const out: JobState[] = [];
      for (const job of jobs.values()) {
        if (job.state.status === "open" && Date.parse(job.state.lastSeenAt) < before.getTime()) out.push(cloneJobState(job.state));
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
      if (applyArchived(job.state, archived)) {
        job.texts = [];
        job.flags = [];
      }
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
  };
}
