/**
 * `GET /catalog`: pages of packages and the change feed, answered from the change
 * sequence (depot/catalog/changes.ts) and the per-package records (packages.ts).
 * Why: docs/decisions/depot-catalog.md, "catalog-route.ts: the catalog routes and their cost".
 */
import { RunnerDepotError } from "../../errors.js";
import { packageStates, pageAt, type CatalogPackage, type PagedPackage } from "./pages.js";
import { readChange, readChanges, SHARD, shardOf } from "./changes.js";
import type { PackageStore } from "../ports.js";
import { emptyRecord, setOwn } from "../store/records.js";

/** Packages per catalog page when the request names no `limit`. */
const CATALOG_PAGE_DEFAULT = 1000;
/** The largest `limit` a catalog request may ask for. */
const CATALOG_PAGE_MAX = 5000;

export type { CatalogPackage };

/** A parsed catalog query. */
type CatalogQuery = { kind: "page"; limit: number; after: number } | { kind: "since"; limit: number; since: number };

/** Parses `limit`, `after` and `since`; BAD_REQUEST for anything malformed. */
export function parseCatalogQuery(params: URLSearchParams): CatalogQuery {
  const one = (name: string) => {
    const all = params.getAll(name);
    if (all.length > 1) throw new RunnerDepotError("BAD_REQUEST", `${name} may be given once`);
    return all[0];
  };
  const limitText = one("limit");
  let limit = CATALOG_PAGE_DEFAULT;
  if (limitText !== undefined) {
    if (!/^[0-9]{1,6}$/.test(limitText) || Number(limitText) < 1 || Number(limitText) > CATALOG_PAGE_MAX) {
      throw new RunnerDepotError("BAD_REQUEST", `limit must be an integer from 1 to ${CATALOG_PAGE_MAX}`);
    }
    limit = Number(limitText);
  }
  const since = one("since");
  const after = one("after");
  if (since !== undefined && after !== undefined)
    throw new RunnerDepotError("BAD_REQUEST", "Give either since or after, not both");
  if (since !== undefined) {
    if (!/^[0-9]{1,15}$/.test(since))
      throw new RunnerDepotError("BAD_REQUEST", "since must be a position: a whole number from a catalog answer");
    return { kind: "since", limit, since: Number(since) };
  }
  return { kind: "page", limit, after: after === undefined ? 0 : decodeCursor(after) };
}

/** Cursors are opaque to clients: `c` plus the position in base 36. */
function encodeCursor(position: number): string {
  return `c${position.toString(36)}`;
}

function decodeCursor(text: string): number {
  const match = /^c([0-9a-z]{1,11})$/.exec(text);
  const position = match ? Number.parseInt(match[1]!, 36) : Number.NaN;
  if (!Number.isSafeInteger(position))
    throw new RunnerDepotError("BAD_REQUEST", "after is not a cursor from a catalog answer's next link");
  return position;
}

/** The catalog's strong ETag at a sequence head. */
export function catalogEtag(storeId: string, head: number): string {
  return `"${storeId.slice(0, 8)}-${head}"`;
}

/**
 * The highest position a catalog request says its client has seen: its `since`, and the
 * head in any of its `If-None-Match` tags of this store. A router whose held head is
 * behind it probes the store first (depot/catalog/head.ts). O(header length).
 */
export function catalogFloor(query: CatalogQuery, ifNoneMatch: string | null, storeId: string): number {
  let floor = query.kind === "since" ? query.since : 0;
  const prefix = `"${storeId.slice(0, 8)}-`;
  for (const tag of (ifNoneMatch ?? "").slice(0, 8192).split(",")) {
    const text = tag.trim().replace(/^W\//, "");
    if (!text.startsWith(prefix) || !text.endsWith('"')) continue;
    const head = text.slice(prefix.length, -1);
    if (/^[0-9]{1,15}$/.test(head)) floor = Math.max(floor, Number(head));
  }
  return floor;
}

/** A catalog answer: body and, when more remain, the query of the next page. */
interface CatalogAnswer {
  body: Record<string, unknown>;
  next?: string;
}

/** Answers a catalog query at sequence head `head`. */
export async function answerCatalog(store: PackageStore, query: CatalogQuery, head: number): Promise<CatalogAnswer> {
  if (query.kind === "since") return answerSince(store, query, head);
  // One more than the page: a next link only when another package really follows.
  const found = await pagedPackages(store, query.after, query.limit + 1, head);
  const listed = found.slice(0, query.limit);
  const packages = emptyRecord<CatalogPackage>();
  for (const p of listed) setOwn(packages, p.name, p.pkg);
  const body = { packages, count: listed.length, position: head, updatedAt: await updatedAt(store, head) };
  const more = found.length > query.limit;
  return { body, next: more ? `limit=${query.limit}&after=${encodeCursor(listed.at(-1)!.position)}` : undefined };
}

/**
 * Up to `want` packages created after position `after`, ascending.
 * Why: docs/decisions/depot-catalog.md, "catalog-route.ts: pagedPackages".
 */
async function pagedPackages(store: PackageStore, after: number, want: number, head: number): Promise<PagedPackage[]> {
  const found: PagedPackage[] = [];
  let next = after + 1;
  while (found.length < want && next <= head) {
    const { shard, first, last } = shardOf(next);
    if (last <= head) {
      for (const p of await pageAt(store, shard, head)) if (p.position >= next && found.length < want) found.push(p);
      next = last + 1;
      continue;
    }
    // The shard still filling: all its entries (at most 999), for the newest position of each name.
    const { entries } = await readChanges(store, first - 1, head, { limit: SHARD });
    const newest = new Map<string, number>();
    for (const e of entries) newest.set(e.name, e.position);
    const created = entries.filter((e) => e.first && e.position >= next).slice(0, want - found.length);
    const states = await packageStates(store, new Map(created.map((e) => [e.name, newest.get(e.name)!])), head);
    for (const e of created) {
      const pkg = states.get(e.name);
      if (pkg) found.push({ position: e.position, name: e.name, pkg });
    }
    break;
  }
  return found;
}

/**
 * The changes after `since`: O(changes) entries (held after the first read) and the named packages' states (held while
 * no later entry names them).
 */
async function answerSince(
  store: PackageStore,
  query: { limit: number; since: number },
  head: number,
): Promise<CatalogAnswer> {
  if (query.since > head) {
    throw new RunnerDepotError(
      "BAD_REQUEST",
      `since=${query.since} is past this depot's newest position ${head}; start over without since`,
    );
  }
  const { entries, scannedTo } = await readChanges(store, query.since, head, { limit: query.limit });
  const newest = new Map<string, number>();
  for (const e of entries) newest.set(e.name, e.position);
  const states = await packageStates(store, newest, head);
  const packages = emptyRecord<CatalogPackage>();
  for (const [name, pkg] of states) setOwn(packages, name, pkg);
  // A yank entry says so: `yanked` is its reason, or null on an un-yank (depot/catalog/yank.ts); an
  // attestation entry names its bundle's digest in `attested` (depot/store/attestations.ts).
  // A removal entry (retention: depot/catalog/removal.ts) carries `removed: true`.
  const changes = entries.map((e) =>
    e.yanked !== undefined
      ? { position: e.position, name: e.name, version: e.version, yanked: e.yanked }
      : e.attested !== undefined
        ? { position: e.position, name: e.name, version: e.version, attested: e.attested }
        : e.removed
          ? { position: e.position, name: e.name, version: e.version, removed: true }
          : { position: e.position, name: e.name, version: e.version },
  );
  const position = entries.length > 0 ? scannedTo : query.since;
  const body = { packages, count: states.size, position, changes, updatedAt: await updatedAt(store, position) };
  return { body, next: position < head ? `since=${position}&limit=${query.limit}` : undefined };
}

async function updatedAt(store: PackageStore, position: number): Promise<string | null> {
  return position === 0 ? null : ((await readChange(store, position))?.at ?? null);
}
