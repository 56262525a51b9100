/** In-memory JobLogStore: the default store of createRunnerService, for tests and embedding. */
import { RunnerDepotError } from "../../errors.js";
import { applyAppend, applyArchived, applyFinish, applyOpen, cloneJobState, isArchivable, isPrunable, newEntries, newJobState } from "../../runner/job-state.js";
import { JobListIndex } from "../../runner/job-list.js";
import type { JobLogStore, JobState, StoredLine } from "../../runner/ports.js";

interface Job {
  state: JobState;
  lines: StoredLine[];
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
        job = { state: newJobState(requestId, options.now ?? new Date(), options.expect ?? false, options.info), lines: [] };
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
        job = { state: newJobState(requestId, now), lines: [] };
        // Only keep the new job when the append is accepted.
        const fresh = newEntries(job.state, at, entries);
        jobs.set(requestId, job);
        order.add(job.state);
        for (const line of applyAppend(job.state, fresh, now)) job.lines.push({ ...line });
        return cloneJobState(job.state);
      }
      const fresh = newEntries(job.state, at, entries);
      for (const line of applyAppend(job.state, fresh, now)) job.lines.push({ ...line });
      return cloneJobState(job.state);
    },
    async finish(requestId, result, options = {}) {
      live();
      let job = jobs.get(requestId);
      if (!job) {
        job = { state: newJobState(requestId, new Date(result.endedAt)), lines: [] };
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
      return job.lines.slice(from, from + limit).map((line) => ({ ...line }));
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
      if (applyArchived(job.state, archived)) job.lines = [];
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
