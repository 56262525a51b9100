/** `GET /version/<name>` in pages bounded by count and bytes (issue 30 item 4; docs/depot-api.md). */
import { PULLED } from "../mirror/mirror.js";
import { RunnerDepotError } from "../../errors.js";
import { parseVersion } from "../package/names.js";
import type { PackageStore } from "../ports.js";
import { keys, type VersionRecord } from "../store/records.js";

/**
 * Versions per page without `limit`, and the largest `limit`: the default `limits.versions`, so a
 * client of the seed's API that reads one answer sees every version unless the bytes cut the page.
 */
export const VERSION_PAGE_DEFAULT = 4000;
export const VERSION_PAGE_MAX = 4000;
/** A page stops after the version that takes its JSON past this many bytes (it always holds one). */
export const VERSION_PAGE_BYTES = 1024 * 1024;
/** Version records read at once: a record may hold up to ~4 MB of attributes. */
const READ_BATCH = 4;

/** One version as `/version` lists it. */
export interface VersionEntry {
  version: string;
  publishedAt: string;
  digest: string;
  size: number;
  itemCount: number;
  attributes: Record<string, string>;
  /** Present on a yanked version: why, and since when. */
  yanked?: { reason: string; at: string };
  /** Present on a version a pull-through depot copied from its upstream on a miss (held here since). */
  pulled?: true;
}

/** The `limit` and `after` query of `/version/<name>`. */
export function parseVersionQuery(params: URLSearchParams): { limit: number; after?: string } {
  const one = (name: string) => {
    const all = params.getAll(name);
    if (all.length > 1) throw new RunnerDepotError("BAD_REQUEST", `${name} may be given once`);
    return all[0];
  };
  const limitText = one("limit");
  let limit = VERSION_PAGE_DEFAULT;
  if (limitText !== undefined) {
    if (!/^[0-9]{1,6}$/.test(limitText) || Number(limitText) < 1 || Number(limitText) > VERSION_PAGE_MAX)
      throw new RunnerDepotError("BAD_REQUEST", `limit must be an integer from 1 to ${VERSION_PAGE_MAX}`);
    limit = Number(limitText);
  }
  const after = one("after");
  return after === undefined ? { limit } : { limit, after: parseVersion(after) };
}

/**
 * The page of `versions` (oldest first) after `after`: at most `limit` entries, cut after
 * the one that takes the page past {@link VERSION_PAGE_BYTES}. `next` is the `after` of the
 * following page, absent on the last.
 */
export async function versionPage(
  store: PackageStore,
  name: string,
  versions: readonly string[],
  query: { limit: number; after?: string },
  yanked?: Record<string, { reason: string; at: string }>,
): Promise<{ entries: VersionEntry[]; next?: string }> {
  let start = 0;
  if (query.after !== undefined) {
    const at = versions.indexOf(query.after);
    if (at === -1) throw new RunnerDepotError("VERSION_NOT_FOUND", `No version ${query.after} of ${name}`);
    start = at + 1;
  }
  const entries: VersionEntry[] = [];
  let bytes = 0;
  let index = start;
  while (index < versions.length && entries.length < query.limit && bytes <= VERSION_PAGE_BYTES) {
    const batch = versions.slice(index, Math.min(index + READ_BATCH, start + query.limit, versions.length));
    const records = await Promise.all(batch.map((v) => store.getRecord<VersionRecord>(keys.version(name, v))));
    for (const record of records) {
      index++;
      if (record === null) continue;
      const v = record.value;
      const entry: VersionEntry = {
        version: v.version,
        publishedAt: v.publishedAt,
        digest: v.digest,
        size: v.size,
        itemCount: v.itemCount,
        attributes: v.attributes,
      };
      const mark = yanked && Object.hasOwn(yanked, v.version) ? yanked[v.version]! : undefined;
      if (mark) entry.yanked = { reason: mark.reason, at: mark.at };
      if (v.transaction.startsWith(`${PULLED}:`)) entry.pulled = true;
      entries.push(entry);
      bytes += Buffer.byteLength(JSON.stringify(entry));
      if (bytes > VERSION_PAGE_BYTES) break;
    }
  }
  return index < versions.length ? { entries, next: versions[index - 1] } : { entries };
}
