/**
 * How a record key maps to a file under `records/`: each `/`-separated segment
 * percent-encoded (so any key is a safe name: no '/', no leading '.', bounded length), and
 * the last segment suffixed `~` so a record file never clashes with a directory of longer
 * keys (`a/b` is `a/b~`, `a/b/c` is `a/b/c~`) nor with a `.lock` beside it.
 */
import { join } from "node:path";
import { RunnerDepotError } from "../../errors.js";

const SAFE_SEGMENT_CHAR = /[A-Za-z0-9._@+=-]/;
/** A segment that encodes to itself: safe characters only, not starting with '.'. */
const ALL_SAFE = /^[A-Za-z0-9_@+=-][A-Za-z0-9._@+=-]*$/;
/** Below the 255-byte name limit of common filesystems, leaving room for the `~.lock` suffix. */
const MAX_ENCODED_SEGMENT = 240;

/** The file of record `key` under `recordsDir`. O(key length). BAD_REQUEST for a segment too long. */
export function recordPath(recordsDir: string, key: string): string {
  const segments = key.split("/").map(encodeSegment);
  return join(recordsDir, ...segments.slice(0, -1), `${segments.at(-1)}~`);
}

/** Percent-encodes a key segment into a file name: no '/', no leading '.', no '~', bounded length. */
export function encodeSegment(segment: string): string {
  if (segment === "") return "%";
  // Most segments (ids, hashes, names, versions) need no escape: one regex test, no walk.
  if (segment.length <= MAX_ENCODED_SEGMENT && ALL_SAFE.test(segment)) return segment;
  let out = "";
  for (const [i, ch] of [...segment].entries()) {
    if (SAFE_SEGMENT_CHAR.test(ch) && !(i === 0 && ch === ".")) out += ch;
    else for (const byte of Buffer.from(ch, "utf8")) out += `%${byte.toString(16).toUpperCase().padStart(2, "0")}`;
  }
  if (out.length > MAX_ENCODED_SEGMENT) {
    throw new RunnerDepotError("BAD_REQUEST", `Record key segment too long for the fs store: ${segment.slice(0, 40)}…`);
  }
  return out;
}

/** The key segment a file or directory name stands for (inverse of encodeSegment). */
export function decodeSegment(name: string): string {
  return name === "%" ? "" : decodeURIComponent(name);
}
