/**
 * Item paths and link targets: relative POSIX paths, normalised, never escaping the
 * package root (docs/depot-api.md, §8 "POST /add").
 */
import { RunnerDepotError } from "../../errors.js";

/** Longest accepted item path, in UTF-8 bytes (PATH_MAX on Linux). */
export const MAX_PATH_BYTES = 4096;
/** Longest accepted path segment, in UTF-8 bytes (NAME_MAX on common filesystems). */
const MAX_SEGMENT_BYTES = 255;
/** The archive prefix the depot keeps for itself (manifest, licences). */
export const RESERVED_PREFIX = ".pkg";

/** C0 (U+0000–U+001F), DEL (U+007F) and C1 (U+0080–U+009F) controls. */
export const CONTROL_RE = /[\u0000-\u001f\u007f-\u009f]/;

/**
 * Bidirectional-text controls (U+061C, U+200E–U+200F, U+202A–U+202E, U+2066–U+2069), zero-width
 * and invisible characters (U+200B–U+200D, U+2060–U+2064, U+FEFF, U+180E) and the line and
 * paragraph separators (U+2028–U+2029): they make a path display as another (`a\u202etxt.exe`
 * shows as `aexe.txt`), so no path holds them (issue 30 item 9).
 */
export const INVISIBLE_RE = /[\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u2069\ufeff]/;

function invalid(what: string, raw: string, why: string): never {
  throw new RunnerDepotError("PATH_INVALID", `${what} ${JSON.stringify(raw.slice(0, 200))} ${why}`);
}

function checkSegments(what: string, raw: string, allowDotDot: boolean): string[] {
  if (raw.length === 0) invalid(what, raw, "is empty");
  if (raw.includes("\0")) invalid(what, raw, "contains NUL");
  // C0 controls, DEL and C1 controls: never part of a path a person can see or type.
  if (CONTROL_RE.test(raw)) invalid(what, raw, "contains a control character (C0, DEL or C1)");
  if (INVISIBLE_RE.test(raw))
    invalid(what, raw, "contains a bidirectional-text control or an invisible character (e.g. U+202E, U+200B)");
  if (raw.includes("\\")) invalid(what, raw, "contains a backslash");
  if (raw.startsWith("/")) invalid(what, raw, "is absolute");
  if (Buffer.byteLength(raw) > MAX_PATH_BYTES) invalid(what, raw, `is longer than ${MAX_PATH_BYTES} bytes`);
  const segments = raw.split("/");
  for (const segment of segments) {
    if (segment === "") invalid(what, raw, "has an empty segment");
    if (segment === ".") invalid(what, raw, "has a '.' segment (paths must be normalised)");
    if (segment === ".." && !allowDotDot) invalid(what, raw, "has a '..' segment");
    if (Buffer.byteLength(segment) > MAX_SEGMENT_BYTES)
      invalid(what, raw, `has a segment longer than ${MAX_SEGMENT_BYTES} bytes`);
  }
  return segments;
}

/**
 * Validates an item path (already percent-decoded) and returns it NFC-normalised;
 * PATH_INVALID for `..`, absolute paths, NUL and other control characters (C0, DEL, C1),
 * backslashes, empty segments, `.pkg/`.
 * The one path rule: the server applies it to uploads, the installer to archives.
 */
export function parseItemPath(raw: string, what = "Path"): string {
  const path = raw.normalize("NFC");
  const segments = checkSegments(what, path, false);
  if (segments[0]!.toLowerCase() === RESERVED_PREFIX)
    invalid(what, path, `uses the reserved '${RESERVED_PREFIX}/' prefix`);
  return path;
}

/**
 * Validates a link target relative to the link's own directory and returns it;
 * PATH_INVALID when it is absolute or, resolved lexically, leaves the package root.
 */
export function parseLinkTarget(linkPath: string, raw: string, what = "Link target"): string {
  const target = raw.normalize("NFC");
  const segments = checkSegments(what, target, true);
  const resolved = linkPath.split("/").slice(0, -1);
  for (const segment of segments) {
    if (segment === "..") {
      if (resolved.length === 0) invalid(what, target, `of ${JSON.stringify(linkPath)} leaves the package root`);
      resolved.pop();
    } else {
      resolved.push(segment);
    }
  }
  if (resolved.length > 0 && resolved[0]!.toLowerCase() === RESERVED_PREFIX) {
    invalid(what, target, `of ${JSON.stringify(linkPath)} points into the reserved '${RESERVED_PREFIX}/' directory`);
  }
  return target;
}

/**
 * An item path as the depot stores it: valid by {@link parseItemPath} and already
 * NFC-normalised (the server never produces another form); PATH_INVALID otherwise.
 */
export function checkStoredItemPath(raw: string, what = "Path"): string {
  if (parseItemPath(raw, what) !== raw) invalid(what, raw, "is not NFC-normalised");
  return raw;
}

/** A link target as the depot stores it: valid by {@link parseLinkTarget} and already NFC-normalised. */
export function checkStoredLinkTarget(linkPath: string, raw: string, what = "Link target"): string {
  if (parseLinkTarget(linkPath, raw, what) !== raw) invalid(what, raw, "is not NFC-normalised");
  return raw;
}

/**
 * Pairs of paths (items and their ancestors) equal but for case, which one case-insensitive
 * filesystem (macOS, Windows) would write to the same place: `README` and `readme`,
 * `Docs/a` and `docs/b`. Each pair once, the first seen first. O(paths × depth).
 */
export function caseCollisions(paths: Iterable<string>): Array<[string, string]> {
  const seen = new Map<string, string>();
  const pairs: Array<[string, string]> = [];
  const reported = new Set<string>();
  for (const path of paths) {
    for (const p of [...ancestorsOf(path), path]) {
      const folded = p.toLowerCase();
      const first = seen.get(folded);
      if (first === undefined) seen.set(folded, p);
      else if (first !== p && !reported.has(`${first}\0${p}`)) {
        reported.add(`${first}\0${p}`);
        pairs.push([first, p]);
      }
    }
  }
  return pairs;
}

/** The ancestors of a path, shortest first: `a/b/c` → `a`, `a/b`. */
export function ancestorsOf(path: string): string[] {
  const segments = path.split("/");
  const out: string[] = [];
  for (let i = 1; i < segments.length; i++) out.push(segments.slice(0, i).join("/"));
  return out;
}

/** Compares two strings by the byte order of their UTF-8 encodings (archive order). */
export function compareUtf8(a: string, b: string): number {
  return Buffer.compare(Buffer.from(a, "utf8"), Buffer.from(b, "utf8"));
}
