/**
 * The depot's change sequence: one totally ordered, dense log of published versions
 * (positions 1, 2, 3, … with no holes), kept as create-only records on any RecordStore.
 * Why: docs/decisions/depot-catalog.md, "changes.ts: why the change sequence is records".
 */
import { durableCondition, type OrderedWrites } from "../transactions/ordered-writes.js";
import type { PackageStore } from "../ports.js";
import { mapLimit, remember } from "../store/records.js";

/** One entry of the change sequence: `name@version` became visible. */
export interface ChangeEntry {
  position: number;
  name: string;
  version: string;
  /** True on the version that created the package (catalog pages list packages by it). */
  first: boolean;
  /** When it was appended (ISO 8601). */
  at: string;
  /**
   * On a yank entry (depot/catalog/yank.ts): the reason `version` was yanked, or null when it was un-yanked.
   * Absent on a publish entry.
   */
  yanked?: string | null;
  /**
   * On an attestation entry (depot/store/attestations.ts): the digest of the bundle added to `version`.
   * Absent on publish and yank entries.
   */
  attested?: string;
  /**
   * On a removal entry (depot/catalog/removal.ts, retention): `version` is no longer held. Absent on every other
   * entry.
   */
  removed?: true;
}

/** Positions per shard: keeps every fs directory of the log small; also the size of a pack. */
export const SHARD = 1000;
/** Entries kept per store outside packs (single reads and appends of the shard filling). */
const LOOSE_CACHE = 20_000;
/** Packs kept per store (1,000 entries each, about 150 KB). */
const PACK_CACHE = 64;
/** Update entries (see readShardUpdates) kept per store, counted over all shards held. */
const UPDATES_CACHE = 200_000;

/** A `seqpack/<shard>` record: every entry of a full shard, ascending. */
interface PackRecord {
  shard: number;
  entries: ChangeEntry[];
}

/** The record key of a shard's pack. */
export const packKey = (shard: number) => `seqpack/${String(shard).padStart(10, "0")}`;

/** The shard a position lies in, and its first and last positions (shard 0 starts at 1). */
export function shardOf(position: number): { shard: number; first: number; last: number } {
  const shard = Math.floor(position / SHARD);
  return { shard, first: Math.max(1, shard * SHARD), last: shard * SHARD + SHARD - 1 };
}

interface EntryCache {
  loose: Map<number, ChangeEntry>;
  packs: Map<number, ChangeEntry[]>;
  updates: Map<number, ChangeEntry[]>;
  updateCount: number;
}
const caches = new WeakMap<PackageStore, EntryCache>();

function cacheOf(store: PackageStore): EntryCache {
  let cache = caches.get(store);
  if (!cache) caches.set(store, (cache = { loose: new Map(), packs: new Map(), updates: new Map(), updateCount: 0 }));
  return cache;
}

function cached(store: PackageStore, position: number): ChangeEntry | undefined {
  const cache = cacheOf(store);
  const { shard, first } = shardOf(position);
  return cache.packs.get(shard)?.[position - first] ?? cache.loose.get(position);
}

/** The record key of a position: `seq/<shard>/<position>`, zero-padded so keys sort by position. */
export function changeKey(position: number): string {
  return `seq/${String(Math.floor(position / SHARD)).padStart(10, "0")}/${String(position).padStart(15, "0")}`;
}

/** The highest position this process has seen per store (positions never disappear). */
const knownHeads = new WeakMap<PackageStore, number>();

/** The highest position this process has seen (its own appends, reads and announcements), without a read. */
export function knownHead(store: PackageStore): number {
  return knownHeads.get(store) ?? 0;
}

/** Records that position `position` exists (an announcement of another process's append). */
export function noteHead(store: PackageStore, position: number): void {
  if (position > (knownHeads.get(store) ?? 0)) knownHeads.set(store, position);
}

const CHANGE_KEY = /^seq\/[0-9]{10}\/([0-9]{15})$/;

/** The position a change-entry key names, or null for any other key. */
export function positionOfKey(key: string): number | null {
  const match = CHANGE_KEY.exec(key);
  return match ? Number(match[1]) : null;
}

async function exists(store: PackageStore, position: number): Promise<boolean> {
  return (
    position === 0 || cached(store, position) !== undefined || (await store.getRecord(changeKey(position))) !== null
  );
}

/**
 * The newest position (0 when nothing was published). Starts from the last position seen
 * and gallops forward, then bisects: one read when nothing changed, O(log n) otherwise.
 */
export async function changeHead(store: PackageStore): Promise<number> {
  let low = knownHeads.get(store) ?? 0;
  let step = 1;
  while (await exists(store, low + step)) {
    low += step;
    step *= 2;
  }
  let high = low + step;
  while (high - low > 1) {
    const mid = Math.floor((low + high) / 2);
    if (await exists(store, mid)) low = mid;
    else high = mid;
  }
  if (low > (knownHeads.get(store) ?? 0)) knownHeads.set(store, low);
  return low;
}

/** The tail of this process's appends per store (see appendChange). */
const appending = new WeakMap<PackageStore, Promise<unknown>>();

/**
 * Appends an entry and returns its position. Not idempotent: callers decide who appends (see packages.ts).
 *
 * With `writes` the entry is one of a request's ordered writes (depot/transactions/ordered-writes.ts): the
 * promise resolves once the entry is visible, and the request flushes before it answers.
 * Why: docs/decisions/depot-catalog.md, "changes.ts: appendChange".
 */
export function appendChange(
  store: PackageStore,
  entry: Omit<ChangeEntry, "position">,
  writes?: OrderedWrites,
): Promise<number> {
  const previous = appending.get(store) ?? Promise.resolve();
  let visible!: () => void;
  const seen = new Promise<void>((resolve) => (visible = resolve));
  const run = previous.then(() => appendNow(store, entry, visible, writes));
  const tail = Promise.race([
    seen,
    run.then(
      () => undefined,
      () => undefined,
    ),
  ]);
  appending.set(store, tail);
  void tail.then(() => {
    if (appending.get(store) === tail) appending.delete(store);
  });
  return run;
}

async function appendNow(
  store: PackageStore,
  entry: Omit<ChangeEntry, "position">,
  visible: () => void,
  writes: OrderedWrites | undefined,
): Promise<number> {
  // The position after the newest this process saw (or wrote) first, without reading the head: with one
  // process appending it is free, and when another took it, its insert fails and the head is read.
  const known = knownHeads.get(store);
  let guessed = known !== undefined;
  let position = guessed ? known! + 1 : (await changeHead(store)) + 1;
  for (;;) {
    const written: ChangeEntry = {
      position,
      name: entry.name,
      version: entry.version,
      first: entry.first,
      at: entry.at,
      ...(entry.yanked !== undefined ? { yanked: entry.yanked } : {}),
      ...(entry.attested !== undefined ? { attested: entry.attested } : {}),
      ...(entry.removed ? { removed: true as const } : {}),
    };
    // Announced: routers in other processes move their catalog head on it (depot/catalog/head.ts).
    const onVisible = (applied: boolean) => {
      if (applied) visible();
    };
    if (
      (await store.putRecord(
        changeKey(position),
        written,
        durableCondition(writes, { ifRevision: null, announce: true, onVisible }),
      )) !== null
    ) {
      if (position > (knownHeads.get(store) ?? 0)) knownHeads.set(store, position);
      remember(cacheOf(store).loose, position, written, LOOSE_CACHE);
      return position;
    }
    // Another process took this position, so it exists: after a guess, gallop to the head (it may have taken
    // many); else the next one is ours to try.
    position = guessed ? (await changeHead(store)) + 1 : position + 1;
    guessed = false;
  }
}

/** The entry at a position, or null beyond the head. One read, none when held. */
export async function readChange(store: PackageStore, position: number): Promise<ChangeEntry | null> {
  const held = cached(store, position);
  if (held) return held;
  const entry = (await store.getRecord<ChangeEntry>(changeKey(position)))?.value ?? null;
  if (entry) remember(cacheOf(store).loose, position, entry, LOOSE_CACHE);
  return entry;
}

/**
 * Every entry of a full shard: held, else its pack (one read), else read one by one and
 * packed for the next reader (a create-only write; lazy, since a lost pack is rebuilt).
 * Only for a shard whose last position is at or below a head that was seen.
 */
export async function readShard(store: PackageStore, shard: number): Promise<ChangeEntry[]> {
  const cache = cacheOf(store);
  const held = cache.packs.get(shard);
  if (held) {
    remember(cache.packs, shard, held, PACK_CACHE);
    return held;
  }
  let entries = (await store.getRecord<PackRecord>(packKey(shard)))?.value.entries;
  if (!entries) {
    const { first, last } = shardOf(shard * SHARD);
    const read = await mapLimit(
      Array.from({ length: last - first + 1 }, (_, i) => first + i),
      32,
      (p) => readChange(store, p),
    );
    if (read.some((e) => e === null)) throw new Error(`change sequence shard ${shard} is not full`);
    entries = read as ChangeEntry[];
    await store.putRecord(packKey(shard), { shard, entries } satisfies PackRecord, { ifRevision: null, lazy: true });
  }
  for (const entry of entries) cache.loose.delete(entry.position);
  remember(cache.packs, shard, entries, PACK_CACHE);
  return entries;
}

/**
 * The entries of a full shard that are not a package's first version: the only ones that
 * can change a package created before the shard (depot/catalog/pages.ts brings old pages forward
 * with them). Held per store, so after one read of each pack a page far behind the head is
 * brought forward without reading anything: O(updates) work, not O(changes).
 */
export async function readShardUpdates(store: PackageStore, shard: number): Promise<ChangeEntry[]> {
  const cache = cacheOf(store);
  const held = cache.updates.get(shard);
  if (held) return held;
  const updates = (await readShard(store, shard)).filter((e) => !e.first);
  cache.updates.set(shard, updates);
  cache.updateCount += updates.length;
  for (const [oldest, list] of cache.updates) {
    if (cache.updateCount <= UPDATES_CACHE || oldest === shard) break;
    cache.updates.delete(oldest);
    cache.updateCount -= list.length;
  }
  return updates;
}

/**
 * Entries after `after` up to `upTo` (inclusive), ascending, at most `limit` of them, or
 * with `firstOnly` at most `limit` package-creating ones (scanning past the others).
 * `upTo` must not pass a head that was seen. O(entries scanned / SHARD) pack reads plus
 * single reads in the shard still filling; nothing for entries held.
 */
export async function readChanges(
  store: PackageStore,
  after: number,
  upTo: number,
  options: { limit: number; firstOnly?: boolean },
): Promise<{ entries: ChangeEntry[]; scannedTo: number }> {
  const entries: ChangeEntry[] = [];
  let next = after + 1;
  while (next <= upTo && entries.length < options.limit) {
    const { shard, last } = shardOf(next);
    let batch: Array<ChangeEntry | null>;
    if (last <= upTo) {
      const all = await readShard(store, shard);
      batch = all.slice(next - all[0]!.position);
    } else {
      const want = options.firstOnly ? 256 : options.limit - entries.length;
      const positions = Array.from({ length: Math.min(want, upTo - next + 1) }, (_, i) => next + i);
      batch = await mapLimit(positions, 32, (p) => readChange(store, p));
    }
    for (const entry of batch) {
      if (!entry) return { entries, scannedTo: next - 1 }; // cannot happen below a head that was seen
      next = entry.position + 1;
      if (options.firstOnly && !entry.first) continue;
      entries.push(entry);
      if (entries.length === options.limit) return { entries, scannedTo: entry.position };
    }
  }
  return { entries, scannedTo: Math.min(next - 1, upTo) };
}

/**
 * Looks for `name@version` among the entries appended at or after `sinceMs`, newest
 * first; O(entries appended since then). Crash recovery uses it so that a commit that died
 * after appending is not appended twice.
 */
export async function findRecentChange(
  store: PackageStore,
  name: string,
  version: string,
  sinceMs: number,
): Promise<number | null> {
  let position = await changeHead(store);
  while (position > 0) {
    const batch = Array.from({ length: Math.min(64, position) }, (_, i) => position - i);
    const read = await mapLimit(batch, 16, (p) => readChange(store, p));
    for (const entry of read) {
      if (!entry) continue;
      if (
        entry.name === name &&
        entry.version === version &&
        entry.yanked === undefined &&
        entry.attested === undefined &&
        entry.removed === undefined
      )
        return entry.position;
      if (Date.parse(entry.at) < sinceMs) return null;
    }
    position -= batch.length;
  }
  return null;
}
