/**
 * What the fs log store holds of its jobs in memory (log-store.ts): a job's state as its state file keeps it, the
 * job with its open-file handle, tail and lock, and what every store on one directory shares in a process.
 */
import { cloneJobState } from "../../runner/service/job-state.js";
import { JobListIndex } from "../../runner/service/job-list.js";
import type { JobState, LogSections } from "../../runner/ports.js";
import { createDirectorySync } from "./durable.js";
import { OpenLogs, type LogHandle } from "./log-descriptors.js";
import type { TailFiles, TailRecord } from "./log-tail-file.js";

/** A job's state as its state file holds it. */
export interface Persisted extends JobState, TailRecord {
  /** Valid bytes of the log file; anything past it is a torn write. */
  fileBytes: number;
  /**
   * The job's sections (log-sections.ts), in the state file so they commit with the lines they describe; absent in
   * state files written before sections existed (read as none) and while the log has none. Never mutated (each
   * change is a new record), so the shallow state copies share it safely.
   */
  sections?: LogSections;
}

/** A job held in memory; it is also its log file's handle in the open-files pool. */
export interface Job extends LogHandle {
  state: Persisted;
  /** Byte offset of every STRIDE-th stored line (log-read.ts), built on first read. */
  index: number[] | null;
  /** A cut log's tail files (log-tail-file.ts). */
  tail: TailFiles;
  chain: Promise<unknown>;
}

/** What every store on one directory shares in this process. */
export interface Backend {
  jobs: Map<string, Job>;
  /** Newest-first order for list(): a page costs O(log jobs + page). */
  order: JobListIndex;
  loaded: Promise<void> | null;
  refs: number;
  createChain: Promise<unknown>;
  /** The log files kept open between appends (log-descriptors.ts). */
  openLogs: OpenLogs;
  /** fsyncs of the jobs directory, shared by concurrent appends (durable.ts). */
  dirs: ReturnType<typeof createDirectorySync>;
}

const backends = new Map<string, Backend>();

/**
 * The backend of directory `key` (a resolved path) in this process, made on first use; the caller counts itself in
 * `refs`. O(1).
 *
 * @example
 * const backend = sharedBackend(resolve(dir));
 * backend.refs++;
 */
export function sharedBackend(key: string): Backend {
  let shared = backends.get(key);
  if (!shared) {
    const fresh: Backend = {
      jobs: new Map(),
      order: new JobListIndex(),
      loaded: null,
      refs: 0,
      createChain: Promise.resolve(),
      openLogs: new OpenLogs(),
      dirs: createDirectorySync({ sync: true, isClosed: () => fresh.refs === 0 }),
    };
    shared = fresh;
    backends.set(key, shared);
  }
  return shared;
}

/** Forgets directory `key`'s backend when it is still `backend` (its last store closed). O(1). */
export function releaseBackend(key: string, backend: Backend): boolean {
  if (backends.get(key) !== backend) return false;
  backends.delete(key);
  return true;
}

/** The state as the store's callers see it: without the file bookkeeping. O(state). */
export function publicState(state: Persisted): JobState {
  const { fileBytes: _bytes, sections: _sections, tailFiles: _files, tailRing: _ring, ...rest } = state;
  return cloneJobState(rest);
}
