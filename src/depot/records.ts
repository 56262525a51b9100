/**
 * The depot's record layout on a PackageStore and the small helpers every part shares.
 */
import { createHash } from "node:crypto";
import { RunnerDepotError } from "../errors.js";
import type { ManifestItem, Requirement } from "./archive.js";
import { newestVersion, sortVersions } from "./names.js";
import type { PackageStore, StoredRecord } from "./ports.js";

/** One package in the catalog record. */
export interface CatalogEntry {
  versions: string[];
  updatedAt: string;
}

/** The `catalog` record: the visibility index; a version is published once it is listed here. */
export interface CatalogRecord {
  packages: Record<string, CatalogEntry>;
  updatedAt: string;
}

/** A `version/<name>/<version>` record, written create-only at commit. */
export interface VersionRecord {
  name: string;
  version: string;
  publishedAt: string;
  /** Archive mtime, whole seconds. */
  mtime: number;
  /** The archive blob. */
  digest: string;
  size: number;
  /** The manifest JSON blob (deltas and garbage collection read it). */
  manifest: string;
  itemCount: number;
  attributes: Record<string, string>;
  requires: Requirement[];
  transaction: string;
}

/** A `delta/<name>/<from>/<to>` record: a delta archive built on first request and kept. */
export interface DeltaRecord {
  digest: string;
  size: number;
  builtAt: string;
}

/** States of a transaction. */
export type TransactionState = "open" | "committing" | "committed" | "abandoned" | "expired";

/** The answer of a successful commit, kept so that a repeated commit answers the same. */
export interface CommitResult {
  name: string;
  version: string;
  digest: string;
  /** Path below the router's base, e.g. `/data/app@1.0.0`. */
  location: string;
}

/** A `trans/<id>` record. */
export interface TransactionRecord {
  id: string;
  name: string;
  version: string;
  principal: string;
  state: TransactionState;
  createdAt: string;
  touchedAt: string;
  requires: Requirement[];
  attributes: Record<string, string>;
  licenses: Record<string, { digest: string; size: number }>;
  /** Successful additions (the item limit counts these). */
  itemCount: number;
  bytes: number;
  /** Archive mtime chosen by the first commit attempt, so a retried commit builds the same bytes. */
  commitTime?: number;
  /**
   * Commit attempts in flight (attempt id → start, ms). A failed attempt returns the
   * transaction to `open` only when no other live attempt remains, so the state stays
   * `committing` for the whole run of whichever attempt publishes.
   */
  commitAttempts?: Record<string, number>;
  /** Commit attempts started so far: `itemCount` is recounted only by an attempt, so an addition can tell whether its reservation was recounted since it made it. */
  commitEpoch?: number;
  result?: CommitResult;
  finishedAt?: string;
}

/**
 * A `titem/<id>/<hash>` record: one item. It is written `pending`, and becomes part of the
 * transaction only when its addition turns it `added` by compare-and-swap; a commit turns
 * the pending ones it finds `rejected` the same way, so exactly one side wins each item.
 * No state (records written before states existed) means `added`.
 */
export type ItemRecord = ManifestItem & { state?: ItemState };

/** States of an item record. */
export type ItemState = "pending" | "added" | "rejected";

/** Record keys. */
export const keys = {
  catalog: "catalog",
  version: (name: string, version: string) => `version/${name}/${version}`,
  versions: "version/",
  delta: (name: string, from: string, to: string) => `delta/${name}/${from}/${to}`,
  deltas: "delta/",
  trans: (id: string) => `trans/${id}`,
  transactions: "trans/",
  item: (id: string, path: string) => `titem/${id}/${pathHash(path)}`,
  items: (id: string) => `titem/${id}/`,
  dirMark: (id: string, path: string) => `tdir/${id}/${pathHash(path)}`,
  dirMarks: (id: string) => `tdir/${id}/`,
  /** The principal's open-transaction slots: one record, changed only by compare-and-swap. */
  slots: (principal: string) => `slots/${principalHash(principal)}`,
  gcCandidates: "gc/candidates",
};

/** Item keys are hashed so any path (up to 4 KiB of UTF-8) makes a short, safe key. */
function pathHash(path: string): string {
  return createHash("sha256").update(path).digest("hex");
}

function principalHash(principal: string): string {
  return createHash("sha256").update(principal).digest("hex").slice(0, 32);
}

/** Every key under a prefix, following cursors. */
export async function* allKeys(store: PackageStore, prefix: string): AsyncIterable<string> {
  let cursor: string | undefined;
  do {
    const page = await store.listRecords(prefix, { cursor, limit: 1000 });
    yield* page.keys;
    cursor = page.cursor;
  } while (cursor !== undefined);
}

/** Runs `fn` over `inputs` with at most `limit` in flight, keeping order. */
export async function mapLimit<T, R>(inputs: readonly T[], limit: number, fn: (input: T) => Promise<R>): Promise<R[]> {
  const out = new Array<R>(inputs.length);
  let next = 0;
  const workers = Array.from({ length: Math.min(limit, inputs.length) }, async () => {
    while (next < inputs.length) {
      const i = next++;
      out[i] = await fn(inputs[i]!);
    }
  });
  await Promise.all(workers);
  return out;
}

/**
 * Read-modify-write with compare-and-swap, retried on lost races. `change` returns the
 * new value, or undefined to leave the record as it is.
 */
export async function updateRecord<T>(
  store: PackageStore,
  key: string,
  change: (current: StoredRecord<T> | null) => T | undefined,
): Promise<{ value: T | undefined; changed: boolean }> {
  for (let attempt = 0; attempt < 200; attempt++) {
    const current = await store.getRecord<T>(key);
    const next = change(current);
    if (next === undefined) return { value: current?.value, changed: false };
    const revision = await store.putRecord(key, next, { ifRevision: current?.revision ?? null });
    if (revision !== null) return { value: next, changed: true };
    await new Promise((resolve) => setTimeout(resolve, Math.random() * Math.min(2 ** attempt, 50)));
  }
  throw new RunnerDepotError("CONFLICT", `Too much contention on ${key}; retry`);
}

/**
 * A record member by a user-controlled key (package name, attribute, licence): only the
 * object's own members, never an Object.prototype one (`constructor`, `toString`, …).
 */
export function own<T>(record: Record<string, T> | undefined | null, key: string): T | undefined {
  return record && Object.hasOwn(record, key) ? record[key] : undefined;
}

/** Sets a member by a user-controlled key as an own data property (even `__proto__`). */
export function setOwn<T>(record: Record<string, T>, key: string, value: T): void {
  Object.defineProperty(record, key, { value, enumerable: true, writable: true, configurable: true });
}

/** An empty record without a prototype, for maps keyed by user-controlled strings. */
export function emptyRecord<T>(): Record<string, T> {
  return Object.create(null) as Record<string, T>;
}

/** Adds a version to the catalog (idempotent). */
export async function publishToCatalog(store: PackageStore, name: string, version: string, now: Date): Promise<void> {
  await updateRecord<CatalogRecord>(store, keys.catalog, (current) => {
    const catalog: CatalogRecord = current?.value ?? { packages: {}, updatedAt: now.toISOString() };
    const entry = own(catalog.packages, name);
    if (entry?.versions.includes(version)) return undefined;
    setOwn(catalog.packages, name, { versions: sortVersions([...(entry?.versions ?? []), version]), updatedAt: now.toISOString() });
    catalog.updatedAt = now.toISOString();
    return catalog;
  });
}

/** The published versions of a package (ascending) and the newest, or null when unknown. */
export function catalogVersions(catalog: CatalogRecord | undefined, name: string): { versions: string[]; latest: string; updatedAt: string } | null {
  const entry = own(catalog?.packages, name);
  if (!entry || !Array.isArray(entry.versions) || entry.versions.length === 0) return null;
  return { versions: entry.versions, latest: newestVersion(entry.versions)!, updatedAt: entry.updatedAt };
}
