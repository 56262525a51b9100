/**
 * Transactions: the lifecycle of a `trans/<id>` record (open, load, touch, metadata,
 * abandon, expiry) and the depot's limits. Additions live in depot/transactions/additions.ts, the commit in
 * depot/transactions/commit.ts; the router maps HTTP onto all three, and everything speaks RunnerDepotError.
 */
import { randomUUID } from "node:crypto";
import { RunnerDepotError } from "../../errors.js";
import type { Requirement } from "../package/archive.js";
import { compareUtf8 } from "../package/paths.js";
import type { PackageStore } from "../ports.js";
import { packageKey, type PackageRecord } from "../catalog/packages.js";
import {
  allKeys,
  keys,
  mapLimit,
  noteRecord,
  updateRecord,
  WHOLE_LISTING,
  type ItemRecord,
  type TransactionRecord,
} from "../store/records.js";
import { Slots } from "./slots.js";

/** Limits of the depot (each enforced with 413, 429 or 431). */
export interface DepotLimits {
  /** Bytes of one item (file or licence). Default 2 GiB. */
  itemBytes: number;
  /** Items (files, dirs, links, licences) of one transaction. Default 100,000. */
  items: number;
  /** Bytes of a request's headers (names + values). Default 16 KiB. */
  headerBytes: number;
  /** Open transactions per principal. Default 100. */
  openTransactions: number;
  /** Requirements of one transaction. Default 1,000. */
  requires: number;
  /** Attributes of one transaction. Default 1,000. */
  attributes: number;
  /**
   * Versions of one package. Default 4,000: past about 4,090 versions of up to 128 characters, a catalog page
   * can no longer be stored or read (RangeError: Invalid string length).
   * Why: docs/decisions/depot-server.md, "lifecycle.ts: DepotLimits.versions".
   */
  versions: number;
}

/** Default limits. */
export const DEFAULT_LIMITS: DepotLimits = {
  itemBytes: 2 * 1024 ** 3,
  items: 100_000,
  headerBytes: 16 * 1024,
  openTransactions: 100,
  requires: 1_000,
  attributes: 1_000,
  versions: 4_000,
};

/** Settings the transaction logic runs with. */
export interface TransactionSettings {
  limits: DepotLimits;
  /** Idle expiry, ms. Default 24 h. */
  idleMs: number;
  /** Absolute expiry, ms. Default 7 days. */
  maxAgeMs: number;
  now: () => Date;
}

const UUID_RE = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

/** One addition waiting to be counted on its transaction record. */
interface Reservation {
  size: number;
  resolve(trans: TransactionRecord): void;
  reject(error: unknown): void;
}

/** What an addition answers. */
export type AddResult = Record<string, unknown>;

/**
 * The transaction lifecycle the router drives.
 *
 * @example
 * const transactions = new Transactions(store, {
 *   limits: DEFAULT_LIMITS,
 *   idleMs: 86_400_000,
 *   maxAgeMs: 604_800_000,
 *   now: () => new Date(),
 * });
 * const trans = await transactions.open("app", "1.0.0", "anonymous");
 */
export class Transactions {
  private readonly slots: Slots;

  constructor(
    private readonly store: PackageStore,
    readonly settings: TransactionSettings,
  ) {
    this.slots = new Slots(store, {
      limit: () => settings.limits.openTransactions,
      holds: (t) => (t.state === "open" || t.state === "committing") && !this.expired(t),
      expiresAt: (t) => this.expiresAt(t),
      now: () => settings.now(),
    });
  }

  /** When a transaction expires: idle expiry, capped by the absolute one. */
  expiresAt(trans: TransactionRecord): Date {
    const idle = Date.parse(trans.touchedAt) + this.settings.idleMs;
    const absolute = Date.parse(trans.createdAt) + this.settings.maxAgeMs;
    return new Date(Math.min(idle, absolute));
  }

  expired(trans: TransactionRecord): boolean {
    return (
      (trans.state === "open" || trans.state === "committing") &&
      this.settings.now().getTime() >= this.expiresAt(trans).getTime()
    );
  }

  /**
   * Transactions open or committing now, depot-wide (all principals and processes); see Slots.countLive for the cost.
   */
  countOpen(): Promise<number> {
    return this.slots.countLive();
  }

  /** Opens a transaction for `name@version`; VERSION_EXISTS, TOO_MANY_VERSIONS, TOO_MANY_TRANSACTIONS. */
  async open(name: string, version: string, principal: string): Promise<TransactionRecord> {
    // Both reads at once: the package record costs no extra round trip.
    const [existing] = await Promise.all([
      this.store.getRecord(keys.version(name, version)),
      this.checkVersionRoom(name, version),
    ]);
    if (existing) {
      throw new RunnerDepotError("VERSION_EXISTS", `${name}@${version} is already published`);
    }
    const now = this.settings.now().toISOString();
    const trans: TransactionRecord = {
      id: randomUUID(),
      name,
      version,
      principal,
      state: "open",
      createdAt: now,
      touchedAt: now,
      requires: [],
      attributes: {},
      licenses: {},
      itemCount: 0,
      bytes: 0,
    };
    // The record first, the slot second: a listed id always has a record, so a concurrent
    // open never mistakes a slot being taken for a dead one. Unlisted, it is not usable yet.
    // Lazy: a machine crash may lose an open transaction whole (its next request answers
    // 404 and the client opens again); see docs/decisions/depot-publish-durability.md.
    const revision = await this.store.putRecord(keys.trans(trans.id), trans, { ifRevision: null, lazy: true });
    if (revision === null) throw new RunnerDepotError("CONFLICT", "Transaction id collision; retry");
    noteRecord(this.store, keys.trans(trans.id), { value: trans, revision });
    try {
      await this.slots.take(principal, trans.id);
    } catch (error) {
      await this.store.deleteRecord(keys.trans(trans.id)).catch(() => undefined);
      throw error;
    }
    return trans;
  }

  /**
   * Loads a transaction for a request: TRANSACTION_NOT_FOUND, PERMISSION_DENIED (another
   * principal's), and 410 (TRANSACTION_COMMITTED/GONE/EXPIRED) unless `allowCommitted`.
   */
  async load(id: string, principal: string | undefined, allowCommitted = false): Promise<TransactionRecord> {
    return this.check(await this.read(id), principal, allowCommitted);
  }

  /** A transaction record as stored, whatever its state; TRANSACTION_NOT_FOUND when none. */
  async read(id: string): Promise<TransactionRecord> {
    const record = UUID_RE.test(id) ? await this.store.getRecord<TransactionRecord>(keys.trans(id)) : null;
    if (!record)
      throw new RunnerDepotError("TRANSACTION_NOT_FOUND", `No transaction ${JSON.stringify(id.slice(0, 64))}`);
    // The request's own update of it (an addition's count, the commit) swaps on this read.
    noteRecord(this.store, keys.trans(id), record);
    return record.value;
  }

  /** True when a transaction answers 410 whatever the request (abandoned, expired or past its expiry). */
  isGone(trans: TransactionRecord): boolean {
    return trans.state === "abandoned" || trans.state === "expired" || this.expired(trans);
  }

  /** {@link load}'s checks on a record already read. */
  async check(
    trans: TransactionRecord,
    principal: string | undefined,
    allowCommitted = false,
  ): Promise<TransactionRecord> {
    const id = trans.id;
    if (principal !== undefined && trans.principal !== principal) {
      throw new RunnerDepotError("PERMISSION_DENIED", "This transaction belongs to another principal");
    }
    if (this.expired(trans)) {
      await this.finish(trans.id, "expired").catch(() => undefined);
      throw new RunnerDepotError(
        "TRANSACTION_EXPIRED",
        `Transaction ${id} expired at ${this.expiresAt(trans).toISOString()}`,
      );
    }
    switch (trans.state) {
      case "committed":
        if (allowCommitted) return trans;
        throw new RunnerDepotError(
          "TRANSACTION_COMMITTED",
          `Transaction ${id} is committed; only GET /summary and a repeated commit answer`,
        );
      case "abandoned":
        throw new RunnerDepotError("TRANSACTION_GONE", `Transaction ${id} was abandoned`);
      case "expired":
        throw new RunnerDepotError("TRANSACTION_EXPIRED", `Transaction ${id} expired`);
      default:
        return trans;
    }
  }

  /**
   * Applies `change` to an open transaction (and touches it); 410/409 when it left `open`.
   * Why: docs/decisions/depot-server.md, "lifecycle.ts: Transactions.mutate".
   */
  async mutate(
    id: string,
    change: (trans: TransactionRecord) => void,
    options: { lazy?: boolean } = {},
  ): Promise<TransactionRecord> {
    const { value } = await updateRecord<TransactionRecord>(
      this.store,
      keys.trans(id),
      (current) => {
        if (!current) throw new RunnerDepotError("TRANSACTION_NOT_FOUND", `No transaction ${id}`);
        const trans = current.value;
        if (trans.state === "committing")
          throw new RunnerDepotError("CONFLICT", `Transaction ${id} is being committed`);
        if (trans.state === "committed")
          throw new RunnerDepotError("TRANSACTION_COMMITTED", `Transaction ${id} is committed`);
        if (trans.state !== "open")
          throw new RunnerDepotError("TRANSACTION_GONE", `Transaction ${id} is ${trans.state}`);
        change(trans);
        trans.touchedAt = this.settings.now().toISOString();
        return trans;
      },
      { guess: true, lazy: options.lazy, losable: options.lazy },
    );
    return value!;
  }

  /** Additions waiting to be counted, per transaction id (see {@link reserve}). */
  private readonly waiting = new Map<string, Reservation[]>();
  /** Transaction ids whose count is being written now. */
  private readonly counting = new Set<string>();

  /**
   * Counts one item on the transaction record (which must still be `open`; TOO_MANY_ITEMS past the limit) and
   * touches it; resolves with the record as written.
   * Why: docs/decisions/depot-server.md, "lifecycle.ts: Transactions.reserve".
   */
  reserve(id: string, size: number): Promise<TransactionRecord> {
    return new Promise<TransactionRecord>((resolve, reject) => {
      let queue = this.waiting.get(id);
      if (!queue) this.waiting.set(id, (queue = []));
      queue.push({ size, resolve, reject });
      if (!this.counting.has(id)) void this.countWaiting(id);
    });
  }

  private async countWaiting(id: string): Promise<void> {
    this.counting.add(id);
    try {
      for (;;) {
        const batch = this.waiting.get(id) ?? [];
        this.waiting.delete(id);
        if (batch.length === 0) return;
        let refused: Array<RunnerDepotError | null> = [];
        try {
          // `change` may run again after a lost race: it judges the batch from scratch each time.
          const written = await this.mutate(
            id,
            (t) => {
              refused = batch.map((r) => {
                if (t.itemCount >= this.settings.limits.items) {
                  return new RunnerDepotError(
                    "TOO_MANY_ITEMS",
                    `A transaction holds at most ${this.settings.limits.items} items`,
                  );
                }
                t.itemCount += 1;
                t.bytes += r.size;
                return null;
              });
            },
            { lazy: true },
          );
          batch.forEach((r, i) => (refused[i] ? r.reject(refused[i]) : r.resolve(written)));
        } catch (error) {
          for (const r of batch) r.reject(error);
        }
      }
    } finally {
      this.counting.delete(id);
    }
  }

  /**
   * Keeps an idle transaction alive (any request on it counts as activity). Returns the
   * record as written, or undefined when it is no longer open to touch (committing).
   */
  async touch(id: string): Promise<TransactionRecord | undefined> {
    return this.mutate(id, () => undefined, { lazy: true }).catch((error: unknown) => {
      if (!(error instanceof RunnerDepotError && error.code === "CONFLICT")) throw error;
      return undefined;
    });
  }

  /**
   * TOO_MANY_VERSIONS when `name` lists `limits.versions` versions already and `version` is
   * not one of them. Checked when a transaction opens (early) and again by its commit before
   * it writes the version record (depot/transactions/commit.ts), so a package passes the limit only by the
   * commits that check at the same moment. One read of `pkg/<name>`, O(versions).
   */
  async checkVersionRoom(name: string, version: string): Promise<void> {
    // Noted (absent too): the commit's claim on the package record then swaps on this read instead of another.
    const record = await this.store.getRecord<PackageRecord>(packageKey(name));
    noteRecord(this.store, packageKey(name), record);
    const versions = Array.isArray(record?.value.versions) ? record.value.versions : undefined;
    if (versions && versions.length >= this.settings.limits.versions && !versions.includes(version)) {
      throw new RunnerDepotError(
        "TOO_MANY_VERSIONS",
        `${name} holds ${versions.length} versions; at most ${this.settings.limits.versions} are accepted`,
      );
    }
  }

  /** Sets attributes (key → value). */
  async setAttributes(trans: TransactionRecord, attributes: Record<string, string>): Promise<AddResult> {
    const next = await this.mutate(trans.id, (t) => {
      const merged = { ...t.attributes, ...attributes };
      if (Object.keys(merged).length > this.settings.limits.attributes) {
        throw new RunnerDepotError(
          "TOO_MANY_ITEMS",
          `A transaction holds at most ${this.settings.limits.attributes} attributes`,
        );
      }
      t.attributes = merged;
    });
    return { type: "set", attributes: next.attributes };
  }

  /** Adds requirements (a later one on the same name replaces the earlier). */
  async require(trans: TransactionRecord, requires: Requirement[]): Promise<Requirement[]> {
    refuseSelfDependency(trans.name, requires);
    const next = await this.mutate(trans.id, (t) => {
      const byName = new Map(t.requires.map((r) => [r.name, r]));
      for (const r of requires) byName.set(r.name, r);
      if (byName.size > this.settings.limits.requires) {
        throw new RunnerDepotError(
          "TOO_MANY_ITEMS",
          `A transaction holds at most ${this.settings.limits.requires} requirements`,
        );
      }
      t.requires = [...byName.values()].sort((a, b) => compareUtf8(a.name, b.name));
    });
    return next.requires;
  }

  /** Abandons a transaction: 204 semantics, its blobs left to garbage collection. */
  async abandon(trans: TransactionRecord): Promise<void> {
    if (trans.state === "committing")
      throw new RunnerDepotError("CONFLICT", `Transaction ${trans.id} is being committed`);
    await this.finish(trans.id, "abandoned");
  }

  /** Moves an open transaction to a final state and drops its working records. */
  async finish(id: string, state: "abandoned" | "expired"): Promise<void> {
    const { value } = await updateRecord<TransactionRecord>(
      this.store,
      keys.trans(id),
      (current) => {
        if (!current || (current.value.state !== "open" && current.value.state !== "committing")) return undefined;
        return { ...current.value, state, finishedAt: this.settings.now().toISOString() };
      },
      { guess: true },
    );
    if (value) await this.dropWorkingRecords(value);
  }

  /**
   * Frees the slot and deletes the item and marker records of a finished transaction.
   * `keepSlot` leaves the id listed: a finished transaction holds no slot (every take reads
   * the listed ones and drops those that no longer hold one), so the commit saves the
   * slot record's write; a `committing` one a machine crash leaves stays listed, so
   * recovery on open finds it.
   */
  async dropWorkingRecords(trans: TransactionRecord, options: { keepSlot?: boolean } = {}): Promise<void> {
    if (!options.keepSlot) await this.slots.release(trans.principal, trans.id);
    await this.dropItemRecords(trans.id);
  }

  /**
   * Deletes the item and marker records of transaction `id` (torn ones too, on a store
   * whose records can tear): one listing per prefix, one delete per record.
   */
  async dropItemRecords(id: string): Promise<void> {
    // Lazy: records a machine crash keeps belong to a finished transaction, and garbage
    // collection drops them after its retention.
    for (const prefix of [keys.items(id), keys.dirMarks(id)]) {
      const found: string[] = [];
      for await (const key of allKeys(this.store, prefix, WHOLE_LISTING)) found.push(key);
      await mapLimit(found, 16, (key) => this.store.deleteRecord(key, { ifRevision: null, lazy: true }));
    }
  }

  /** Every item of a transaction, in archive order: the `added` ones (in-flight additions are not yet part of it). */
  async items(trans: TransactionRecord): Promise<ItemRecord[]> {
    const found: string[] = [];
    for await (const key of allKeys(this.store, keys.items(trans.id), WHOLE_LISTING)) found.push(key);
    const items = await mapLimit(found, 32, async (key) => (await this.store.getRecord<ItemRecord>(key))?.value);
    return items
      .filter((i): i is ItemRecord => i !== undefined && (i.state ?? "added") === "added")
      .map(withoutState)
      .sort((a, b) => compareUtf8(a.path, b.path));
  }
}

/**
 * Refuses (SELF_DEPENDENCY) requirements of package `name` on itself (docs/depot-api.md §8, `POST /meta/<id>/require`).
 *
 * @example
 * refuseSelfDependency("app", [{ name: "lib", range: "^1" }]); // passes
 */
export function refuseSelfDependency(name: string, requires: readonly Requirement[]): void {
  for (const r of requires) {
    if (r.name === name) throw new RunnerDepotError("SELF_DEPENDENCY", `${name} cannot require itself`);
  }
}

/** An item record without its addition state (what a manifest and a summary show). */
export function withoutState(item: ItemRecord): ItemRecord {
  const { state: _state, ...rest } = item;
  return rest;
}
