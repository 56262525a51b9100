/**
 * The log viewer's sections (docs/decisions/log-sections.md): folding over the windowed viewer. Like app.ts this is
 * one self-contained function whose source text script.ts ships (nothing from outside its body but browser globals).
 *
 * The viewer numbers rows, not lines: a folded section shows its header row and hides the rest of its lines, so row
 * ↔ line is a walk over the folded ranges, O(sections) (at most 1000), never over lines. Only the rows on screen are
 * fetched and drawn, folded or not.
 */

import type { LogSection, LogSections } from "../../runner/ports.js";

/** A section as GET api/jobs/:id/sections sends it: the store's record as it is (a type only: nothing is imported). */
export type WireSection = LogSection;

/** The answer of GET api/jobs/:id/sections. */
export interface WireSections extends LogSections {
  storedLines: number;
  status: string;
  exitCode: number | null;
  /** Where the log was cut (docs/decisions/log-tail.md): positions at + 1 … at + lines hold no line. */
  cut?: { at: number; lines: number } | null;
}

/** What the viewer asks of its sections. */
export interface SectionFolds {
  /** Takes the job's sections; the first time, folds those marked collapsed and opens the failing one. */
  load(record: WireSections): void;
  /** Rows shown for `total` lines. */
  rows(total: number): number;
  /** The line shown at `row`. */
  lineOf(row: number, total: number): number;
  /** The row showing `line` (a folded section's header when the line is inside it). */
  rowOf(line: number, total: number): number;
  /** Opens every section holding `line`; true when one was folded. */
  reveal(line: number): boolean;
  /** Folds or opens the section starting at `line`. */
  toggle(line: number): void;
  /** Marks `row` (showing `line`) as a section header, or as inside sections (its indent). */
  decorate(row: HTMLElement, line: number, total: number): void;
  /** The section the job failed in (the last one open when it exited non-zero), or null. */
  failing(): WireSection | null;
  /** True when `text` may be a marker (the viewer then asks for the sections again). */
  mayBeMarker(text: string): boolean;
}

/** Builds the viewer's fold state. */
export function createSectionFolds(): SectionFolds {
  let sections: WireSection[] = [];
  const byStart = new Map<number, number>();
  /** Folded sections, by their start line (stable across reloads of a live job's sections). */
  const folded = new Set<number>();
  /** Sections the viewer has set itself once (a reload keeps what the reader chose). */
  const seen = new Set<number>();
  let failed: WireSection | null = null;
  /** A cut log's dropped positions [a, b]: always hidden, the drop marker's row stands for them. */
  let dropped: [number, number] | null = null;
  let ranges: Array<[number, number]> = [];
  let rangesFor = -1;
  let dirty = true;

  function endOf(s: WireSection, total: number): number {
    return Math.min(total - 1, s.end ?? total - 1);
  }

  /** The hidden line ranges [a, b], sorted, outermost folds only. O(sections). */
  function hidden(total: number): Array<[number, number]> {
    if (!dirty && rangesFor === total) return ranges;
    const out: Array<[number, number]> = [];
    let reach = -1;
    for (const s of sections) {
      if (!folded.has(s.start) || s.start <= reach) continue;
      const b = endOf(s, total);
      if (b <= s.start) continue;
      out.push([s.start + 1, b]);
      reach = b;
    }
    if (dropped) {
      // The dropped range joins the folds: sorted, overlaps merged, so the walks below stay O(sections).
      out.push([dropped[0], Math.min(dropped[1], total - 1)]);
      out.sort((x, y) => x[0] - y[0]);
      const merged: Array<[number, number]> = [];
      for (const r of out) {
        const last = merged[merged.length - 1];
        if (last && r[0] <= last[1] + 1) last[1] = Math.max(last[1], r[1]);
        else if (r[1] >= r[0]) merged.push([r[0], r[1]]);
      }
      out.splice(0, out.length, ...merged);
    }
    ranges = out;
    rangesFor = total;
    dirty = false;
    return out;
  }

  function fmt(ms: number): string {
    const s = Math.round(ms / 1000);
    if (ms < 1000) return `${Math.max(0, Math.round(ms))} ms`;
    const h = Math.floor(s / 3600);
    const m = Math.floor((s % 3600) / 60);
    const sec = String(s % 60).padStart(2, "0");
    return h > 0 ? `${h}h ${String(m).padStart(2, "0")}m ${sec}s` : m > 0 ? `${m}m ${sec}s` : `${s % 60}s`;
  }

  return {
    load(record) {
      dropped = record.cut && record.cut.lines > 0 ? [record.cut.at + 1, record.cut.at + record.cut.lines] : null;
      sections = record.sections.slice().sort((a, b) => a.start - b.start);
      byStart.clear();
      sections.forEach((s, i) => byStart.set(s.start, i));
      const ended = record.status !== "open";
      const bad = ended && (record.status !== "finished" || record.exitCode !== 0);
      failed = null;
      if (bad) {
        // The last one open when the job exited: the innermost still open, else (every section closed) the last begun.
        for (const s of sections) if (s.end === null && (!failed || s.depth >= failed.depth)) failed = s;
        failed ??= sections.at(-1) ?? null;
      }
      for (const s of sections) {
        if (seen.has(s.start)) continue;
        seen.add(s.start);
        if (s.collapsed) folded.add(s.start);
      }
      if (failed && !seen.has(-1 - failed.start)) {
        seen.add(-1 - failed.start);
        folded.delete(failed.start);
        this.reveal(failed.start);
      }
      dirty = true;
    },
    rows(total) {
      let n = total;
      for (const [a, b] of hidden(total)) n -= b - a + 1;
      return Math.max(0, n);
    },
    lineOf(row, total) {
      let line = row;
      for (const [a, b] of hidden(total)) {
        if (a > line) break;
        line += b - a + 1;
      }
      return line;
    },
    rowOf(line, total) {
      let gone = 0;
      for (const [a, b] of hidden(total)) {
        if (b < line) gone += b - a + 1;
        else if (a <= line) return a - 1 - gone;
        else break;
      }
      return line - gone;
    },
    reveal(line) {
      let changed = false;
      for (const s of sections) {
        if (s.start > line) break;
        if (s.start < line && (s.end === null || s.end >= line) && folded.delete(s.start)) changed = true;
      }
      dirty ||= changed;
      return changed;
    },
    toggle(line) {
      if (!byStart.has(line)) return;
      if (!folded.delete(line)) folded.add(line);
      dirty = true;
    },
    decorate(row, line, total) {
      const at = byStart.get(line);
      // Depth of the innermost section holding the line (its indent): O(sections) a row, rows on screen only.
      let depth = 0;
      for (const s of sections) {
        if (s.start > line) break;
        if (s.start < line && endOf(s, total) >= line) depth = Math.max(depth, s.depth + 1);
      }
      const text = row.querySelector<HTMLElement>(".text");
      if (text) text.style.paddingLeft = `${depth * 1.2}em`;
      if (at === undefined) return;
      const s = sections[at]!;
      const open = !folded.has(s.start);
      row.classList.add("section-head");
      if (s === failed) row.classList.add("section-failed");
      row.dataset.section = s.name;
      row.dataset.depth = String(s.depth);
      const button = document.createElement("button");
      button.type = "button";
      button.className = "fold";
      button.dataset.line = String(line);
      button.setAttribute("aria-expanded", String(open));
      button.setAttribute("aria-label", `${open ? "Fold" : "Open"} section ${s.name}`);
      button.textContent = open ? "▾" : "▸";
      const title = document.createElement("span");
      title.className = "section-name";
      title.textContent = s.name;
      const dur = document.createElement("span");
      dur.className = "dur";
      const ms =
        s.end !== null && s.endTime !== null && s.startTime > 0 && s.endTime > 0 ? s.endTime - s.startTime : null;
      dur.textContent = ms !== null ? fmt(ms) : s.end === null ? "still open" : "";
      if (s.end !== null) dur.title = `lines ${s.start + 1}–${s.end + 1}`;
      // The header's own line is the marker: the section's name stands for it, with GitLab's header text (what the
      // renderer leaves once the marker's CR and erase have run) when it has one.
      const shown = (text?.textContent ?? "").trim();
      const header = document.createElement("span");
      header.className = "section-header";
      header.textContent = /^(?:::|section_|…$)/.test(shown) ? "" : shown;
      text?.replaceChildren(button, " ", title, " ", header, " ", dur);
    },
    failing() {
      return failed;
    },
    mayBeMarker(text) {
      return /^(?:\x1b\[0K)?section_(?:start|end):|^::(?:end)?group::/.test(text);
    },
  };
}

/** The sections' styles, appended to the console's stylesheet (styles.ts). */
export const SECTION_CSS = `
.row.section-head { background: #17202a; }
.row.section-head .text { display: flex; gap: .4em; align-items: center; }
.row.section-failed { background: #3a1a1c; }
.row .fold { font: inherit; line-height: 1; padding: 0 .3em; background: none; color: #e6e6e6; border: 1px solid #4f5863; border-radius: 3px; cursor: pointer; }
.row .fold:focus-visible { outline: 2px solid #79c0ff; }
.row .section-name { font-weight: 700; }
.row .dur { color: #9aa4ae; font-variant-numeric: tabular-nums; }
`;
