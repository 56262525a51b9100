/**
 * Paging of `GET /summary/{trans_id}`: a transaction of 100,000 items is answered a page
 * at a time (`limit`, an opaque `after` cursor, `next` in the body and a `Link: rel="next"`
 * header), so one request costs O(page), not O(transaction).
 */
import { RunnerDepotError } from "../../errors.js";
import type { ManifestItem } from "../package/archive.js";
import type { PackageStore } from "../ports.js";
import { keys, mapLimit, type ItemRecord, type TransactionRecord } from "../store/records.js";
import { compareUtf8 } from "../package/paths.js";
import { withoutState } from "./lifecycle.js";

/** Items per summary page when `limit` is not given. */
const DEFAULT_SUMMARY_PAGE = 1_000;
/** The largest `limit` accepted. */
const MAX_SUMMARY_PAGE = 10_000;

/** Which page of a summary a request asks for. */
interface SummaryPage {
  limit: number;
  /** The cursor of the previous page's `next`; absent for the first page. */
  after?: string;
}

/** Reads `limit` and `after` from the query; BAD_REQUEST when malformed. */
export function summaryPage(request: Request): SummaryPage {
  const query = new URL(request.url).searchParams;
  const rawLimit = query.get("limit");
  let limit = DEFAULT_SUMMARY_PAGE;
  if (rawLimit !== null) {
    if (!/^\d{1,6}$/.test(rawLimit) || Number(rawLimit) < 1 || Number(rawLimit) > MAX_SUMMARY_PAGE) {
      throw new RunnerDepotError("BAD_REQUEST", `limit must be an integer from 1 to ${MAX_SUMMARY_PAGE}`);
    }
    limit = Number(rawLimit);
  }
  const after = query.get("after") ?? undefined;
  if (after !== undefined && !/^(?:[0-9a-f]{64}|\d{1,9})$/.test(after)) {
    throw new RunnerDepotError("BAD_REQUEST", "after must be the `next` cursor of a previous summary page");
  }
  return { limit, after };
}

/**
 * One page of an open transaction's items, in the store's key order (a hash of the path,
 * so stable while items are added, but not archive order); within the page, sorted by
 * path. `next` is the cursor of the following page, null on the last. Items still being
 * added (`pending`) are not shown, so a page may hold fewer than `limit`.
 * O(limit) record reads plus one key listing.
 */
export async function summaryItems(
  store: PackageStore,
  trans: TransactionRecord,
  page: SummaryPage,
): Promise<{ items: ItemRecord[]; next: string | null }> {
  const prefix = keys.items(trans.id);
  if (page.after !== undefined && !/^[0-9a-f]{64}$/.test(page.after)) {
    throw new RunnerDepotError("BAD_REQUEST", "after is not a cursor of this transaction's summary");
  }
  const listed = await store.listRecords(prefix, {
    cursor: page.after === undefined ? undefined : prefix + page.after,
    limit: page.limit,
  });
  const records = await mapLimit(listed.keys, 32, async (key) => (await store.getRecord<ItemRecord>(key))?.value);
  const items = records
    .filter((i): i is ItemRecord => i !== undefined && (i.state ?? "added") === "added")
    .map(withoutState)
    .sort((a, b) => compareUtf8(a.path, b.path));
  const last = listed.keys.at(-1);
  return { items, next: listed.cursor !== undefined && last !== undefined ? last.slice(prefix.length) : null };
}

/** One page of a committed version's manifest items, in archive order; the cursor is an offset. */
export function pageOfManifest(all: ManifestItem[], page: SummaryPage): { items: ManifestItem[]; next: string | null } {
  if (page.after !== undefined && !/^\d{1,9}$/.test(page.after)) {
    throw new RunnerDepotError("BAD_REQUEST", "after is not a cursor of this transaction's summary");
  }
  const start = page.after === undefined ? 0 : Number(page.after);
  const end = start + page.limit;
  return { items: all.slice(start, end), next: end < all.length ? String(end) : null };
}

/** The JSON answer of a summary page, with `Link: <…?after=…>; rel="next"` when there is more. */
export function pagedJson(request: Request, next: string | null, body: unknown): Response {
  const headers: Record<string, string> = { "Content-Type": "application/json", "Cache-Control": "no-store" };
  if (next !== null) {
    const url = new URL(request.url);
    url.searchParams.set("after", next);
    // Relative to the request's own path: the Host header is never reflected.
    headers.Link = `<${url.pathname}${url.search}>; rel="next"`;
  }
  return new Response(JSON.stringify(body), { status: 200, headers });
}
