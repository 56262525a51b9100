/**
 * The kept tail (docs/decisions/log-tail.md): once a job's log passes the head's share of its cap, the store keeps
 * the head, one drop marker and a rolling tail of the newest entries. The rules every store shares live here: how
 * an append is planned into runs and segment drops, how a read maps positions over the dropped range, and the
 * marker's text. Positions never move: a kept tail line keeps the position it was stored at.
 */
import type { JobState, LogCut, LogEntry, StoredLine, TailSegment } from "../ports.js";
import { ReceivedLine } from "../protocol/received-line.js";
import { PageBudget } from "./page-budget.js";

/**
 * The tail is kept in this many segments (at least): a store drops a whole segment at a time, so the tail holds
 * between (1 − 1/TAIL_SEGMENTS) × tailBytes and tailBytes (plus the newest entry when it alone is larger).
 */
export const TAIL_SEGMENTS = 8;

/** The bytes (as entries count them) at which a tail segment of `cut` is full and the next one starts. O(1). */
export function tailSegmentBytes(cut: Pick<LogCut, "tailBytes">): number {
  return Math.max(1, Math.ceil(cut.tailBytes / TAIL_SEGMENTS));
}

/** Lines an append stores, as contiguous runs: `segment` is the tail segment's first position, or null for the head. */
export interface StoredRun {
  first: number;
  segment: number | null;
  lines: StoredLine[];
}

/** What an append does to a store: runs to write (in order) and tail segments stored before it to drop. */
export interface AppendPlan {
  runs: StoredRun[];
  /** Segments (their first positions and ends) stored earlier and dropped now. */
  drop: { first: number; end: number }[];
}

/** The text of the drop marker of `cut`. O(1). */
export function cutMarkerText(cut: LogCut): string {
  const kept = cut.segments.reduce((sum, s) => sum + s.bytes, 0);
  return (
    `[runner-depot] log cut: ${cut.lines} lines (${cut.bytes} bytes) dropped here; ` +
    `the head above is kept whole, and below are the last ${kept} bytes of the log`
  );
}

/** Lines a store physically holds for the job: `storedLines` less the dropped ones. O(1). */
export function keptLines(state: Pick<JobState, "storedLines" | "cut">): number {
  return state.storedLines - (state.cut?.lines ?? 0);
}

/** The position after `lines` read from `from` (a drop marker stands for itself and its `skipped`). O(lines). */
export function positionAfter(from: number, lines: readonly StoredLine[]): number {
  let position = from + lines.length;
  for (const line of lines) if (line.skipped) position += line.skipped;
  return position;
}

/** The marker as `read` returns it at `position` (the marker's own, or one inside the dropped range). O(1). */
export function markerAt(cut: LogCut, position: number): StoredLine {
  const marker: StoredLine = { line: cutMarkerText(cut), stderr: false, marker: true };
  if (cut.time > 0) marker.time = cut.time;
  marker.skipped = cut.at + cut.lines - position;
  return marker;
}

/**
 * Reads `limit` positions from `from` of a job that may be cut: the head's lines, then the marker (with `skipped`),
 * then the tail's. `readRun(from, to)` reads the stored lines `[from, to)` of one run (head or tail; never across
 * the dropped range), taking them from `budget` (the read's `maxBytes`), which the marker counts against too; a run
 * cut short by it ends the page. O(lines read).
 */
export async function readKept(
  state: Pick<JobState, "storedLines" | "cut">,
  from: number,
  limit: number,
  readRun: (from: number, to: number) => Promise<StoredLine[]>,
  budget: PageBudget = new PageBudget(),
): Promise<StoredLine[]> {
  const total = state.storedLines;
  from = Math.max(0, from);
  if (from >= total || limit <= 0) return [];
  const cut = state.cut;
  if (!cut) return readRun(from, Math.min(total, from + limit));
  const out: StoredLine[] = [];
  if (from < cut.at) {
    const head = await readRun(from, Math.min(cut.at, from + limit));
    for (const line of head) out.push(line);
    if (head.length < Math.min(cut.at, from + limit) - from) return out;
  }
  const tailFirst = cut.at + 1 + cut.lines;
  if (out.length < limit && from < tailFirst) {
    const marker = markerAt(cut, Math.max(from, cut.at));
    if (!budget.take(marker.line.length)) return out;
    out.push(marker);
  }
  const start = Math.max(from, tailFirst);
  if (out.length < limit && start < total && !budget.full) {
    for (const line of await readRun(start, Math.min(total, start + limit - out.length))) out.push(line);
  }
  return out;
}

/**
 * Counts new entries into `state` (mutates it, like job-state.ts `applyAppend`) and plans what the store writes:
 * head lines, the marker's position taken when an entry starts the tail, tail lines by segment, and the oldest
 * segments dropped once the tail passes `tailBytes`. Lines of a segment dropped within this append are never
 * written. O(entries + segments).
 */
export function planCutAppend(state: JobState, fresh: readonly LogEntry[], now: Date): AppendPlan {
  // Lines go into one array sized up front (one line an entry, nearly all), runs are index ranges of it: no array
  // grown by push a line. Not for a huge append (V8 makes `new Array(n)` a dictionary past ~100k elements).
  const flat: StoredLine[] = fresh.length <= 65_536 ? new Array<StoredLine>(fresh.length) : [];
  let n = 0;
  const ranges: Range[] = [];
  const drop: { first: number; end: number }[] = [];
  const before = state.storedLines;
  let run: Range | null = null;
  const iso = now.toISOString();
  // What the tail's segments count, kept as it goes (the segments are summed once, not per entry).
  let kept = state.cut ? tailCount(state.cut) : 0;
  let segmentBytes = state.cut ? tailSegmentBytes(state.cut) : 0;
  // Indexed loops, not for…of: in a function this size V8 kept the iterators (~40 bytes of garbage an entry).
  for (let e = 0; e < fresh.length; e++) {
    const entry = fresh[e]!;
    if (entry.stderr) state.lines.stderr++;
    else state.lines.stdout++;
    if (entry.capped) state.logTruncated = true;
    let cut = state.cut;
    const received = entry instanceof ReceivedLine ? entry : null;
    if (!cut && entry.tailBytes !== undefined && entry.tailBytes > 0) {
      const first = received ?? entry.stored[0];
      cut = {
        at: state.storedLines,
        lines: 0,
        bytes: 0,
        tailBytes: entry.tailBytes,
        time: first?.time ?? 0,
        segments: [],
      };
      state.cut = cut;
      segmentBytes = tailSegmentBytes(cut);
      // The marker's position: nothing is written for it (its text is made on read from the counts).
      state.storedLines++;
      run = null;
    }
    const count = received !== null ? 1 : entry.stored.length;
    state.storedBytes += entry.bytes;
    let segment: TailSegment | null = null;
    if (cut) {
      segment = cut.segments[cut.segments.length - 1] ?? null;
      if (segment === null || segment.bytes >= segmentBytes) {
        segment = { first: state.storedLines, lines: 0, bytes: 0 };
        cut.segments.push(segment);
      }
      segment.lines += count;
      segment.bytes += entry.bytes;
      kept += entry.bytes;
    }
    if (count > 0) {
      const key = segment === null ? null : segment.first;
      if (run === null || run.segment !== key) {
        run = { first: state.storedLines, segment: key, start: n, end: n };
        ranges.push(run);
      }
      if (received !== null) flat[n++] = received;
      else for (let k = 0; k < count; k++) flat[n++] = entry.stored[k]!;
      run.end = n;
      state.storedLines += count;
    }
    if (cut && kept > cut.tailBytes && cut.segments.length > 1) {
      kept = dropOldest(cut, state, before, ranges, drop, kept);
      if (run !== null && ranges[ranges.length - 1] !== run) run = null;
    }
  }
  state.committed += fresh.length;
  if (fresh.length > 0 && state.startedAt === null) state.startedAt = iso;
  state.lastSeenAt = iso;
  flat.length = n;
  const runs = ranges.map((r): StoredRun => ({
    first: r.first,
    segment: r.segment,
    lines: r.start === 0 && r.end === n ? flat : flat.slice(r.start, r.end),
  }));
  return { runs, drop };
}

/** A run while an append is planned: lines `[start, end)` of the plan's array. */
interface Range {
  first: number;
  segment: number | null;
  start: number;
  end: number;
}

/** What a cut's tail segments count. O(segments). */
function tailCount(cut: LogCut): number {
  let kept = 0;
  for (const s of cut.segments) kept += s.bytes;
  return kept;
}

/**
 * Drops the tail's oldest segments while it counts more than `tailBytes` (never the newest); returns what it counts
 * then. O(segments dropped + runs).
 */
function dropOldest(
  cut: LogCut,
  state: JobState,
  storedBefore: number,
  runs: Range[],
  drop: { first: number; end: number }[],
  kept: number,
): number {
  while (kept > cut.tailBytes && cut.segments.length > 1) {
    const oldest = cut.segments.shift()!;
    kept -= oldest.bytes;
    cut.lines += oldest.lines;
    cut.bytes += oldest.bytes;
    state.storedBytes -= oldest.bytes;
    // Stored by an earlier append: the store removes it. Planned in this one: never written.
    if (oldest.first < storedBefore) drop.push({ first: oldest.first, end: oldest.first + oldest.lines });
    for (let i = runs.length - 1; i >= 0; i--) if (runs[i]!.segment === oldest.first) runs.splice(i, 1);
  }
  return kept;
}
