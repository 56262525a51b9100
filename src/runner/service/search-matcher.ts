/**
 * What a log search looks for in one line: literal text or an RE2 regular expression, with or without case,
 * compiled once per request into a function from a line to its match ranges. Regular expressions run on re2js (a
 * port of RE2: linear in the line, no backtracking), so no pattern can make a search slow.
 * Why: docs/decisions/log-search.md.
 */
import { RE2JS } from "re2js";
import { RunnerDepotError } from "../../errors.js";

/** Longest pattern a search takes, in UTF-16 code units; checked before anything is compiled. */
export const MAX_PATTERN_CHARS = 1024;
/**
 * Largest RE2 program an expression may compile to (re2js `programSize()`, its instructions). One scan of a line
 * costs up to ~18 ns a byte an instruction (`(?:x?){100}`: 202 instructions, 6.8 ms for a line of 4,096 characters),
 * so 256 keeps a 64 KiB line's test near 0.3 s at worst; its ranges are looked for in its first RANGE_CHARS, until the
 * request's deadline. The expressions people search logs with compile to 7–201
 * (docs/decisions/log-search.md, "An expression's cost").
 */
export const MAX_PROGRAM_SIZE = 256;
/**
 * Characters of a line an expression's ranges are looked for in (the line matches or not on its whole text): one find
 * over them costs at most ~90 ms at MAX_PROGRAM_SIZE.
 */
export const RANGE_CHARS = 4096;
/** Match ranges returned per line at most (a line keeps matching past it; only the ranges are cut). */
export const MAX_RANGES_PER_LINE = 100;

/** A match range in a line: `[start, end)` in UTF-16 code units of the line's stored text. */
export type MatchRange = [number, number];

/** What a search looks for. */
export interface SearchPattern {
  /** The text or expression (1 to MAX_PATTERN_CHARS code units). */
  pattern: string;
  /** True: `pattern` is an RE2 regular expression; false (default): literal text. */
  regex?: boolean;
  /** True: upper and lower case differ; false (default): they match each other. */
  matchCase?: boolean;
}

/**
 * A compiled pattern: a line's match ranges (non-overlapping, in order), or null when it does not match. Past
 * `deadline` (a `performance.now()` time) no further range is looked for: a matched line keeps those found so far.
 */
export interface LineMatcher {
  (line: string, deadline?: number): MatchRange[] | null;
  /** The literal of a literal search, for a store's fast path; undefined for an expression. */
  readonly literal?: string;
  /** True when `literal` matches without case (as a JS RegExp's `i` flag has it). */
  readonly ignoreCase?: boolean;
}

/** Refuses an empty or over-long pattern; O(1), before any other work. */
export function checkPattern(pattern: string): void {
  if (pattern.length === 0) throw new RunnerDepotError("INVALID_ARGUMENT", "the search pattern is empty");
  if (pattern.length > MAX_PATTERN_CHARS)
    throw new RunnerDepotError("INVALID_ARGUMENT", `the search pattern is longer than ${MAX_PATTERN_CHARS} characters`);
}

/**
 * Compiles a search pattern. A literal is found with `indexOf` (case-sensitive) or an escaped JS RegExp with the
 * `i` flag (a literal cannot backtrack); an expression with re2js. Costs: compiling is O(pattern); matching a
 * line is O(line × pattern) at worst for literals and O(line × expression) for RE2, never exponential.
 * INVALID_ARGUMENT for an empty or over-long pattern, or an expression RE2 does not take (backreferences,
 * lookahead, repeat counts over 1000) or that compiles to more than MAX_PROGRAM_SIZE instructions.
 *
 * @example
 * const match = compileSearch({ pattern: "error", matchCase: false });
 * match("an ERROR here"); // [[3, 8]]
 */
export function compileSearch(search: SearchPattern): LineMatcher {
  checkPattern(search.pattern);
  const { pattern } = search;
  if (!search.regex && search.matchCase) {
    const literal: LineMatcher = (line, deadline = Infinity) => {
      let at = line.indexOf(pattern);
      if (at < 0) return null;
      const ranges: MatchRange[] = [];
      while (at >= 0 && ranges.length < MAX_RANGES_PER_LINE) {
        ranges.push([at, at + pattern.length]);
        // indexOf is O(line × pattern) at worst: each next range is looked for only while there is time.
        if (performance.now() > deadline) break;
        at = line.indexOf(pattern, at + pattern.length);
      }
      return ranges;
    };
    return Object.assign(literal, { literal: pattern });
  }
  if (!search.regex) {
    // An escaped literal: irregexp compares it position by position, with no alternatives to backtrack into.
    const re = new RegExp(pattern.replace(/[\\^$.*+?()[\]{}|/-]/g, "\\$&"), "gi");
    const nocase: LineMatcher = (line, deadline = Infinity) => {
      re.lastIndex = 0;
      let m = re.exec(line);
      if (m === null) return null;
      const ranges: MatchRange[] = [];
      while (m !== null && ranges.length < MAX_RANGES_PER_LINE) {
        ranges.push([m.index, m.index + m[0].length]);
        if (performance.now() > deadline) break;
        m = re.exec(line);
      }
      return ranges;
    };
    return Object.assign(nocase, { literal: pattern, ignoreCase: true });
  }
  let re: RE2JS;
  try {
    re = RE2JS.compile(pattern, search.matchCase ? 0 : RE2JS.CASE_INSENSITIVE);
  } catch (error) {
    throw new RunnerDepotError("INVALID_ARGUMENT", `not a regular expression RE2 takes: ${(error as Error).message}`);
  }
  const size = re.programSize();
  if (size > MAX_PROGRAM_SIZE)
    throw new RunnerDepotError(
      "INVALID_ARGUMENT",
      `the expression compiles to ${size} instructions, over the ${MAX_PROGRAM_SIZE} a search takes; make it smaller`,
    );
  return (line, deadline = Infinity) => {
    // test() runs RE2's DFA without captures: most lines are answered there.
    if (!re.test(line)) return null;
    // Ranges are looked for in the line's first RANGE_CHARS only: a find() may scan to the end each time, at up to
    // ~84 ns a character an instruction (`(?:.*(?:x?){100}y|x)`: 0.28 s a find over 16 KiB).
    const m = re.matcher(line.length > RANGE_CHARS ? line.slice(0, RANGE_CHARS) : line);
    const ranges: MatchRange[] = [];
    while (ranges.length < MAX_RANGES_PER_LINE && m.find()) {
      ranges.push([m.start(), m.end()]);
      if (performance.now() > deadline) break;
    }
    return ranges.length > 0 ? ranges : [[0, 0]];
  };
}
