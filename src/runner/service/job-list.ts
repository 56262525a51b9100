/**
 * Listing recent jobs: the summary a job list shows (console, `runner-depot jobs`), the
 * opaque cursor that pages through it, and the ordered index the memory and fs log
 * stores keep so a page costs O(log jobs + page) instead of a scan of every job held.
 *
 * Order: newest first by the time the store first heard of the job (`createdAt`), ties
 * broken by request ID, both descending. The key never changes during a job's life, so a
 * cursor stays valid while jobs are added, end or are pruned.
 */
import { RunnerDepotError } from "../../errors.js";
import type { JobListQuery, JobOutcome, JobState, JobStatus } from "../ports.js";

/** One row of a job list. */
export interface JobSummary {
  requestId: string;
  /** `open` while running (or waiting for its VM), else how it ended. */
  status: JobStatus;
  /** The published outcome, or null while the job is open. */
  outcome: JobOutcome | null;
  /** The runner's exit code (-1 for lost and cancelled), or null while open. */
  exitCode: number | null;
  /** The runner's success flag, or null while open. */
  success: boolean | null;
  /** From the result, else from what the host registered (`expectJob` info); "" when unknown. */
  repoUrl: string;
  commitSha: string;
  /** Lines the runner sent, by stream. */
  lines: { stdout: number; stderr: number };
  /** Lines in the stored log (markers included): the log's length for a viewer. */
  storedLines: number;
  /** UTF-8 bytes of stored output. */
  storedBytes: number;
  /** True when the job's log reached its cap. */
  logTruncated: boolean;
  /** True when the host registered the job with `expectJob`. */
  expected: boolean;
  /** When the store first heard of the job (registration or first item). */
  createdAt: string;
  /** First item, or null when none arrived. */
  startedAt: string | null;
  /** The result's time, or null while open. */
  endedAt: string | null;
  /** Last item or registration. */
  lastSeenAt: string;
  /** endedAt − startedAt in ms for an ended job that started; null otherwise. */
  durationMs: number | null;
}

/** Options of `RunnerService.listJobs`. */
export interface ListJobsOptions {
  /** Only jobs in these states (one or several); default all. */
  status?: JobStatus | readonly JobStatus[];
  /** Page size, 1 to 500; default 50. */
  limit?: number;
  /** The `next` of the previous page. */
  cursor?: string;
}

/** One page of a job list. */
export interface JobPage {
  jobs: JobSummary[];
  /** Cursor of the next (older) page, or null when this is the last. */
  next: string | null;
}

/** Largest page `listJobs` returns. */
const MAX_JOB_PAGE = 500;
/** Page size when none is asked for. */
const DEFAULT_JOB_PAGE = 50;

const STATUSES: readonly JobStatus[] = ["open", "finished", "cancelled", "lost"];
const ISO = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

/** The time a job's list position is keyed on (states written before `createdAt` existed fall back). */
export function createdAtOf(state: JobState): string {
  return state.createdAt ?? state.startedAt ?? state.lastSeenAt;
}

/** The list row of a job state. */
export function summarizeJob(state: JobState): JobSummary {
  const result = state.result;
  const endedAt = result?.endedAt ?? null;
  const startedAt = state.startedAt ?? result?.startedAt ?? null;
  const info = state.info;
  return {
    requestId: state.requestId,
    status: state.status,
    outcome: result?.outcome ?? null,
    exitCode: result ? result.exitCode : null,
    success: result ? result.success : null,
    repoUrl: result?.repoUrl || (typeof info.repoUrl === "string" ? info.repoUrl : ""),
    commitSha: result?.commitSha || (typeof info.commitSha === "string" ? info.commitSha : ""),
    lines: { ...(result?.lines ?? state.lines) },
    storedLines: state.storedLines,
    storedBytes: state.storedBytes,
    logTruncated: state.logTruncated,
    expected: state.expected,
    createdAt: createdAtOf(state),
    startedAt,
    endedAt,
    lastSeenAt: state.lastSeenAt,
    durationMs: endedAt && startedAt ? Math.max(0, Date.parse(endedAt) - Date.parse(startedAt)) : null,
  };
}

/**
 * Checks and normalises listJobs options into a store query (one more row than the page,
 * so the service knows whether a next page exists).
 */
export function toJobListQuery(options: ListJobsOptions): JobListQuery & { pageSize: number } {
  const limit = options.limit ?? DEFAULT_JOB_PAGE;
  if (!Number.isInteger(limit) || limit < 1 || limit > MAX_JOB_PAGE) {
    throw new RunnerDepotError("INVALID_ARGUMENT", `limit must be an integer from 1 to ${MAX_JOB_PAGE}`);
  }
  let status: JobStatus[] | undefined;
  if (options.status !== undefined) {
    const given = typeof options.status === "string" ? [options.status] : [...options.status];
    for (const s of given) {
      if (!STATUSES.includes(s))
        throw new RunnerDepotError("INVALID_ARGUMENT", `status must be one of ${STATUSES.join(", ")}`);
    }
    status = [...new Set(given)];
    if (status.length === 0 || status.length === STATUSES.length) status = undefined;
  }
  const before = options.cursor === undefined ? undefined : decodeJobCursor(options.cursor);
  return { status, before, limit: limit + 1, pageSize: limit };
}

/** The cursor after `state`: base64url of `createdAt|requestId`. */
export function encodeJobCursor(state: Pick<JobSummary, "createdAt" | "requestId">): string {
  return Buffer.from(`${state.createdAt}|${state.requestId}`, "utf8").toString("base64url");
}

/** Parses a cursor; anything but one this module made is INVALID_ARGUMENT. */
export function decodeJobCursor(cursor: string): { createdAt: string; requestId: string } {
  // Bounded before decoding: a cursor is 62 bytes of base64url.
  if (cursor.length > 128 || !/^[A-Za-z0-9_-]+$/.test(cursor))
    throw new RunnerDepotError("INVALID_ARGUMENT", "malformed job cursor");
  const [createdAt, requestId, extra] = Buffer.from(cursor, "base64url").toString("utf8").split("|");
  if (
    extra !== undefined ||
    !createdAt ||
    !requestId ||
    !ISO.test(createdAt) ||
    !UUID.test(requestId) ||
    Number.isNaN(Date.parse(createdAt))
  ) {
    throw new RunnerDepotError("INVALID_ARGUMENT", "malformed job cursor");
  }
  return { createdAt, requestId };
}

/** -1, 0, 1 comparing list keys ascending (ISO strings of one format compare as text). */
function compareKeys(a: { createdAt: string; requestId: string }, b: { createdAt: string; requestId: string }): number {
  if (a.createdAt !== b.createdAt) return a.createdAt < b.createdAt ? -1 : 1;
  return a.requestId < b.requestId ? -1 : a.requestId > b.requestId ? 1 : 0;
}

/**
 * The list order of an in-process store: job keys sorted ascending, searched from the
 * newest end. add: O(log n) search plus an array insert (a memmove; new jobs land at the
 * end); remove: the same; list: O(log n + rows examined).
 */
export class JobListIndex {
  private readonly keys: Array<{ createdAt: string; requestId: string }> = [];

  /** Adds a job's key (no-op when present). */
  add(state: JobState): void {
    const key = { createdAt: createdAtOf(state), requestId: state.requestId };
    const at = this.search(key);
    if (at < this.keys.length && compareKeys(this.keys[at]!, key) === 0) return;
    this.keys.splice(at, 0, key);
  }

  /** Removes a job's key. */
  remove(state: JobState): void {
    const key = { createdAt: createdAtOf(state), requestId: state.requestId };
    const at = this.search(key);
    if (at < this.keys.length && compareKeys(this.keys[at]!, key) === 0) this.keys.splice(at, 1);
  }

  /**
   * States newest first, from just below `query.before`; `lookup` gives a job's state
   * (null skips it). With a status filter the rows examined include the skipped ones.
   */
  list<S extends JobState>(query: JobListQuery, lookup: (requestId: string) => S | null): S[] {
    const out: S[] = [];
    let i = query.before ? this.search(query.before) - 1 : this.keys.length - 1;
    for (; i >= 0 && out.length < query.limit; i--) {
      const state = lookup(this.keys[i]!.requestId);
      if (!state) continue;
      if (query.status && !query.status.includes(state.status)) continue;
      out.push(state);
    }
    return out;
  }

  /** First index whose key is ≥ `key`. */
  private search(key: { createdAt: string; requestId: string }): number {
    let lo = 0;
    let hi = this.keys.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (compareKeys(this.keys[mid]!, key) < 0) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }
}
