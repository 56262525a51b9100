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

function invalid(what: string, raw: string, why: string): never {
  throw new RunnerDepotError("PATH_INVALID", `${what} ${JSON.stringify(raw.slice(0, 200))} ${why}`);
}

function checkSegments(what: string, raw: string, allowDotDot: boolean): string[] {
  if (raw.length === 0) invalid(what, raw, "is empty");
  if (raw.includes("\0")) invalid(what, raw, "contains NUL");
  // C0 controls, DEL and C1 controls: never part of a path a person can see or type.
  if (CONTROL_RE.test(raw)) invalid(what, raw, "contains a control character (C0, DEL or C1)");
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
