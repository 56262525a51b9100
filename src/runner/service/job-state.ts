/**
 * The bookkeeping every JobLogStore shares: how an append or a finish changes a job's
 * state. Stores keep the data; these functions keep the rules in one place.
 */
import { RunnerDepotError } from "../../errors.js";
import type { ArchivedLog, JobInfo, JobResult, JobState, LogCut, LogEntry, StoredLine } from "../ports.js";
import { keptLines, planCutAppend, type AppendPlan } from "./log-tail.js";
import { ReceivedLine } from "../protocol/received-line.js";

/** A fresh open job. */
export function newJobState(requestId: string, now: Date, expect = false, info: JobInfo = {}): JobState {
  return {
    requestId,
    status: "open",
    committed: 0,
    storedLines: 0,
    storedBytes: 0,
    lines: { stdout: 0, stderr: 0 },
    logTruncated: false,
    expected: expect,
    info: { ...info },
    createdAt: now.toISOString(),
    startedAt: null,
    lastSeenAt: now.toISOString(),
    result: null,
  };
}

/** A deep copy, so callers never hold a store's live object (by hand: structuredClone is slow on this path). */
export function cloneJobState<S extends JobState>(state: S): S {
  const copy = {
    ...state,
    lines: { ...state.lines },
    info: cloneInfo(state.info),
    result: state.result && { ...state.result, lines: { ...state.result.lines } },
  };
  if (state.archived) copy.archived = cloneArchived(state.archived);
  if (state.cut) copy.cut = cloneCut(state.cut);
  return copy;
}

/** A copy of a cut (its segments too). O(segments). */
export function cloneCut(cut: LogCut): LogCut {
  return { ...cut, segments: cut.segments.map((s) => ({ ...s })) };
}

function cloneArchived(archived: ArchivedLog): ArchivedLog {
  const copy = { ...archived };
  if (archived.cut) copy.cut = cloneCut(archived.cut);
  return copy;
}

function cloneInfo(info: JobInfo): JobInfo {
  // Host info is usually flat strings; anything nested is copied properly.
  for (const key in info) {
    const value = info[key];
    if (value !== null && typeof value === "object") return structuredClone(info);
  }
  return { ...info };
}

/** Applies `open` options to an existing job (mutates `state`). */
export function applyOpen(state: JobState, options: { expect?: boolean; info?: JobInfo; now?: Date }): boolean {
  let changed = false;
  if (options.expect && !state.expected) {
    state.expected = true;
    changed = true;
    // Lost detection counts from registration while nothing has arrived yet.
    if (state.committed === 0 && state.status === "open") state.lastSeenAt = (options.now ?? new Date()).toISOString();
  }
  if (options.info && Object.keys(options.info).length > 0) {
    state.info = { ...state.info, ...options.info };
    changed = true;
  }
  return changed;
}

/**
 * Which of `entries` (the first being item `at`) are new, after the port's rules:
 * overlap skipped, gap and closed job refused with FAILED_PRECONDITION.
 */
export function newEntries(state: JobState, at: number, entries: readonly LogEntry[]): readonly LogEntry[] {
  if (!Number.isSafeInteger(at) || at < 0) throw new RunnerDepotError("INVALID_ARGUMENT", `bad item offset ${at}`);
  if (state.status !== "open") {
    throw new RunnerDepotError("FAILED_PRECONDITION", `job ${state.requestId} is ${state.status}`, {
      details: { committed: state.committed },
    });
  }
  if (at > state.committed) {
    throw new RunnerDepotError("FAILED_PRECONDITION", `offset ${at} is past the ${state.committed} items stored`, {
      details: { committed: state.committed },
    });
  }
  const skip = state.committed - at;
  return skip === 0 ? entries : entries.slice(skip);
}

/** Largest append whose line array is made at its final size up front (see applyAppend). */
const PRESIZE_MAX = 65_536;

/** Counts new entries into `state` (mutates it) and returns the lines to store. O(entries). */
export function applyAppend(state: JobState, fresh: readonly LogEntry[], now: Date): StoredLine[] {
  // Sized for one line an entry (nearly all): filled by index, no regrowth by push (its
  // copies were ~25 bytes of garbage a line); trimmed or grown past that as it comes. Not
  // for a huge append: V8 makes `new Array(n)` a dictionary past ~100k elements.
  const stored: StoredLine[] = fresh.length <= PRESIZE_MAX ? new Array<StoredLine>(fresh.length) : [];
  let count = 0;
  const iso = now.toISOString();
  for (const entry of fresh) {
    if (entry instanceof ReceivedLine) stored[count++] = entry;
    else for (const line of entry.stored) stored[count++] = line;
    state.storedBytes += entry.bytes;
    if (entry.stderr) state.lines.stderr++;
    else state.lines.stdout++;
    if (entry.capped) state.logTruncated = true;
  }
  stored.length = count;
  state.committed += fresh.length;
  state.storedLines += count;
  if (fresh.length > 0 && state.startedAt === null) state.startedAt = iso;
  state.lastSeenAt = iso;
  return stored;
}

/**
 * Counts new entries into `state` (mutates it) and plans the store's writes: one head run (what applyAppend
 * returns) while the log is not cut, else log-tail.ts's runs and segment drops. O(entries).
 */
export function planAppend(state: JobState, fresh: readonly LogEntry[], now: Date): AppendPlan {
  let cutting = state.cut !== undefined;
  for (let i = 0; !cutting && i < fresh.length; i++) if ((fresh[i] as LogEntry).tailBytes) cutting = true;
  if (cutting) return planCutAppend(state, fresh, now);
  const first = state.storedLines;
  const lines = applyAppend(state, fresh, now);
  return { runs: lines.length > 0 ? [{ first, segment: null, lines }] : [], drop: [] };
}

/** Applies a finish (mutates `state`); returns false when the job had already ended. */
export function applyFinish(state: JobState, result: JobResult, at: number | undefined): boolean {
  if (state.status !== "open") return false;
  if (at !== undefined) {
    if (at !== state.committed) {
      throw new RunnerDepotError("FAILED_PRECONDITION", `end at ${at} but ${state.committed} items are stored`, {
        details: { committed: state.committed },
      });
    }
    state.committed += 1;
    if (state.startedAt === null) state.startedAt = result.startedAt ?? result.endedAt;
    state.lastSeenAt = result.endedAt;
  }
  state.status = result.outcome === "finished" ? "finished" : result.outcome;
  state.result = { ...result, lines: { ...result.lines } };
  return true;
}

/** True when an ended job's result is older than `before` (retention). */
export function isPrunable(state: JobState, before: Date): boolean {
  return state.status !== "open" && state.result !== null && Date.parse(state.result.endedAt) < before.getTime();
}

/**
 * Applies `markArchived` (mutates `state`): true when the lines are to be dropped now,
 * false when the job was archived already (the first archive wins). Throws
 * FAILED_PRECONDITION for an open job or a line count that disagrees.
 */
export function applyArchived(state: JobState, archived: ArchivedLog): boolean {
  if (state.archived) return false;
  if (state.status === "open")
    throw new RunnerDepotError("FAILED_PRECONDITION", `job ${state.requestId} is still open`);
  if (archived.lines !== keptLines(state)) {
    throw new RunnerDepotError(
      "FAILED_PRECONDITION",
      `the archive holds ${archived.lines} lines, the job ${keptLines(state)}`,
    );
  }
  state.archived = { ...archived };
  return true;
}

/** True when an ended job's lines are still in the store and its result is older than `before` (archive sweep). */
export function isArchivable(state: JobState, before: Date): boolean {
  return (
    state.status !== "open" &&
    !state.archived &&
    state.result !== null &&
    Date.parse(state.result.endedAt) < before.getTime()
  );
}
