/**
 * A job's section record (docs/decisions/log-sections.md): every store folds the lines it stores into it inside
 * the same atomic append, so the record always agrees with the lines, whichever replica stored them. The lines are
 * stored masked (service/call/masking.ts), so a name never holds a secret the service knows.
 *
 * Bounds: MAX_SECTIONS per job, MAX_SECTION_DEPTH of nesting, names cut to MAX_SECTION_NAME_BYTES; a record is at
 * most ~MAX_SECTIONS × (name + 120) bytes of JSON (~380 KB), whatever the log prints.
 * Costs: O(1) a line without a marker (one byte looked at, no decoding); O(sections) an append holding a marker
 * (the record is copied, never mutated: a store's committed record is never half-changed).
 */
import { RunnerDepotError } from "../../errors.js";
import type { JobLogStore, LogSection, LogSectionEvent, LogSections, StoredLine } from "../ports.js";
import { ReceivedLine } from "../protocol/received-line.js";
import { mayStartMarker, parseSectionMarker, type SectionMarker } from "../protocol/section-marker.js";

import { MAX_SECTION_NAME_BYTES } from "../protocol/section-marker.js";

export { MAX_SECTION_NAME_BYTES };

/** Sections kept per job; later starts are counted in `dropped`. */
export const MAX_SECTIONS = 1000;
/** Open sections at once; a start nested deeper is counted in `dropped`. */
export const MAX_SECTION_DEPTH = 16;

/** A record with no section. */
export function emptySections(): LogSections {
  return { sections: [], dropped: 0, unmatched: 0 };
}

/** A deep copy (callers never hold a store's own record). O(sections). */
export function cloneSections(record: LogSections): LogSections {
  return { ...record, sections: record.sections.map((s) => ({ ...s })) };
}

/** The first code unit of a stored line, without decoding a received one. O(1). */
function firstUnit(line: StoredLine): number {
  if (line instanceof ReceivedLine) return line.end > line.start ? line.buf[line.start]! : -1;
  return line.line.length > 0 ? line.line.charCodeAt(0) : -1;
}

/** False when `line` surely holds no marker (its first unit rules it out; the service's own lines never do). O(1). */
export function mayHoldMarker(line: StoredLine): boolean {
  return line.marker !== true && mayStartMarker(firstUnit(line));
}

/**
 * `record` with `lines` (stored at positions `first`, `first + 1`, …) folded in: a new record when a line holds a
 * marker, else `record` itself (undefined stays undefined). `onEvent` hears each start and end kept, in order.
 * O(lines) looking at one unit each, plus O(sections + marker bytes) when there is a marker.
 *
 * @example
 * let record = foldSections(undefined, [{ line: "::group::Build", stderr: false }], 0);
 * record = foldSections(record, [{ line: "::endgroup::", stderr: false }], 1);
 * // record.sections[0] → { name: "Build", start: 0, end: 1, … }
 */
export function foldSections(
  record: LogSections | undefined,
  lines: readonly StoredLine[],
  first: number,
  onEvent?: (event: LogSectionEvent) => void,
): LogSections | undefined {
  let out: LogSections | null = null;
  let open: number[] = [];
  for (let k = 0; k < lines.length; k++) {
    const line = lines[k]!;
    if (!mayHoldMarker(line)) continue;
    const marker = parseSectionMarker(line.line);
    if (!marker) continue;
    if (out === null) {
      // Copy on the first marker: the caller's record stays as it was.
      const base = record ?? emptySections();
      out = { ...base, sections: base.sections.slice() };
      open = openIndexes(out.sections);
    }
    apply(out, open, marker, first + k, line.time ?? 0, onEvent);
  }
  return out ?? record;
}

/** Indexes of the open sections, outermost first. O(sections). */
function openIndexes(sections: readonly LogSection[]): number[] {
  const open: number[] = [];
  for (let i = 0; i < sections.length; i++) if (sections[i]!.end === null) open.push(i);
  return open;
}

function apply(
  out: LogSections,
  open: number[],
  marker: SectionMarker,
  position: number,
  lineTime: number,
  onEvent: ((event: LogSectionEvent) => void) | undefined,
): void {
  const time = marker.time ?? lineTime;
  if (marker.kind === "start") {
    if (out.sections.length >= MAX_SECTIONS || open.length >= MAX_SECTION_DEPTH) {
      out.dropped++;
      return;
    }
    const depth = open.length;
    open.push(out.sections.length);
    out.sections.push({
      name: marker.name,
      format: marker.format,
      start: position,
      end: null,
      depth,
      startTime: time,
      endTime: null,
      collapsed: marker.collapsed,
    });
    onEvent?.({ section: "start", name: marker.name, format: marker.format, position, depth, time });
    return;
  }
  // The innermost open section it closes: GitLab's by name, GitHub's the innermost group.
  let at = open.length - 1;
  for (; at >= 0; at--) {
    const s = out.sections[open[at]!]!;
    if (s.format === marker.format && (marker.format === "github" || s.name === marker.name)) break;
  }
  if (at < 0) {
    out.unmatched++;
    return;
  }
  // Sections opened inside it and never closed end with it (innermost first).
  for (let j = open.length - 1; j >= at; j--) {
    const i = open[j]!;
    const s = { ...out.sections[i]!, end: position, endTime: time };
    out.sections[i] = s;
    onEvent?.({ section: "end", name: s.name, format: s.format, position, depth: s.depth, time });
  }
  open.length = at;
}

/** The first section named `name`, or null. O(sections). */
export function findSection(record: LogSections | null | undefined, name: string): LogSection | null {
  for (const s of record?.sections ?? []) if (s.name === name) return s;
  return null;
}

/**
 * The record as it stood before line `from`: sections started before it, those ending at or after it open again.
 * Seeds a follower that starts mid-log (follow.ts), so its events agree with the store's record. O(sections).
 */
export function sectionsBefore(record: LogSections | null | undefined, from: number): LogSections {
  const out = emptySections();
  for (const s of record?.sections ?? []) {
    if (s.start >= from) break;
    out.sections.push(s.end !== null && s.end < from ? { ...s } : { ...s, end: null, endTime: null });
  }
  return out;
}

/**
 * Lines `[from, to)` of the section named by a download's `?section=` (the first of that name; a still-open one runs
 * to the last stored line), or everything when `name` is null. INVALID_ARGUMENT for a name longer than any kept,
 * NOT_FOUND when the job has no such section. O(sections).
 */
export async function sectionLines(
  logs: JobLogStore,
  requestId: string,
  storedLines: number,
  name: string | null,
): Promise<{ from: number; to: number }> {
  if (name === null) return { from: 0, to: storedLines };
  if (Buffer.byteLength(name, "utf8") > MAX_SECTION_NAME_BYTES)
    throw new RunnerDepotError("INVALID_ARGUMENT", `a section name is at most ${MAX_SECTION_NAME_BYTES} bytes`);
  const found = findSection(logs.sections ? await logs.sections(requestId) : null, name);
  if (!found) throw new RunnerDepotError("NOT_FOUND", `job ${requestId} has no section ${JSON.stringify(name)}`);
  return { from: found.start, to: Math.min(storedLines, (found.end ?? storedLines - 1) + 1) };
}
