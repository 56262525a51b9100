/**
 * The depot's record layout on a PackageStore and the small helpers every part shares.
 */
import { createHash } from "node:crypto";
import { RunnerDepotError } from "../../errors.js";
import type { ManifestItem, Requirement } from "../package/archive.js";
import { durableCondition, type OrderedWrites } from "../transactions/ordered-writes.js";
import type { PackageStore, StoredRecord } from "../ports.js";

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
  /**
   * Who committed it, written only when the router counts quotas (depot/store/quota.ts): a removal gives the room
   * back to this principal.
   */
  principal?: string;
}

/**
 * A `delta/<name>/<from>/<to>` record, as depots before issue 30 kept them; now only garbage collection reads (and
 * deletes) it.
 */
export interface DeltaRecord {
  digest: string;
  size: number;
  builtAt: string;
}

/** States of a transaction. */
type TransactionState = "open" | "committing" | "committed" | "abandoned" | "expired";

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
  /**
   * Commit attempts started so far: `itemCount` is recounted only by an attempt, so an addition can tell whether its
   * reservation was recounted since it made it.
   */
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
type ItemState = "pending" | "added" | "rejected";

/** Record keys. */
export const keys = {
  /** The depot-wide catalog of store format 1 (0.1.0); read only by the upgrade (depot/store/format.ts). */
  legacyCatalog: "catalog",
  /** The store's format record (depot/store/format.ts). */
  format: "format",
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
  allSlots: "slots/",
  gcCandidates: "gc/candidates",
  /** A version's attestations (depot/store/attestations.ts). */
  attestation: (name: string, version: string) => `attest/${name}/${version}`,
  attestations: "attest/",
  /** The versions a job published with its own credentials (depot/store/attestations.ts). */
  jobPublished: (requestId: string) => `jobpub/${requestId}`,
};

/** Item keys are hashed so any path (up to 4 KiB of UTF-8) makes a short, safe key. */
function pathHash(path: string): string {
  return createHash("sha256").update(path).digest("hex");
}

function principalHash(principal: string): string {
  return createHash("sha256").update(principal).digest("hex").slice(0, 32);
}

/**
 * Page size for a caller that reads every key under a prefix into memory anyway (a
 * transaction's items, at most its item limit): one page where the store allows it. The
 * fs store walks the whole prefix for every page, so 1,000-key pages made listing 100,000
 * items cost 100 walks and sorts of 100,000 keys (quadratic); stores with a real cursor
 * (PostgreSQL caps a page at 10,000) just answer in more pages.
 */
export const WHOLE_LISTING = 100_000;

/** Every key under a prefix, following cursors; `pageSize` keys asked for per listing (default 1,000). */
export async function* allKeys(store: PackageStore, prefix: string, pageSize = 1000): AsyncIterable<string> {
  let cursor: string | undefined;
  do {
    const page = await store.listRecords(prefix, { cursor, limit: pageSize });
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

/** Keeps `key` in a Map used as a least-recently-used cache: a hit moves to the end, the oldest goes past `max`. */
export function remember<K, V>(map: Map<K, V>, key: K, value: V, max: number): void {
  map.delete(key);
  map.set(key, value);
  if (map.size > max) map.delete(map.keys().next().value as K);
}

/** Records this process last read or wrote, per store, by key (JSON and revision): guesses for {@link updateRecord}. */
const guesses = new WeakMap<PackageStore, Map<string, { json: string; revision: string } | null>>();
/** Guesses kept per store (a few hundred bytes each). */
const GUESSES = 10_000;

/**
 * Notes a record as this process just read or wrote it, so an {@link updateRecord} with
 * `guess` may swap on it without reading it again. A guess is only ever a first try at
 * the compare-and-swap, which the store judges, so a stale one costs a lost race, never a
 * wrong write.
 */
export function noteRecord(store: PackageStore, key: string, record: StoredRecord<unknown> | null): void {
  let held = guesses.get(store);
  if (!held) guesses.set(store, (held = new Map()));
  // Absent is a guess too (null): an update then first tries a create-only write.
  remember(held, key, record ? { json: JSON.stringify(record.value), revision: record.revision } : null, GUESSES);
}

/**
 * The record as this process last noted it ({@link noteRecord}), or undefined: only ever a first try at a
 * compare-and-swap.
 */
export function guessedRecord<T>(store: PackageStore, key: string): StoredRecord<T> | undefined {
  const held = guesses.get(store)?.get(key);
  return held ? { value: JSON.parse(held.json) as T, revision: held.revision } : undefined;
}

/** As {@link guessedRecord}, and null when the record was last noted absent. */
function guessedState<T>(store: PackageStore, key: string): StoredRecord<T> | null | undefined {
  const held = guesses.get(store)?.get(key);
  if (held === undefined) return undefined;
  return held && { value: JSON.parse(held.json) as T, revision: held.revision };
}

/**
 * Read-modify-write with compare-and-swap, retried on lost races. `change` returns the
 * new value, or undefined to leave the record as it is.
 *
 * With `guess`, the first try starts from the record as this process last read or wrote
 * it ({@link noteRecord}; every write here notes itself) instead of reading it: one read
 * fewer per update of a record only this process is changing (a transaction's, a
 * package's). Only a write the store accepts is taken from a guess: when `change` leaves
 * the record alone or throws on a guess, or the swap loses, it runs again on a fresh read,
 * so it never decides on a stale state.
 *
 * With `writes`, a durable write is one of a request's ordered writes (depot/transactions/ordered-writes.ts):
 * it resolves once visible, and the request flushes before it answers.
 */
export async function updateRecord<T>(
  store: PackageStore,
  key: string,
  change: (current: StoredRecord<T> | null) => T | undefined,
  options: { lazy?: boolean; losable?: boolean; guess?: boolean; writes?: OrderedWrites } = {},
): Promise<{ value: T | undefined; changed: boolean }> {
  const guess = options.guess ? guessedState<T>(store, key) : undefined;
  if (guess !== undefined) {
    let next: T | undefined;
    try {
      next = change(guess);
    } catch {
      next = undefined; // judged again on a fresh read below
    }
    if (next !== undefined) {
      const revision = await store.putRecord(
        key,
        next,
        durableCondition(options.writes, {
          ifRevision: guess?.revision ?? null,
          lazy: options.lazy,
          losable: options.losable,
        }),
      );
      if (revision !== null) {
        noteRecord(store, key, { value: next, revision });
        return { value: next, changed: true };
      }
    }
  }
  for (let attempt = 0; attempt < 200; attempt++) {
    const current = await store.getRecord<T>(key);
    if (options.guess) noteRecord(store, key, current);
    const next = change(current);
    if (next === undefined) return { value: current?.value, changed: false };
    const revision = await store.putRecord(
      key,
      next,
      durableCondition(options.writes, {
        ifRevision: current?.revision ?? null,
        lazy: options.lazy,
        losable: options.losable,
      }),
    );
    if (revision !== null) {
      if (options.guess) noteRecord(store, key, { value: next, revision });
      return { value: next, changed: true };
    }
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
