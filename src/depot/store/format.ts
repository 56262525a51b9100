/**
 * The store's format version and the upgrade of older stores.
 * Why: docs/decisions/depot-catalog.md, "format.ts: store formats and their upgrade".
 */
import { randomUUID } from "node:crypto";
import { RunnerDepotError } from "../../errors.js";
import { sortVersions } from "../package/names.js";
import { compactAfter } from "../catalog/pages.js";
import { publishVersion } from "../catalog/packages.js";
import type { PackageStore } from "../ports.js";
import { allKeys, keys, own, type VersionRecord } from "./records.js";

/** The store format this code reads and writes. */
export const STORE_FORMAT = 2;

/** The `format` record. */
export interface FormatRecord {
  format: number;
  /** A random id of this store: ETags of the catalog carry it, so two depots never share one. */
  storeId: string;
  createdAt: string;
  /** Set by an upgrade: the format it started from. */
  upgradedFrom?: number;
  upgradedAt?: string;
}

/** What {@link upgradeStore} did. */
interface UpgradeReport {
  from: number;
  to: number;
  /** Versions listed in package records and appended to the change sequence. */
  versions: number;
}

/** The `catalog` record of format 1. */
interface LegacyCatalog {
  packages: Record<string, { versions: string[]; updatedAt: string }>;
}

const CLAIM_KEY = "format/upgrading";
const CLAIM_STALE_MS = 10 * 60_000;

/**
 * Checks the store's format, creating the record on a new store and upgrading an older
 * one; STORE_FORMAT_UNSUPPORTED for a store newer than this code.
 *
 * @example
 * const format = await openStoreFormat(createFsStore("/var/lib/depot"), () => new Date());
 */
export async function openStoreFormat(store: PackageStore, now: () => Date = () => new Date()): Promise<FormatRecord> {
  for (let attempt = 0; ; attempt++) {
    const current = (await store.getRecord<FormatRecord>(keys.format))?.value;
    if (current) return checkFormat(current);
    if (!(await holdsFormat1(store))) {
      const fresh: FormatRecord = { format: STORE_FORMAT, storeId: randomUUID(), createdAt: now().toISOString() };
      if ((await store.putRecord(keys.format, fresh, { ifRevision: null })) !== null) return fresh;
      continue;
    }
    await upgradeStore(store, now);
    if (attempt > 3000)
      throw new RunnerDepotError(
        "STORE_UNAVAILABLE",
        "Another process has been upgrading the store for 10 minutes; retry later",
      );
  }
}

function checkFormat(record: FormatRecord): FormatRecord {
  if (typeof record.format !== "number" || record.format > STORE_FORMAT) {
    throw new RunnerDepotError(
      "STORE_FORMAT_UNSUPPORTED",
      `The store has format ${String(record.format)}; this runner-depot reads format ${STORE_FORMAT} and older. Upgrade runner-depot to serve it.`,
    );
  }
  return record;
}

/** True when the store holds format-1 data (a catalog record or any version record). */
async function holdsFormat1(store: PackageStore): Promise<boolean> {
  if (await store.getRecord(keys.legacyCatalog)) return true;
  return (await store.listRecords(keys.versions, { limit: 1 })).keys.length > 0;
}

/**
 * Upgrades a format-1 store to format 2 (a no-op report on a current store). Safe to run
 * while other processes open the store: one upgrades, the others wait for it.
 *
 * @example
 * const report = await upgradeStore(createFsStore("/var/lib/depot"));
 * console.log(`upgraded ${report.versions} versions from format ${report.from}`);
 */
export async function upgradeStore(store: PackageStore, now: () => Date = () => new Date()): Promise<UpgradeReport> {
  const existing = (await store.getRecord<FormatRecord>(keys.format))?.value;
  if (existing) return { from: checkFormat(existing).format, to: existing.format, versions: 0 };
  if (!(await holdsFormat1(store))) {
    // Nothing to upgrade: a new store just gets its format record.
    const created = await openStoreFormat(store, now);
    return { from: created.format, to: created.format, versions: 0 };
  }
  if (!(await claim(store, now))) {
    // Another process upgrades: wait for its format record (or for its claim to go stale).
    await new Promise((resolve) => setTimeout(resolve, 200));
    return { from: 1, to: STORE_FORMAT, versions: 0 };
  }
  try {
    const versions = await format1Versions(store);
    // publishVersion is idempotent and resumable, so a killed upgrade simply runs again.
    for (const v of versions) {
      const at = new Date(Date.parse(v.publishedAt) || now().getTime());
      await compactAfter(store, await publishVersion(store, v.name, v.version, at));
    }
    const at = now().toISOString();
    await store.putRecord(
      keys.format,
      {
        format: STORE_FORMAT,
        storeId: randomUUID(),
        createdAt: at,
        upgradedFrom: 1,
        upgradedAt: at,
      } satisfies FormatRecord,
      { ifRevision: null },
    );
    return { from: 1, to: STORE_FORMAT, versions: versions.length };
  } finally {
    await store.deleteRecord(CLAIM_KEY).catch(() => undefined);
  }
}

async function claim(store: PackageStore, now: () => Date): Promise<boolean> {
  const mine = { at: now().getTime(), id: randomUUID() };
  if ((await store.putRecord(CLAIM_KEY, mine, { ifRevision: null })) !== null) return true;
  const held = await store.getRecord<{ at: number }>(CLAIM_KEY);
  if (held && now().getTime() - held.value.at > CLAIM_STALE_MS) {
    // A killed upgrader's claim: take it over by compare-and-swap.
    return (await store.putRecord(CLAIM_KEY, mine, { ifRevision: held.revision })) !== null;
  }
  return false;
}

/**
 * Every version a format-1 store published: those its catalog lists, plus version records
 * it does not list (a commit killed before its catalog write, which 0.1.0 rolled forward
 * on open), in publishing order. O(versions), once.
 */
async function format1Versions(store: PackageStore): Promise<VersionRecord[]> {
  const catalog = (await store.getRecord<LegacyCatalog>(keys.legacyCatalog))?.value;
  const wanted = new Set<string>();
  for (const name of Object.keys(catalog?.packages ?? {})) {
    for (const version of own(catalog!.packages, name)?.versions ?? []) wanted.add(keys.version(name, version));
  }
  for await (const key of allKeys(store, keys.versions)) wanted.add(key);
  const found: VersionRecord[] = [];
  for (const key of wanted) {
    const record = (await store.getRecord<VersionRecord>(key))?.value;
    if (record) found.push(record);
  }
  return found.sort(
    (a, b) => a.publishedAt.localeCompare(b.publishedAt) || a.name.localeCompare(b.name) || orderOf(a, b),
  );
}

function orderOf(a: VersionRecord, b: VersionRecord): number {
  const sorted = sortVersions([a.version, b.version]);
  return a.version === b.version ? 0 : sorted[0] === a.version ? -1 : 1;
}
