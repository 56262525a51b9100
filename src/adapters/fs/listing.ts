/**
 * Record listing of the fs store: the keys under a prefix, in byte order, a page at a time.
 * A directory cannot be read from a cursor on, so every page walks the whole prefix:
 * O(keys under the prefix) per page, plus sorting the keys after the cursor.
 */
import { readdir } from "node:fs/promises";
import { join } from "node:path";
import type { PackageStore } from "../../depot/ports.js";
import type { FsStoreContext } from "./context.js";
import { decodeSegment, encodeSegment } from "./record-keys.js";

/** Keys per page when the caller names no limit. */
const DEFAULT_PAGE = 1000;

/** The listing part of a PackageStore. */
export type FsListing = Pick<PackageStore, "listRecords">;

/** Makes the listing operation of one store. */
export function createFsListing(ctx: FsStoreContext): FsListing {
  return {
    async listRecords(prefix: string, page: { cursor?: string; limit?: number } = {}) {
      await ctx.init();
      // Only the directory of the prefix's complete segments is walked; the last,
      // partial segment filters the names found.
      const parts = prefix.split("/");
      const base = join(ctx.recordsDir, ...parts.slice(0, -1).map(encodeSegment));
      const keys: string[] = [];
      await collectKeys(base, parts.slice(0, -1).map((p) => `${p}/`).join(""), prefix, keys);
      return pageOf(keys, page.cursor, page.limit ?? DEFAULT_PAGE);
    },
  };
}

/** Appends to `keys` every record key under directory `path` (key prefix `keyPrefix`) that starts with `prefix`. */
async function collectKeys(path: string, keyPrefix: string, prefix: string, keys: string[]): Promise<void> {
  let entries;
  try {
    entries = await readdir(path, { withFileTypes: true });
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === "ENOENT" || code === "ENOTDIR") return;
    throw error;
  }
  for (const entry of entries) {
    if (entry.isDirectory()) {
      await collectKeys(join(path, entry.name), `${keyPrefix}${decodeSegment(entry.name)}/`, prefix, keys);
    } else if (entry.name.endsWith("~")) {
      const key = keyPrefix + decodeSegment(entry.name.slice(0, -1));
      if (key.startsWith(prefix)) keys.push(key);
    }
  }
}

/**
 * The page of `keys` after `cursor` in byte order. What it sorts is only the keys after
 * the cursor, each encoded once (not twice per comparison): a caller wanting every key
 * asks for one large page (depot/records.ts `allKeys`) and pays O(keys log keys) once, not once
 * per 1,000 keys.
 */
function pageOf(keys: string[], cursor: string | undefined, limit: number): { keys: string[]; cursor?: string } {
  const after = cursor === undefined ? undefined : Buffer.from(cursor);
  const candidates: Array<{ key: string; bytes: Buffer }> = [];
  for (const key of keys) {
    const bytes = Buffer.from(key);
    if (after === undefined || Buffer.compare(bytes, after) > 0) candidates.push({ key, bytes });
  }
  candidates.sort((a, b) => Buffer.compare(a.bytes, b.bytes));
  const slice = candidates.slice(0, limit).map((c) => c.key);
  return candidates.length > limit ? { keys: slice, cursor: slice.at(-1)! } : { keys: slice };
}
