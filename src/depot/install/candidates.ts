/**
 * A package's versions sorted once, and the versions satisfying a set of ranges found by
 * binary search of the window the ranges bound, newest first and lazily: the resolver's
 * cost per candidate no longer grows with the package's version count (issue 30, item 5).
 */
import semver, { Comparator, Range, SemVer } from "semver";

/** One valid version: the depot's spelling and its parse. */
interface Indexed {
  text: string;
  parsed: SemVer;
}

/** A package's valid versions, distinct spellings, newest first (build metadata breaks ties). */
export type VersionIndex = readonly Indexed[];

/**
 * Parses and sorts `versions` once (invalid ones are dropped).
 *
 * @example
 * const index = indexVersions(["1.0.0", "2.0.0", "junk"]); // 2.0.0, 1.0.0
 */
export function indexVersions(versions: readonly string[]): VersionIndex {
  const out: Indexed[] = [];
  for (const text of new Set(versions)) {
    if (typeof text !== "string" || semver.valid(text) === null) continue;
    out.push({ text, parsed: new SemVer(text) });
  }
  return out.sort((a, b) => semver.compareBuild(b.parsed, a.parsed));
}

/**
 * The versions of `index` satisfying every range, newest first, generated lazily. Prereleases
 * take part only when no release satisfies (the depot's "newest" rule), as in satisfyingVersions.
 *
 * @example
 * for (const version of candidates(indexVersions(all), ["^1.2.0", ">=1.3.0"])) tryIt(version);
 */
export function* candidates(index: VersionIndex, ranges: readonly string[]): Generator<string> {
  let any = false;
  for (const v of windowOf(index, ranges, false)) {
    any = true;
    yield v;
  }
  if (!any) yield* windowOf(index, ranges, true);
}

function* windowOf(index: VersionIndex, ranges: readonly string[], includePrerelease: boolean): Generator<string> {
  const parsed = ranges.map((r) => new Range(r, { includePrerelease }));
  let lo: SemVer | null = null;
  let hi: SemVer | null = null;
  for (const range of parsed) {
    const b = boundsOf(range);
    if (b.lo && (!lo || b.lo.compare(lo) > 0)) lo = b.lo;
    if (b.hi && (!hi || b.hi.compare(hi) < 0)) hi = b.hi;
  }
  // Newest first: skip what is above `hi`, stop below `lo`; check each in between.
  const start = hi ? firstIndex(index, (v) => v.compare(hi!) <= 0) : 0;
  for (let i = start; i < index.length; i++) {
    const v = index[i]!.parsed;
    if (lo && v.compare(lo) < 0) return;
    if (parsed.every((r) => r.test(v))) yield index[i]!.text;
  }
}

/** The first index whose version passes `ok` (a predicate false then true along the index). */
function firstIndex(index: VersionIndex, ok: (v: SemVer) => boolean): number {
  let a = 0;
  let b = index.length;
  while (a < b) {
    const mid = (a + b) >>> 1;
    if (ok(index[mid]!.parsed)) b = mid;
    else a = mid + 1;
  }
  return a;
}

/** Inclusive outer bounds of a range (a superset of it): null where it is open. */
function boundsOf(range: Range): { lo: SemVer | null; hi: SemVer | null } {
  let lo: SemVer | null = null;
  let hi: SemVer | null = null;
  let openLo = false;
  let openHi = false;
  for (const set of range.set) {
    let setLo: SemVer | null = null;
    let setHi: SemVer | null = null;
    for (const c of set as readonly Comparator[]) {
      if (c.value === "") continue; // `*`: no bound
      const op = c.operator;
      if (op === "" || op === ">=" || op === ">") if (!setLo || c.semver.compare(setLo) > 0) setLo = c.semver;
      if (op === "" || op === "<=" || op === "<") if (!setHi || c.semver.compare(setHi) < 0) setHi = c.semver;
    }
    if (setLo === null) openLo = true;
    else if (!lo || setLo.compare(lo) < 0) lo = setLo;
    if (setHi === null) openHi = true;
    else if (!hi || setHi.compare(hi) > 0) hi = setHi;
  }
  return { lo: openLo ? null : lo, hi: openHi ? null : hi };
}
