/**
 * What makes a catalog page cheap at any number of packages: the package states of each
 * full shard of the change sequence kept in one record, and a per-process cache of package
 * states checked against the sequence.
 * Why: docs/decisions/depot-catalog.md, "pages.ts: catalog pages per shard".
 */
import { readChanges, readShard, readShardUpdates, shardOf, SHARD, type ChangeEntry } from "./changes.js";
import { newestVersion, sortVersions } from "../package/names.js";
import { latestOf, readPackage, type PackageRecord } from "./packages.js";
import type { PackageStore } from "../ports.js";
import { mapLimit, remember, updateRecord } from "../store/records.js";

/** One package as the catalog shows it. */
export interface CatalogPackage {
  latest: string;
  versions: string[];
  updatedAt: string;
  /** Yanked versions and their reasons; absent when none is. */
  yanked?: Record<string, string>;
}

/** A package record as the catalog shows it. O(versions). */
export function catalogPackage(record: PackageRecord): CatalogPackage {
  const pkg: CatalogPackage = { latest: record.latest, versions: record.versions, updatedAt: record.updatedAt };
  const yanked = Object.entries(record.yanked ?? {});
  if (yanked.length > 0) pkg.yanked = Object.fromEntries(yanked.map(([v, mark]) => [v, mark.reason]));
  return pkg;
}

/** A package of a page, at the position of its first version's entry. */
export interface PagedPackage {
  position: number;
  name: string;
  pkg: CatalogPackage;
}

/** A `catpage/<shard>` record. */
interface PageRecord {
  shard: number;
  /** Every version sequenced at or below this position is in `packages`. */
  builtAt: number;
  /** Ascending by position. */
  packages: PagedPackage[];
}

/** Positions a page is brought forward by before it is stored again. */
const REWRITE_AFTER = 10 * SHARD;
/** Pages held per store (up to 1,000 packages each). */
const PAGE_CACHE = 32;
/** Package states held per store for `since` answers and the shard still filling. */
const PACKAGE_CACHE = 20_000;

/** The record key of a shard's page. */
export const pageKey = (shard: number) => `catpage/${String(shard).padStart(10, "0")}`;

interface Held {
  pages: Map<number, PageRecord>;
  /** The `builtAt` of each page as stored, as far as this process knows. */
  stored: Map<number, number>;
  packages: Map<string, { pkg: CatalogPackage; readAt: number }>;
}
const helds = new WeakMap<PackageStore, Held>();

function heldOf(store: PackageStore): Held {
  let held = helds.get(store);
  if (!held) helds.set(store, (held = { pages: new Map(), stored: new Map(), packages: new Map() }));
  return held;
}

/**
 * After an append at `position` (publishVersion's answer): when it filled its shard, packs
 * the shard's entries and builds its page. O(1,000) reads once per 1,000 appends.
 */
export async function compactAfter(store: PackageStore, position: number | null): Promise<void> {
  if (position === null) return;
  const { shard, last } = shardOf(position);
  if (position !== last) return;
  await buildPage(store, shard, position);
}

/**
 * Builds a full shard's page from its entries and the package records; `head` was seen before. O(packages created in
 * the shard) reads.
 */
async function buildPage(store: PackageStore, shard: number, head: number): Promise<PageRecord> {
  const firsts = (await readShard(store, shard)).filter((e) => e.first);
  const records = await mapLimit(firsts, 32, (e) => readPackage(store, e.name));
  const packages: PagedPackage[] = [];
  firsts.forEach((e, i) => {
    const record = records[i];
    if (record)
      packages.push({
        position: e.position,
        name: e.name,
        pkg: catalogPackage(record),
      });
  });
  const page: PageRecord = { shard, builtAt: head, packages };
  // Lazy: a page lost in a machine crash is rebuilt by the next reader. A newer one stays.
  await updateRecord<PageRecord>(
    store,
    pageKey(shard),
    (current) => (current && current.value.builtAt >= head ? undefined : page),
    { lazy: true },
  );
  remember(heldOf(store).pages, shard, page, PAGE_CACHE);
  return page;
}

/**
 * The packages of a full shard as of `head` (a head that was seen), ascending by position:
 * the held or stored page with the changes after its build applied, or a rebuilt one when
 * none is stored. A page brought forward by more than {@link REWRITE_AFTER} positions is
 * stored again, so another process or a restart does not repeat the work.
 */
export async function pageAt(store: PackageStore, shard: number, head: number): Promise<PagedPackage[]> {
  const held = heldOf(store);
  let page = held.pages.get(shard);
  if (!page) {
    page = (await store.getRecord<PageRecord>(pageKey(shard)))?.value ?? (await buildPage(store, shard, head));
    held.stored.set(shard, page.builtAt);
  }
  if (page.builtAt < head) {
    page = await bringForward(store, page, head);
    if (head - (held.stored.get(shard) ?? 0) > REWRITE_AFTER) {
      const written = page;
      await updateRecord<PageRecord>(
        store,
        pageKey(shard),
        (current) => (current && current.value.builtAt >= head ? undefined : written),
        { lazy: true },
      );
      held.stored.set(shard, head);
    }
  }
  remember(held.pages, shard, page, PAGE_CACHE);
  return page.packages;
}

/**
 * Applies the changes in (builtAt, head] to a page's packages. A package's first entry
 * lies in its own shard, at or below `builtAt`, so only later versions of its packages
 * (the shards' update entries) can change a page: O(shards since / held) reads, O(updates) work.
 */
async function bringForward(store: PackageStore, page: PageRecord, head: number): Promise<PageRecord> {
  const at = new Map(page.packages.map((p, i) => [p.name, i]));
  const packages = [...page.packages];
  const apply = (entry: ChangeEntry) => {
    const i = at.get(entry.name);
    if (i !== undefined && entry.position > page.builtAt && !entry.first)
      packages[i] = { ...packages[i]!, pkg: withVersion(packages[i]!.pkg, entry) };
  };
  let next = page.builtAt + 1;
  while (next <= head) {
    const { shard, last } = shardOf(next);
    if (last > head) {
      // The shard still filling: its entries one by one (held after the first read).
      for (const entry of (await readChanges(store, next - 1, head, { limit: SHARD })).entries) apply(entry);
      break;
    }
    for (const entry of await readShardUpdates(store, shard)) apply(entry);
    next = last + 1;
  }
  return { shard: page.shard, builtAt: head, packages };
}

function withVersion(pkg: CatalogPackage, entry: ChangeEntry): CatalogPackage {
  if (entry.yanked !== undefined) return withYank(pkg, entry);
  if (entry.removed) return withoutVersion(pkg, entry);
  // An attestation entry changes no version list.
  if (entry.attested !== undefined) return pkg;
  if (pkg.versions.includes(entry.version)) return pkg;
  const versions = sortVersions([...pkg.versions, entry.version]);
  const next: CatalogPackage = {
    latest: latestOf(versions, pkg.yanked),
    versions,
    updatedAt: entry.at > pkg.updatedAt ? entry.at : pkg.updatedAt,
  };
  if (pkg.yanked) next.yanked = pkg.yanked;
  return next;
}

/**
 * A removal entry applied (retention, depot/catalog/removal.ts): the version and its yank mark gone, `latest` chosen
 * again. Retention never removes a package's `latest`, so a package keeps at least one version.
 */
function withoutVersion(pkg: CatalogPackage, entry: ChangeEntry): CatalogPackage {
  if (!pkg.versions.includes(entry.version)) return pkg;
  const versions = pkg.versions.filter((v) => v !== entry.version);
  const yanked = Object.fromEntries(Object.entries(pkg.yanked ?? {}).filter(([v]) => v !== entry.version));
  const next: CatalogPackage = {
    latest: versions.length > 0 ? latestOf(versions, yanked) : pkg.latest,
    versions,
    updatedAt: entry.at > pkg.updatedAt ? entry.at : pkg.updatedAt,
  };
  if (Object.keys(yanked).length > 0) next.yanked = yanked;
  return next;
}

/** A yank entry applied: the version's reason set (or removed on an un-yank), `latest` chosen again. */
function withYank(pkg: CatalogPackage, entry: ChangeEntry): CatalogPackage {
  const yanked = Object.fromEntries(Object.entries(pkg.yanked ?? {}).filter(([v]) => v !== entry.version));
  if (entry.yanked !== null && entry.yanked !== undefined) yanked[entry.version] = entry.yanked;
  const next: CatalogPackage = {
    latest: latestOf(pkg.versions, yanked),
    versions: pkg.versions,
    updatedAt: pkg.updatedAt,
  };
  if (Object.keys(yanked).length > 0) next.yanked = yanked;
  return next;
}

/**
 * The current state of each named package, where `names` maps a name to the newest
 * position the answer must include for it, and `head` was seen before this call: a held
 * state read at or after that position serves, else the package record is read (and held).
 * O(names not held) reads.
 */
export async function packageStates(
  store: PackageStore,
  names: Map<string, number>,
  head: number,
): Promise<Map<string, CatalogPackage>> {
  const held = heldOf(store).packages;
  const out = new Map<string, CatalogPackage>();
  const missing: string[] = [];
  for (const [name, needed] of names) {
    const hit = held.get(name);
    if (hit && hit.readAt >= needed) out.set(name, hit.pkg);
    else missing.push(name);
  }
  const records = await mapLimit(missing, 32, (name) => readPackage(store, name));
  records.forEach((record, i) => {
    if (!record) return;
    const pkg = catalogPackage(record);
    out.set(missing[i]!, pkg);
    remember(held, missing[i]!, { pkg, readAt: head }, PACKAGE_CACHE);
  });
  return out;
}
