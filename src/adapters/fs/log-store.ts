/**
 * Filesystem JobLogStore: one append-only log file and one state file per job. Lines are written in one
 * positional write per append and synced once; the state file is replaced atomically (write, fsync, rename),
 * and it says how many bytes of the log file are valid, so a crash between the two leaves the job consistent.
 * One process owns a directory at a time (several replicas: use the PostgreSQL store).
 * Why: docs/decisions/runner-server.md, "log-store.ts (fs): a log file and a state file per job".
 */
import { rm } from "node:fs/promises";
import { join, resolve } from "node:path";
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
import { readKept, type AppendPlan } from "../../runner/service/log-tail.js";
import { pageBudget, type PageBudget } from "../../runner/service/page-budget.js";
import { JobListIndex } from "../../runner/service/job-list.js";
import { cloneSections, emptySections, foldSections } from "../../runner/service/log-sections.js";
import type { JobLogStore, JobState, StoredLine } from "../../runner/ports.js";
import { readsLineEntries } from "../../runner/protocol/received-line.js";
import { publicState, releaseBackend, sharedBackend, type Job, type Persisted } from "./log-jobs.js";
import { commitStateFile, scanJobsDir } from "./log-state-file.js";
import { TailFiles } from "./log-tail-file.js";
import { extendIndex, readLines, scanIndex } from "./log-read.js";
import { findLines, recordFinder } from "./log-find.js";
import { encodeRecords, timeBase } from "./log-records.js";

export { MAX_OPEN_LOGS } from "./log-descriptors.js";

/** Options of {@link createFsLogStore}. */
export interface FsLogStoreOptions {
  /** Sync data to disk at the end of each append and state change; default true. */
  fsync?: boolean;
}

/** Jobs prune() removes at once (their directory fsyncs shared). */
const PRUNE_GROUP = 64;

/**
 * Creates a JobLogStore in `dir` (created when missing); a new store on the same
 * directory sees the same jobs, lines and results.
 *
 * @example
 * const runner = createRunnerService(queue, { logs: createFsLogStore("/var/lib/orchestrator/logs") });
 */
export function createFsLogStore(dir: string, options: FsLogStoreOptions = {}): JobLogStore {
  const key = resolve(dir);
  const backend = sharedBackend(key);
  backend.refs++;
  const sync = options.fsync ?? true;
  const jobsDir = join(dir, "jobs");
  // Stores on one directory in this process share their jobs, so they never race on a file.
  const jobs = backend.jobs;
  let closed = false;

  const logPath = (id: string) => join(jobsDir, `${id}.log`);
  const tails = { jobsDir, openLogs: backend.openLogs, sync };
  const stateFiles = { jobsDir, sync, dirs: backend.dirs };
  const statePath = (id: string) => join(jobsDir, `${id}.json`);
  const newJob = (id: string, state: Persisted): Job => ({
    id,
    path: logPath(id),
    state,
    index: null,
    tail: new TailFiles(tails, id),
    chain: Promise.resolve(),
  });
  const closeLog = (job: Job) => backend.openLogs.close(job);

  function load(): Promise<void> {
    if (backend.loaded) return backend.loaded;
    const loading = scanJobsDir<Persisted>(
      stateFiles,
      (id, state) => {
        jobs.set(id, newJob(id, state));
        backend.order.add(state);
      },
      (id) => jobs.get(id)?.state,
    );
    backend.loaded = loading;
    // A failed open (a directory fsync's EIO, a file it could not read) fails the calls
    // waiting for it, and the next call opens again: cached, it failed every call until
    // the process restarted. Nothing ran on what it had loaded (every call waits for it).
    loading.catch(() => {
      if (backend.loaded !== loading) return;
      backend.loaded = null;
      jobs.clear();
      backend.order = new JobListIndex();
    });
    return loading;
  }

  /** Runs `fn` after every earlier operation on the job. */
  async function serial<T>(id: string, fn: (job: Job | undefined) => Promise<T>): Promise<T> {
    if (closed) throw new RunnerDepotError("UNAVAILABLE", "log store is closed");
    await load();
    // Checked again after the wait: close() takes the chains it waits for when it is called,
    // so an operation chained after that would run (and open a log file) behind its back.
    if (closed) throw new RunnerDepotError("UNAVAILABLE", "log store is closed");
    const key = id;
    let job = jobs.get(key);
    if (!job) {
      // A placeholder carries the chain until the job exists.
      const run = fn(undefined);
      return run;
    }
    const run = job.chain.then(() => fn(jobs.get(key)));
    job.chain = run.catch(() => undefined);
    return run;
  }

  // Creation is serialised per directory, so two first appends never race on one job.
  async function withJob<T>(
    id: string,
    create: Date | false,
    fn: (job: Job) => Promise<T>,
    missing: () => T | Promise<T>,
  ): Promise<T> {
    await load();
    if (!jobs.has(id)) {
      if (!create) return missing();
      const made = backend.createChain.then(async () => {
        if (jobs.has(id)) return;
        const state: Persisted = { ...newJobState(id, create), fileBytes: 0 };
        await writeState(state);
        jobs.set(id, newJob(id, state));
        backend.order.add(state);
      });
      backend.createChain = made.catch(() => undefined);
      await made;
    }
    return serial(id, (job) => fn(job!));
  }

  async function writeState(state: Persisted): Promise<void> {
    await commitState(state, Promise.resolve());
  }

  /** Replaces the job's state file with `state` once `before` (the log's write and sync) has succeeded. */
  const commitState = (state: Persisted, before: Promise<void>) => commitStateFile(stateFiles, state, before);

  /**
   * An append to a cut log (log-tail.ts): head lines to the log file, tail lines to the tail's ring (log-tail-file.ts;
   * all written and synced while the state is), then the state naming the kept segments; what it no longer names
   * goes after. A crash before the state's rename leaves the old state, which names none of the bytes written.
   * O(bytes + segments).
   */
  async function appendCut(job: Job, next: Persisted, plan: AppendPlan): Promise<JobState> {
    const base = timeBase(next.startedAt);
    const writes: Promise<void>[] = [];
    const head = plan.runs.find((run) => run.segment === null);
    let headBytes = 0;
    if (head) {
      const { bytes, sizes } = encodeRecords(head.lines, base);
      const at = next.fileBytes;
      next.fileBytes += bytes.length;
      headBytes = bytes.length;
      writes.push(backend.openLogs.write(job, bytes, at, sync, at === 0));
      if (job.index) extendIndex(job.index, at, head.first, sizes);
    }
    writes.push(job.tail.write(job.state, next, plan.runs, base, headBytes));
    try {
      await commitState(
        next,
        Promise.all(writes).then(() => undefined),
      );
    } catch (error) {
      // A failed write leaves indexes that may count records the state does not: rebuilt on the next read.
      job.index = null;
      job.tail.failed(job.state);
      throw error;
    }
    const prev = job.state;
    job.state = next;
    await job.tail.committed(prev, next);
    return publicState(next);
  }

  /** Stored lines `[from, to)` of one run of a cut log: the head's log file, or the tail's files. */
  async function readRun(job: Job, from: number, to: number, budget: PageBudget): Promise<StoredLine[]> {
    const state = job.state;
    const base = timeBase(state.startedAt);
    if (!state.cut || from < state.cut.at) {
      job.index ??= await scanIndex(job.path, state.fileBytes);
      return readLines(job.path, job.index, state.fileBytes, from, to - from, base, undefined, budget);
    }
    return job.tail.readRun(state, from, to, base, budget);
  }

  /**
   * Removes a prunable job: its state file, then (once that removal is on disk) its log file.
   * Why: docs/decisions/runner-server.md, "log-store.ts: createFsLogStore.pruneJob".
   */
  async function pruneJob(id: string, job: Job, before: Date): Promise<boolean> {
    if (!isPrunable(job.state, before) || jobs.get(id) !== job) return false;
    await rm(statePath(id), { force: true });
    if (sync) await backend.dirs.fsyncDir(jobsDir);
    closeLog(job);
    await rm(logPath(id), { force: true });
    await job.tail.remove(job.state);
    jobs.delete(id);
    backend.order.remove(job.state);
    return true;
  }

  // Reads entries by their fields only: handed received lines as entries (runner/protocol/received-line.ts).
  return readsLineEntries({
    async open(requestId, opts = {}) {
      return withJob(
        requestId,
        opts.now ?? new Date(),
        async (job) => {
          const next = cloneJobState(job.state);
          if (applyOpen(next, opts)) {
            await writeState(next);
            job.state = next;
          }
          return publicState(job.state);
        },
        () => null as never,
      );
    },
    async get(requestId) {
      if (closed) throw new RunnerDepotError("UNAVAILABLE", "log store is closed");
      await load();
      const job = jobs.get(requestId);
      return job ? publicState(job.state) : null;
    },
    async append(requestId, at, entries, now = new Date()) {
      return withJob(
        requestId,
        now,
        async (job) => {
          const next = cloneJobState(job.state);
          const fresh = newEntries(next, at, entries);
          if (fresh.length === 0) return publicState(job.state);
          const plan = planAppend(next, fresh, now);
          // Sections fold over the runs in position order, into the state written with them.
          for (const run of plan.runs) {
            const sections = foldSections(next.sections, run.lines, run.first);
            if (sections) next.sections = sections;
          }
          if (next.cut || job.state.cut) return appendCut(job, next, plan);
          const stored = plan.runs[0]?.lines ?? [];
          if (stored.length > 0) {
            // Each record encoded once (O(bytes)); the index below reuses their sizes.
            const { bytes, sizes } = encodeRecords(stored, timeBase(next.startedAt));
            next.fileBytes = job.state.fileBytes + bytes.length;
            // The state file is written and synced while the log is: it is renamed over
            // the old one only once the log's bytes are on disk.
            const at = job.state.fileBytes;
            await commitState(next, backend.openLogs.write(job, bytes, at, sync, at === 0));
            // Keep the read index current without rescanning.
            if (job.index) extendIndex(job.index, at, job.state.storedLines, sizes);
          } else {
            await writeState(next);
          }
          job.state = next;
          return publicState(next);
        },
        () => null as never,
      );
    },
    async finish(requestId, result, opts = {}) {
      return withJob(
        requestId,
        new Date(result.endedAt),
        async (job) => {
          const next = cloneJobState(job.state);
          const first = applyFinish(next, result, opts.at);
          if (first) {
            await writeState(next);
            job.state = next;
          }
          // A finished job takes no more lines: its descriptors are not kept.
          closeLog(job);
          job.tail.close();
          return { state: publicState(job.state), first };
        },
        () => null as never,
      );
    },
    async read(requestId, from = 0, limit = Number.MAX_SAFE_INTEGER, options) {
      const budget = pageBudget(options);
      return withJob(
        requestId,
        false,
        async (job) => {
          const total = job.state.storedLines;
          // An archived job's lines are in its archive, no longer here.
          if (from >= total || limit <= 0 || job.state.archived) return [];
          if (job.state.cut) return readKept(job.state, from, limit, (a, b) => readRun(job, a, b, budget), budget);
          job.index ??= await scanIndex(job.path, job.state.fileBytes);
          const base = timeBase(job.state.startedAt);
          return readLines(job.path, job.index, job.state.fileBytes, from, limit, base, undefined, budget);
        },
        () => [],
      );
    },
    async sections(requestId) {
      if (closed) throw new RunnerDepotError("UNAVAILABLE", "log store is closed");
      await load();
      const job = jobs.get(requestId);
      if (!job) return null;
      return job.state.sections ? cloneSections(job.state.sections) : emptySections();
    },
    async findLines(requestId, needle, from, limits) {
      const finder = recordFinder(needle, limits.ignoreCase === true);
      if (finder === null) return null;
      // The job's lock is held for a snapshot only, not for the scan (up to 32 MiB): appends go on meanwhile,
      // past the snapshot's end, and add to the index only offsets past it.
      const snapshot = await withJob(
        requestId,
        false,
        async (job) => {
          // Archived, or cut (its tail lives in segment files): the read path numbers those lines.
          if (job.state.archived || job.state.cut) return null;
          job.index ??= await scanIndex(job.path, job.state.fileBytes);
          const { fileBytes, storedLines, startedAt } = job.state;
          return { path: job.path, index: job.index, fileBytes, storedLines, base: timeBase(startedAt) };
        },
        () => null,
      );
      if (snapshot === null) return null;
      if (from >= snapshot.storedLines || limits.maxHits <= 0)
        return { hits: [], next: snapshot.storedLines, bytes: 0 };
      try {
        const { path, index, fileBytes, base } = snapshot;
        return await findLines(path, index, fileBytes, from, finder, limits, base);
      } catch (error) {
        // Archived or pruned since the snapshot (its file removed): the caller reads the lines where they are now.
        if ((error as NodeJS.ErrnoException).code === "ENOENT") return null;
        throw error;
      }
    },
    async stale(before) {
      if (closed) throw new RunnerDepotError("UNAVAILABLE", "log store is closed");
      await load();
      const out: JobState[] = [];
      for (const job of jobs.values()) {
        if (job.state.status === "open" && Date.parse(job.state.lastSeenAt) < before.getTime())
          out.push(publicState(job.state));
      }
      return out;
    },
    async list(query) {
      if (closed) throw new RunnerDepotError("UNAVAILABLE", "log store is closed");
      await load();
      return backend.order.list(query, (id) => {
        const job = jobs.get(id);
        return job ? publicState(job.state) : null;
      });
    },
    async archivable(endedBefore, limit) {
      if (closed) throw new RunnerDepotError("UNAVAILABLE", "log store is closed");
      await load();
      // O(jobs held), like stale(): one process owns the directory and holds every state.
      const out: Persisted[] = [];
      for (const job of jobs.values()) if (isArchivable(job.state, endedBefore)) out.push(job.state);
      out.sort((a, b) => Date.parse(a.result!.endedAt) - Date.parse(b.result!.endedAt));
      return out.slice(0, limit).map(publicState);
    },
    async markArchived(requestId, archived) {
      return withJob(
        requestId,
        false,
        async (job) => {
          const next = cloneJobState(job.state);
          if (!applyArchived(next, archived)) return publicState(job.state);
          // State first (it says the log holds 0 valid bytes), then the log goes: a crash
          // between the two leaves a file that load() truncates to nothing.
          next.fileBytes = 0;
          delete next.tailFiles;
          delete next.tailRing;
          const prev = job.state;
          await writeState(next);
          job.state = next;
          job.index = null;
          closeLog(job);
          await rm(logPath(requestId), { force: true });
          await job.tail.remove(prev);
          return publicState(next);
        },
        () => null,
      );
    },
    async prune(before) {
      if (closed) throw new RunnerDepotError("UNAVAILABLE", "log store is closed");
      await load();
      let count = 0;
      const due = [...jobs].filter(([, job]) => isPrunable(job.state, before));
      // A group at a time, so the jobs of a group share their directory fsyncs (durable.ts's
      // group commit): O(due / PRUNE_GROUP) fsyncs, not one per job.
      for (let i = 0; i < due.length; i += PRUNE_GROUP) {
        const group = due.slice(i, i + PRUNE_GROUP);
        const outcomes = await Promise.allSettled(
          group.map(([id, job]) => serial(id, () => pruneJob(id, job, before))),
        );
        for (const outcome of outcomes) {
          if (outcome.status === "rejected") throw outcome.reason;
          if (outcome.value) count++;
        }
      }
      return count;
    },
    async close() {
      if (closed) return;
      closed = true;
      // A job being created is on the creation chain, not yet on a job's.
      await Promise.allSettled([backend.createChain, ...[...jobs.values()].map((job) => job.chain)]);
      if (--backend.refs === 0 && releaseBackend(key, backend)) {
        backend.openLogs.closeAll();
        await backend.dirs.close();
      }
    },
  });
}
