/**
 * The record files of stores written before records moved into `records.db` (runner-depot 0.1.0 up to store
 * format 2's file layout): one JSON file `{ key, revision, value }` per key under `records/`, each
 * `/`-separated key segment percent-encoded and the last one suffixed `~` (`a/b` is `records/a/b~`). This
 * file only reads them, once, to import them (record-import.ts); nothing writes them any more but the fence
 * below.
 * Why: docs/decisions/depot-publish-durability.md, "legacy-records.ts: the record files of the old layout".
 */
import { randomUUID } from "node:crypto";
import { closeSync, fsyncSync, openSync, readdirSync, readFileSync, renameSync, writeSync } from "node:fs";
import { join } from "node:path";
import { RunnerDepotError } from "../../errors.js";

/** The format number the fence shows code that reads record files (which reads format ≤ 2). */
const FENCE_FORMAT = 3;

/** A record file's content. */
export interface LegacyRecord {
  key: string;
  revision: string;
  value: unknown;
}

/** How far the move into records.db went (see the top of this file); absent in fences written before it was kept. */
type FenceState = "importing" | "imported";

/** The fence's content: a `format` record plus the record it replaced. */
interface FenceFile extends LegacyRecord {
  imported: LegacyRecord | null;
  state?: FenceState;
}

/**
 * Reads a record file as the file-layout reader did: null when absent or torn (empty,
 * NUL-filled, or marked lazy by a leading space and cut short: a lazy create or losable
 * swap a machine crash cut, which read as absent), INTERNAL for any other text that is
 * not a record (a durable record damaged outside the store). O(file size).
 */
export function readLegacyRecord(file: string): LegacyRecord | null {
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return null;
    throw error;
  }
  let parsed: LegacyRecord | null = null;
  try {
    parsed = JSON.parse(text) as LegacyRecord | null;
  } catch {
    // Judged below.
  }
  if (parsed !== null && typeof parsed === "object" && typeof parsed.revision === "string") return parsed;
  if (text === "" || text.startsWith(" ") || text.charCodeAt(0) === 0) return null;
  throw new RunnerDepotError(
    "INTERNAL",
    `A record file of the fs store is damaged (it is neither a record nor a torn lazy create): ${file}`,
  );
}

/**
 * Every record file under `recordsDir` with the key it stands for (lock files, stale-lock
 * asides and anything else not ending in `~` are skipped, and so is a name the file
 * layout's encoder could not have written, such as `50%~`: it is no record, only a stray
 * file, and must not stop the import). O(files), depth-first.
 */
export function legacyRecordFiles(recordsDir: string): Array<{ key: string; file: string }> {
  const found: Array<{ key: string; file: string }> = [];
  const walk = (path: string, keyPrefix: string) => {
    let entries;
    try {
      entries = readdirSync(path, { withFileTypes: true });
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code;
      if (code === "ENOENT" || code === "ENOTDIR") return;
      throw error;
    }
    for (const entry of entries) {
      if (entry.isDirectory()) {
        const segment = decodeSegment(entry.name);
        if (segment !== null) walk(join(path, entry.name), `${keyPrefix}${segment}/`);
      } else if (entry.isFile() && entry.name.endsWith("~")) {
        const segment = decodeSegment(entry.name.slice(0, -1));
        if (segment !== null) found.push({ key: keyPrefix + segment, file: join(path, entry.name) });
      }
    }
  };
  walk(recordsDir, "");
  return found;
}

/**
 * The key segment a file or directory name stands for (`%` is the empty segment); null for a name no key encodes to.
 */
function decodeSegment(name: string): string | null {
  if (name === "%") return "";
  try {
    return decodeURIComponent(name);
  } catch {
    return null; // URIError: not percent-encoding, so not a name the file layout wrote
  }
}

/** The fence's path: where the file-layout code reads the `format` record. */
export function fencePath(recordsDir: string): string {
  return join(recordsDir, "format~");
}

/**
 * The `format` record to import from `records/format~`: the fence's `imported` when the
 * fence is in place already (with its state; a fence without one counts as `importing`),
 * else the file itself (null when absent or torn).
 */
export function readFormatUnderFence(recordsDir: string): { original: LegacyRecord | null; fence: FenceState | null } {
  const current = readLegacyRecord(fencePath(recordsDir));
  if (current && "imported" in current) {
    const fence = current as FenceFile;
    return { original: fence.imported, fence: fence.state === "imported" ? "imported" : "importing" };
  }
  return { original: current, fence: null };
}

/**
 * Writes the fence whole and flushed (temp file, fsync, rename, directory fsync; inline:
 * twice per store), keeping `original`. `sync` false skips the fsyncs (unsafeNoSync).
 */
export function writeFence(
  recordsDir: string,
  original: LegacyRecord | null,
  state: FenceState,
  sync: boolean,
  now: Date,
): void {
  const fence: FenceFile = {
    key: "format",
    revision: randomUUID(),
    value: {
      format: FENCE_FORMAT,
      storeId: "records-in-records.db",
      createdAt: now.toISOString(),
      note: "records are in records.db; this directory needs a newer runner-depot",
    },
    imported: original,
    state,
  };
  const tmp = join(recordsDir, `.fence-${process.pid}-${randomUUID()}`);
  const fd = openSync(tmp, "wx");
  try {
    const bytes = Buffer.from(JSON.stringify(fence));
    for (let at = 0; at < bytes.length;) at += writeSync(fd, bytes, at, bytes.length - at);
    if (sync) fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
  renameSync(tmp, fencePath(recordsDir));
  if (sync) {
    const dirFd = openSync(recordsDir, "r");
    try {
      fsyncSync(dirFd);
    } finally {
      closeSync(dirFd);
    }
  }
}
