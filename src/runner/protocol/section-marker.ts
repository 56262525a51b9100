/**
 * Section markers in a job's log lines (docs/decisions/log-sections.md): GitLab's
 * `\e[0Ksection_start:<unix>:<name>[options]\r\e[0K<header>` / `\e[0Ksection_end:<unix>:<name>` and
 * GitHub's `::group::<title>` / `::endgroup::`. A marker is recognised at the start of a line only
 * (after GitLab's optional `\e[0K`), as both CIs print them. The parse is bounded: O(min(line, MAX_SECTION_NAME_BYTES
 * + MAX_OPTIONS_CHARS)) whatever the line's length.
 */

/** Longest section name kept, in UTF-8 bytes; a longer one is cut at a character boundary (start and end alike). */
export const MAX_SECTION_NAME_BYTES = 256;
/** Longest `[options]` read after a GitLab name; longer options are ignored (the marker still counts). */
const MAX_OPTIONS_CHARS = 256;
/** Digits of a GitLab marker's unix time: seconds (10 today), 13 at most (ms printed by some tools). */
const MAX_TIME_DIGITS = 13;

const ERASE = "\x1b[0K";

/** A section marker read from one line. */
export interface SectionMarker {
  kind: "start" | "end";
  format: "gitlab" | "github";
  /** The section's name (GitLab) or title (GitHub); "" for `::endgroup::`. */
  name: string;
  /** GitLab's unix time in ms; null for GitHub (the line's own time is used). */
  time: number | null;
  /** `[collapsed=true]` on a GitLab start. */
  collapsed: boolean;
}

/**
 * True when `first` (a line's first byte or UTF-16 unit) may begin a marker: ESC, `s` or `:`.
 * Lets a store skip the parse (and a fast-path line its decoding) for nearly every line. O(1).
 */
export function mayStartMarker(first: number): boolean {
  return first === 0x1b || first === 0x73 || first === 0x3a;
}

/**
 * The marker `line` holds, or null. Never throws.
 *
 * @example
 * parseSectionMarker("\x1b[0Ksection_start:1700000000:build[collapsed=true]\r\x1b[0KBuilding");
 * // → { kind: "start", format: "gitlab", name: "build", time: 1700000000000, collapsed: true }
 */
export function parseSectionMarker(line: string): SectionMarker | null {
  if (line.length === 0 || !mayStartMarker(line.charCodeAt(0))) return null;
  if (line.startsWith("::")) return github(line);
  const at = line.startsWith(ERASE) ? ERASE.length : 0;
  if (line.startsWith("section_start:", at)) return gitlab(line, at + 14, "start");
  if (line.startsWith("section_end:", at)) return gitlab(line, at + 12, "end");
  return null;
}

function github(line: string): SectionMarker | null {
  if (line.startsWith("::group::"))
    return { kind: "start", format: "github", name: cutName(line, 9, line.length), time: null, collapsed: true };
  if (line.startsWith("::endgroup::")) return { kind: "end", format: "github", name: "", time: null, collapsed: false };
  return null;
}

function gitlab(line: string, from: number, kind: "start" | "end"): SectionMarker | null {
  let i = from;
  while (i < line.length && i - from <= MAX_TIME_DIGITS && isDigit(line.charCodeAt(i))) i++;
  const digits = i - from;
  if (digits === 0 || digits > MAX_TIME_DIGITS || line.charCodeAt(i) !== 0x3a) return null;
  const unix = Number(line.slice(from, i));
  // Seconds as GitLab prints them; 13 digits read as ms.
  const time = digits >= 13 ? unix : unix * 1000;
  const nameFrom = i + 1;
  // The name runs to `[`, CR, ESC or the end of the line; only its first bytes are looked at.
  const limit = Math.min(line.length, nameFrom + MAX_SECTION_NAME_BYTES * 4);
  let j = nameFrom;
  while (j < limit) {
    const c = line.charCodeAt(j);
    if (c === 0x5b || c === 0x0d || c === 0x1b) break;
    j++;
  }
  if (j === nameFrom) return null;
  const name = cutName(line, nameFrom, j);
  let collapsed = false;
  if (kind === "start" && line.charCodeAt(j) === 0x5b) {
    const close = line.indexOf("]", j);
    if (close > j && close - j <= MAX_OPTIONS_CHARS) {
      for (const option of line.slice(j + 1, close).split(","))
        if (option.trim() === "collapsed=true") collapsed = true;
    }
  }
  return { kind, format: "gitlab", name, time, collapsed };
}

function isDigit(c: number): boolean {
  return c >= 0x30 && c <= 0x39;
}

/** `line[from, to)` cut to MAX_SECTION_NAME_BYTES of UTF-8 at a code point boundary. O(MAX_SECTION_NAME_BYTES). */
function cutName(line: string, from: number, to: number): string {
  let bytes = 0;
  let i = from;
  while (i < to) {
    const c = line.charCodeAt(i);
    const pair = c >= 0xd800 && c <= 0xdbff && i + 1 < to;
    const size = c < 0x80 ? 1 : c < 0x800 ? 2 : pair ? 4 : 3;
    if (bytes + size > MAX_SECTION_NAME_BYTES) break;
    bytes += size;
    i += pair ? 2 : 1;
  }
  return line.slice(from, i);
}
