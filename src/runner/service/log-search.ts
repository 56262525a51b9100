/**
 * Searching one job's stored log, a page of results at a time (docs/decisions/log-search.md). A request scans
 * forward from a cursor (a line position) until it has `limit` matches, or has scanned SCAN_BYTES of text or
 * SCAN_LINES lines, or has matched for MATCH_MS, or reaches the end of what is stored; it answers the matches and
 * the position to go on from.
 * So one request's cost is bounded whatever the log's size, and the log is never held in memory: it is read a
 * page at a time through `JobLogStore.read` (the archive's chunks for an archived job), or through the store's
 * `findLines` fast path for a literal on a store that has one (the fs store).
 */
import { RunnerDepotError } from "../../errors.js";
import type { JobLogStore, StoredLine } from "../ports.js";
import {
  checkPattern,
  compileSearch,
  type LineMatcher,
  type MatchRange,
  type SearchPattern,
} from "./search-matcher.js";

/** Matches one request returns at most, and by default. */
export const MAX_SEARCH_MATCHES = 1000;
export const DEFAULT_SEARCH_MATCHES = 100;
/** Bytes of stored text (UTF-16 code units on the read path) one request scans at most. */
export const SCAN_BYTES = 32 * 1024 * 1024;
/** Lines one request scans at most on the read path (the fast path is bounded by SCAN_BYTES alone). */
export const SCAN_LINES = 262_144;
/** Characters of matched lines one answer carries at most (one line always goes, however long). */
const RESULT_CHARS = 4 * 1024 * 1024;
/**
 * Milliseconds of matching after which a request ends its page (checked after each line and each fast-path read, and
 * inside a line between its match ranges): an expression within MAX_PROGRAM_SIZE, or a literal (indexOf is
 * O(line × pattern) at worst), can cost seconds a page on the one thread every runner call shares. The client goes
 * on from `next`.
 */
export const MATCH_MS = 500;
/** Lines per store read at most, and in a request's first read (each next one twice the last). */
const READ_PAGE = 2048;
const FIRST_READ = 64;
/** Bytes of lines one store read brings at most (and one line): 2,048 lines of 64 KiB would be 128 MiB. */
const READ_BYTES = 4 * 1024 * 1024;
/** Bytes one call of the store's fast path scans at most (the time bound is checked between calls). */
const FAST_READ_BYTES = 4 * 1024 * 1024;
/**
 * Searches of one store that run at once, and that may wait for a turn; more answer UNAVAILABLE. Each running one
 * holds a read buffer (4 MiB on the fs fast path) or a page of lines, plus its answer: so searches add at most
 * about MAX_RUNNING × 12 MiB to a server, however many are asked for.
 */
const MAX_RUNNING = 4;
const MAX_WAITING = 64;
const gates = new WeakMap<JobLogStore, { running: number; waiting: Array<() => void> }>();

/** Waits for a turn to search `logs`; resolves with the release. UNAVAILABLE when too many wait already. */
async function turn(logs: JobLogStore): Promise<() => void> {
  let gate = gates.get(logs);
  if (!gate) gates.set(logs, (gate = { running: 0, waiting: [] }));
  const g = gate;
  if (g.running < MAX_RUNNING) g.running++;
  else if (g.waiting.length >= MAX_WAITING)
    throw new RunnerDepotError("UNAVAILABLE", "too many log searches are under way; try again shortly", {
      details: { retryAfter: 1 },
    });
  else await new Promise<void>((resolve) => g.waiting.push(resolve));
  // The slot passes to the next waiter as it is, or is given back.
  return () => {
    const next = g.waiting.shift();
    if (next) next();
    else g.running--;
  };
}

/** A search request: the pattern, where to start and how many matches to return. */
export interface LogSearchRequest extends SearchPattern {
  /** Line position to scan from (0-based, markers included); default 0. */
  from?: number;
  /** Matches to return at most (1 to MAX_SEARCH_MATCHES); default DEFAULT_SEARCH_MATCHES. */
  limit?: number;
}

/** One matching line. */
export interface LogSearchMatch {
  /** The line's position (as `read` counts it). */
  position: number;
  /** The line's stored text (as masked when stored). */
  line: string;
  stderr: boolean;
  marker?: boolean;
  /** Where it matched, `[start, end)` in UTF-16 code units of `line`, at most 100. */
  ranges: MatchRange[];
}

/** One page of search results. */
export interface LogSearchPage {
  matches: LogSearchMatch[];
  /** The position to scan from next (the line after the last one scanned). */
  next: number;
  /** True when the scan reached the end of the lines stored when it started (a live job may store more). */
  end: boolean;
  /** Lines the request scanned. */
  scanned: number;
  /** The job's stored lines when the request started. */
  storedLines: number;
}

/**
 * Searches job `requestId`'s log from `request.from`. NOT_FOUND for an unknown job, INVALID_ARGUMENT for a bad
 * pattern, `from` or `limit`, UNAVAILABLE when MAX_RUNNING searches of the store run and MAX_WAITING wait. O(SCAN_BYTES + SCAN_LINES) a request at most, whatever the log's size; memory
 * O(READ_BYTES + RESULT_CHARS).
 *
 * @example
 * let from = 0;
 * for (;;) {
 *   const page = await searchJobLog(logs, id, { pattern: "FATAL", matchCase: true, from });
 *   for (const m of page.matches) console.log(m.position, m.line);
 *   if (page.end) break;
 *   from = page.next;
 * }
 */
export async function searchJobLog(
  logs: JobLogStore,
  requestId: string,
  request: LogSearchRequest,
): Promise<LogSearchPage> {
  const match = compileSearch(request);
  const from = request.from ?? 0;
  const limit = request.limit ?? DEFAULT_SEARCH_MATCHES;
  if (!Number.isSafeInteger(from) || from < 0) throw new RunnerDepotError("INVALID_ARGUMENT", "from must be ≥ 0");
  if (!Number.isSafeInteger(limit) || limit < 1 || limit > MAX_SEARCH_MATCHES)
    throw new RunnerDepotError("INVALID_ARGUMENT", `limit must be from 1 to ${MAX_SEARCH_MATCHES}`);
  const state = await logs.get(requestId);
  if (!state) throw new RunnerDepotError("NOT_FOUND", `no job ${requestId}`);
  const total = state.storedLines;
  const out: LogSearchPage = { matches: [], next: from, end: from >= total, scanned: 0, storedLines: total };
  if (out.end) return out;
  const release = await turn(logs);
  try {
    if (match.literal !== undefined && logs.findLines && !state.archived) {
      const fast = await scanFast(logs, requestId, match, from, total, limit, out);
      if (fast) return out;
    }
    await scanPages(logs, requestId, match, from, total, limit, out);
    return out;
  } finally {
    release();
  }
}

/** Adds a match to `out`; returns false once the page is full (count or characters). */
function take(
  out: LogSearchPage,
  position: number,
  line: StoredLine,
  ranges: MatchRange[],
  limit: number,
  chars: { n: number },
): boolean {
  const hit: LogSearchMatch = { position, line: line.line, stderr: line.stderr, ranges };
  if (line.marker) hit.marker = true;
  out.matches.push(hit);
  chars.n += line.line.length;
  return out.matches.length < limit && chars.n < RESULT_CHARS;
}

/** The store's fast path: candidate lines only, each checked here. False when the store has not the lines. */
async function scanFast(
  logs: JobLogStore,
  id: string,
  match: LineMatcher,
  from: number,
  total: number,
  limit: number,
  out: LogSearchPage,
): Promise<boolean> {
  const chars = { n: 0 };
  // The store's scan is the matching here: 4 MiB a call (indexOf's worst is O(bytes × needle)), timed in all.
  const deadline = performance.now() + MATCH_MS;
  let position = from;
  let budget = SCAN_BYTES;
  while (position < total && budget > 0) {
    const found = await logs.findLines!(id, match.literal!, position, {
      maxBytes: Math.min(budget, FAST_READ_BYTES),
      maxHits: limit - out.matches.length,
      ignoreCase: match.ignoreCase === true,
    });
    // The lines are not there (archived meanwhile): the read path takes over, or this page ends here.
    if (found === null) {
      if (position === from) return false;
      break;
    }
    let full = false;
    for (const hit of found.hits) {
      const ranges = match(hit.line.line, deadline);
      if ((ranges && !take(out, hit.position, hit.line, ranges, limit, chars)) || performance.now() > deadline) {
        out.next = hit.position + 1;
        full = true;
        break;
      }
    }
    if (!full) out.next = Math.min(found.next, total);
    out.scanned += out.next - position;
    budget -= found.bytes;
    if (full || found.next <= position || performance.now() > deadline) break;
    position = out.next;
  }
  out.end = out.next >= total;
  return true;
}

/** The read path: pages of lines through `read` (the archive's chunks for an archived job), each line checked. */
async function scanPages(
  logs: JobLogStore,
  id: string,
  match: LineMatcher,
  from: number,
  total: number,
  limit: number,
  out: LogSearchPage,
): Promise<void> {
  const chars = { n: 0 };
  // Time spent matching (not waiting for the store's reads): the request ends its page past MATCH_MS of it. Reads
  // start small and double, so a page that ends after a few costly lines has not read 2,048.
  let matching = 0;
  let readSize = FIRST_READ;
  let position = from;
  let bytes = 0;
  let lines = 0;
  scan: while (position < total && bytes < SCAN_BYTES && lines < SCAN_LINES) {
    const want = Math.min(readSize, total - position, SCAN_LINES - lines);
    readSize = Math.min(READ_PAGE, readSize * 2);
    const page = await logs.read(id, position, want, { maxBytes: READ_BYTES });
    if (page.length === 0) break;
    const t0 = performance.now();
    const deadline = t0 + MATCH_MS - matching;
    for (const line of page) {
      const ranges = match(line.line, deadline);
      const at = position;
      // A cut log's drop marker stands for itself and the dropped positions after it (log-tail.ts).
      position += 1 + (line.skipped ?? 0);
      lines++;
      bytes += line.line.length;
      if (ranges && !take(out, at, line, ranges, limit, chars)) break scan;
      if (performance.now() > deadline) break scan;
    }
    matching += performance.now() - t0;
  }
  out.next = position;
  out.scanned += lines;
  out.end = position >= total;
}

/** A 0/1 query flag; INVALID_ARGUMENT for anything else. */
function flag(params: URLSearchParams, name: string): boolean {
  const raw = params.get(name);
  if (raw === null || raw === "" || raw === "0") return false;
  if (raw === "1") return true;
  throw new RunnerDepotError("INVALID_ARGUMENT", `${name} must be 0 or 1`);
}

/** A whole-number query parameter within [min, max], else `fallback` when absent. */
function whole(params: URLSearchParams, name: string, fallback: number, min: number, max: number): number {
  const raw = params.get(name);
  if (raw === null || raw === "") return fallback;
  if (!/^\d{1,15}$/.test(raw)) throw new RunnerDepotError("INVALID_ARGUMENT", `${name} must be a whole number`);
  const value = Number(raw);
  if (value < min || value > max)
    throw new RunnerDepotError("INVALID_ARGUMENT", `${name} must be from ${min} to ${max}`);
  return value;
}

/**
 * The search request of an HTTP query (`?q=&regex=1&case=1&from=&limit=`, the console's and the control API's):
 * `case=1` matches case, `regex=1` reads `q` as an RE2 expression. The pattern's length is checked first, before
 * anything else is done. INVALID_ARGUMENT for a missing, empty or over-long `q` or a malformed parameter. O(query).
 *
 * @example
 * searchJobLog(logs, id, searchRequestOf(new URL(request.url).searchParams));
 */
export function searchRequestOf(params: URLSearchParams): LogSearchRequest {
  const pattern = params.get("q") ?? "";
  checkPattern(pattern);
  return {
    pattern,
    regex: flag(params, "regex"),
    matchCase: flag(params, "case"),
    from: whole(params, "from", 0, 0, Number.MAX_SAFE_INTEGER),
    limit: whole(params, "limit", DEFAULT_SEARCH_MATCHES, 1, MAX_SEARCH_MATCHES),
  };
}
