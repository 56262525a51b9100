/**
 * Transactions: open, add, require, summary, commit, abandon, on PackageStore records.
 * The router maps HTTP onto these; everything here speaks RunnerDepotError.
 */
import { randomUUID } from "node:crypto";
import { RunnerDepotError } from "../errors.js";
import { LICENSES_DIR, writeArchive, type ManifestItem, type ManifestLicense, type PackageManifest, type Requirement } from "./archive.js";
import { EMPTY_DIGEST } from "./digest.js";
import { compareUtf8, ancestorsOf, parseLinkTarget } from "./paths.js";
import type { BlobInfo, PackageStore } from "./ports.js";
import {
  allKeys,
  keys,
  mapLimit,
  own,
  publishToCatalog,
  setOwn,
  updateRecord,
  type CommitResult,
  type ItemRecord,
  type TransactionRecord,
  type VersionRecord,
} from "./records.js";

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
}

/** Default limits. */
export const DEFAULT_LIMITS: DepotLimits = {
  itemBytes: 2 * 1024 ** 3,
  items: 100_000,
  headerBytes: 16 * 1024,
  openTransactions: 100,
  requires: 1_000,
  attributes: 1_000,
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

/** One problem found when validating a transaction. */
export interface CommitProblem {
  code: string;
  detail: string;
  path?: string;
}

/** What an addition answers. */
export type AddResult = Record<string, unknown>;

/** A body being uploaded: its bytes, or `empty` when nothing was sent. */
export interface UploadBody {
  empty: boolean;
  chunks: AsyncIterable<Uint8Array>;
  /** Content-Length, when the client sent one. */
  length?: number;
}

/** A `slots/<principal hash>` record: the ids of the principal's open transactions. */
interface SlotRecord {
  ids: string[];
}

const UUID_RE = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

/** The transaction engine the router drives. */
export class Transactions {
  constructor(
    private readonly store: PackageStore,
    private readonly settings: TransactionSettings,
  ) {}

  /** When a transaction expires: idle expiry, capped by the absolute one. */
  expiresAt(trans: TransactionRecord): Date {
    const idle = Date.parse(trans.touchedAt) + this.settings.idleMs;
    const absolute = Date.parse(trans.createdAt) + this.settings.maxAgeMs;
    return new Date(Math.min(idle, absolute));
  }

  private expired(trans: TransactionRecord): boolean {
    return (trans.state === "open" || trans.state === "committing") && this.settings.now().getTime() >= this.expiresAt(trans).getTime();
  }

  /** Opens a transaction for `name@version`; VERSION_EXISTS, TOO_MANY_TRANSACTIONS. */
  async open(name: string, version: string, principal: string): Promise<TransactionRecord> {
    if (await this.store.getRecord(keys.version(name, version))) {
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
    if ((await this.store.putRecord(keys.trans(trans.id), trans, { ifRevision: null })) === null) {
      throw new RunnerDepotError("CONFLICT", "Transaction id collision; retry");
    }
    try {
      await this.takeSlot(principal, trans.id);
    } catch (error) {
      await this.store.deleteRecord(keys.trans(trans.id)).catch(() => undefined);
      throw error;
    }
    return trans;
  }

  /**
   * Adds `id` to the principal's slot record by compare-and-swap, after dropping the ids
   * of transactions that are no longer open; TOO_MANY_TRANSACTIONS when the live ones
   * fill the limit. One record per principal, so the limit is exact across routers and
   * processes wherever the store's compare-and-swap is.
   */
  private async takeSlot(principal: string, id: string): Promise<void> {
    const key = keys.slots(principal);
    const limit = this.settings.limits.openTransactions;
    // A finished or expired transaction never reopens, so what was seen dead stays dead.
    const dead = new Set<string>();
    for (let attempt = 0; attempt < 200; attempt++) {
      const current = await this.store.getRecord<SlotRecord>(key);
      const listed = (current?.value.ids ?? []).filter((i) => !dead.has(i));
      const records = await mapLimit(listed, 16, async (i) => (await this.store.getRecord<TransactionRecord>(keys.trans(i)))?.value);
      const live: TransactionRecord[] = [];
      records.forEach((trans, i) => {
        if (trans && (trans.state === "open" || trans.state === "committing") && !this.expired(trans)) live.push(trans);
        else dead.add(listed[i]!);
      });
      if (live.length >= limit) {
        const soonest = Math.min(...live.map((t) => this.expiresAt(t).getTime()));
        const retryAfter = Math.max(1, Math.ceil((soonest - this.settings.now().getTime()) / 1000));
        throw new RunnerDepotError("TOO_MANY_TRANSACTIONS", `At most ${limit} open transactions per principal; commit or abandon one`, {
          details: { retryAfter },
        });
      }
      const next: SlotRecord = { ids: [...live.map((t) => t.id), id] };
      if ((await this.store.putRecord(key, next, { ifRevision: current?.revision ?? null })) !== null) return;
      await new Promise((resolve) => setTimeout(resolve, Math.random() * Math.min(2 ** attempt, 50)));
    }
    throw new RunnerDepotError("CONFLICT", "Too much contention on the open-transaction slots; retry");
  }

  /** Frees a finished transaction's slot (opening also drops dead ids, so this is best effort). */
  private async releaseSlot(trans: TransactionRecord): Promise<void> {
    await updateRecord<SlotRecord>(this.store, keys.slots(trans.principal), (current) => {
      if (!current || !current.value.ids.includes(trans.id)) return undefined;
      return { ids: current.value.ids.filter((i) => i !== trans.id) };
    });
  }

  /**
   * Loads a transaction for a request: TRANSACTION_NOT_FOUND, PERMISSION_DENIED (another
   * principal's), and 410 (TRANSACTION_COMMITTED/GONE/EXPIRED) unless `allowCommitted`.
   */
  async load(id: string, principal: string | undefined, allowCommitted = false): Promise<TransactionRecord> {
    const record = UUID_RE.test(id) ? await this.store.getRecord<TransactionRecord>(keys.trans(id)) : null;
    if (!record) throw new RunnerDepotError("TRANSACTION_NOT_FOUND", `No transaction ${JSON.stringify(id.slice(0, 64))}`);
    const trans = record.value;
    if (principal !== undefined && trans.principal !== principal) {
      throw new RunnerDepotError("PERMISSION_DENIED", "This transaction belongs to another principal");
    }
    if (this.expired(trans)) {
      await this.finish(trans.id, "expired").catch(() => undefined);
      throw new RunnerDepotError("TRANSACTION_EXPIRED", `Transaction ${id} expired at ${this.expiresAt(trans).toISOString()}`);
    }
    switch (trans.state) {
      case "committed":
        if (allowCommitted) return trans;
        throw new RunnerDepotError("TRANSACTION_COMMITTED", `Transaction ${id} is committed; only GET /summary and a repeated commit answer`);
      case "abandoned":
        throw new RunnerDepotError("TRANSACTION_GONE", `Transaction ${id} was abandoned`);
      case "expired":
        throw new RunnerDepotError("TRANSACTION_EXPIRED", `Transaction ${id} expired`);
      default:
        return trans;
    }
  }

  /** Applies `change` to an open transaction (and touches it); 410/409 when it left `open`. */
  private async mutate(id: string, change: (trans: TransactionRecord) => void): Promise<TransactionRecord> {
    const { value } = await updateRecord<TransactionRecord>(this.store, keys.trans(id), (current) => {
      if (!current) throw new RunnerDepotError("TRANSACTION_NOT_FOUND", `No transaction ${id}`);
      const trans = current.value;
      if (trans.state === "committing") throw new RunnerDepotError("CONFLICT", `Transaction ${id} is being committed`);
      if (trans.state === "committed") throw new RunnerDepotError("TRANSACTION_COMMITTED", `Transaction ${id} is committed`);
      if (trans.state !== "open") throw new RunnerDepotError("TRANSACTION_GONE", `Transaction ${id} is ${trans.state}`);
      change(trans);
      trans.touchedAt = this.settings.now().toISOString();
      return trans;
    });
    return value!;
  }

  /** Keeps an idle transaction alive (any request on it counts as activity). */
  async touch(id: string): Promise<void> {
    await this.mutate(id, () => undefined).catch((error: unknown) => {
      if (!(error instanceof RunnerDepotError && error.code === "CONFLICT")) throw error;
    });
  }

  /** Checks that `path` may be added: not taken, not below a file or link, nothing below a new file or link. */
  private async checkPlacement(trans: TransactionRecord, type: ManifestItem["type"], path: string): Promise<void> {
    if (trans.itemCount >= this.settings.limits.items) {
      throw new RunnerDepotError("TOO_MANY_ITEMS", `A transaction holds at most ${this.settings.limits.items} items`);
    }
    if (await this.store.getRecord(keys.item(trans.id, path))) {
      throw new RunnerDepotError("PATH_EXISTS", `${JSON.stringify(path)} was already added to this transaction`);
    }
    const ancestors = await mapLimit(ancestorsOf(path), 16, (a) => this.store.getRecord<ItemRecord>(keys.item(trans.id, a)));
    for (const ancestor of ancestors) {
      if (ancestor && ancestor.value.type !== "dir") {
        throw new RunnerDepotError("PATH_INVALID", `${JSON.stringify(path)} would lie below the ${ancestor.value.type} ${JSON.stringify(ancestor.value.path)}`);
      }
    }
    if (type !== "dir" && (await this.store.getRecord(keys.dirMark(trans.id, path)))) {
      throw new RunnerDepotError("PATH_INVALID", `Items already lie below ${JSON.stringify(path)}, so it cannot be a ${type}`);
    }
  }

  /**
   * Stores an item: a `pending` record (create-only, so PATH_EXISTS on a race), the count on
   * the transaction record (which must still be `open`: 409 CONFLICT while a commit runs,
   * 410 once committed; TOO_MANY_ITEMS), then `pending → added` by compare-and-swap, which
   * a running commit may have beaten by turning the record `rejected` (409). Any failure
   * withdraws the record. Why no interleaving with a commit publishes a refused item or
   * drops an accepted one: see {@link Transactions.commit}.
   */
  private async record(trans: TransactionRecord, item: ItemRecord): Promise<void> {
    const key = keys.item(trans.id, item.path);
    const revision = await this.store.putRecord(key, { ...item, state: "pending" } satisfies ItemRecord, { ifRevision: null });
    if (revision === null) {
      throw new RunnerDepotError("PATH_EXISTS", `${JSON.stringify(item.path)} was already added to this transaction`);
    }
    try {
      await mapLimit(ancestorsOf(item.path), 16, (a) => this.store.putRecord(keys.dirMark(trans.id, a), { path: a }, { ifRevision: null }));
      const counted = await this.mutate(trans.id, (t) => {
        if (t.itemCount >= this.settings.limits.items) {
          throw new RunnerDepotError("TOO_MANY_ITEMS", `A transaction holds at most ${this.settings.limits.items} items`);
        }
        t.itemCount += 1;
        t.bytes += item.size;
      });
      if ((await this.store.putRecord(key, { ...item, state: "added" } satisfies ItemRecord, { ifRevision: revision })) === null) {
        // A commit rejected the item. Take the reservation back unless a commit attempt
        // started since it was made: that attempt recounts from the items it settled.
        await updateRecord<TransactionRecord>(this.store, keys.trans(trans.id), (current) =>
          current?.value.state === "open" && (current.value.commitEpoch ?? 0) === (counted.commitEpoch ?? 0)
            ? { ...current.value, itemCount: current.value.itemCount - 1, bytes: current.value.bytes - item.size }
            : undefined,
        ).catch(() => undefined);
        throw await this.leftOpenError(trans.id);
      }
    } catch (error) {
      await this.withdraw(key, revision).catch(() => undefined);
      throw error;
    }
  }

  /** The error for an addition that lost its item to a commit: 409 while it runs, 410 after. */
  private async leftOpenError(id: string): Promise<RunnerDepotError> {
    const state = (await this.store.getRecord<TransactionRecord>(keys.trans(id)))?.value.state;
    if (state === "committed") return new RunnerDepotError("TRANSACTION_COMMITTED", `Transaction ${id} is committed`);
    if (state === "abandoned") return new RunnerDepotError("TRANSACTION_GONE", `Transaction ${id} was abandoned`);
    if (state === "expired") return new RunnerDepotError("TRANSACTION_EXPIRED", `Transaction ${id} expired`);
    return new RunnerDepotError("CONFLICT", `Transaction ${id} is being committed; this addition was not taken`);
  }

  /**
   * Removes a refused addition's record: its own `pending` one, or the `rejected` one a
   * commit left. Never an `added` one (a store error while confirming may have confirmed it).
   */
  private async withdraw(key: string, revision: string): Promise<void> {
    if (await this.store.deleteRecord(key, { ifRevision: revision })) return;
    const current = await this.store.getRecord<ItemRecord>(key);
    if (current?.value.state === "rejected") await this.store.deleteRecord(key, { ifRevision: current.revision });
  }

  /** Streams a body into a blob, or takes an empty body with a known digest by reference. */
  private async upload(body: UploadBody, expectedDigest: string | undefined, what: string): Promise<BlobInfo> {
    const maxBytes = this.settings.limits.itemBytes;
    if (body.length !== undefined && body.length > maxBytes) {
      throw new RunnerDepotError("TOO_LARGE", `${what} is ${body.length} bytes; at most ${maxBytes} are accepted`);
    }
    if (body.empty && expectedDigest !== undefined && expectedDigest !== EMPTY_DIGEST) {
      const stat = await this.store.statBlob(expectedDigest);
      if (!stat) throw new RunnerDepotError("DIGEST_UNKNOWN", `The depot holds no content with digest ${expectedDigest}; send the bytes`);
      if (stat.size > maxBytes) throw new RunnerDepotError("TOO_LARGE", `${what} is ${stat.size} bytes; at most ${maxBytes} are accepted`);
      return { digest: expectedDigest, size: stat.size };
    }
    try {
      return await this.store.putBlob(body.chunks, { expectedDigest, maxBytes });
    } catch (error) {
      if (error instanceof RunnerDepotError && error.code === "TOO_LARGE") {
        throw new RunnerDepotError("TOO_LARGE", `${what} is larger than ${maxBytes} bytes`, { cause: error });
      }
      throw error;
    }
  }

  /** Adds a file. */
  async addFile(trans: TransactionRecord, path: string, mode: number, body: UploadBody, expectedDigest: string | undefined): Promise<AddResult> {
    await this.checkPlacement(trans, "file", path);
    const blob = await this.upload(body, expectedDigest, JSON.stringify(path));
    const item: ItemRecord = { type: "file", path, mode, size: blob.size, digest: blob.digest };
    await this.record(trans, item);
    return { ...item };
  }

  /** Adds a directory. */
  async addDir(trans: TransactionRecord, path: string, mode: number): Promise<AddResult> {
    await this.checkPlacement(trans, "dir", path);
    const item: ItemRecord = { type: "dir", path, mode, size: 0 };
    await this.record(trans, item);
    return { ...item, digest: null };
  }

  /** Adds a symbolic link (target already decoded; checked here against the root). */
  async addLink(trans: TransactionRecord, path: string, rawTarget: string): Promise<AddResult> {
    const target = parseLinkTarget(path, rawTarget);
    await this.checkPlacement(trans, "link", path);
    const item: ItemRecord = { type: "link", path, mode: 0o777, size: 0, target };
    await this.record(trans, item);
    return { ...item, digest: null };
  }

  /** Adds a licence text. */
  async addLicense(trans: TransactionRecord, license: string, body: UploadBody, expectedDigest: string | undefined): Promise<AddResult> {
    const path = `${LICENSES_DIR}/${license}`;
    if (own(trans.licenses, license)) throw new RunnerDepotError("PATH_EXISTS", `Licence ${license} was already added`);
    if (trans.itemCount >= this.settings.limits.items) {
      throw new RunnerDepotError("TOO_MANY_ITEMS", `A transaction holds at most ${this.settings.limits.items} items`);
    }
    const blob = await this.upload(body, expectedDigest, `Licence ${license}`);
    await this.mutate(trans.id, (t) => {
      if (own(t.licenses, license)) throw new RunnerDepotError("PATH_EXISTS", `Licence ${license} was already added`);
      if (t.itemCount >= this.settings.limits.items) {
        throw new RunnerDepotError("TOO_MANY_ITEMS", `A transaction holds at most ${this.settings.limits.items} items`);
      }
      setOwn(t.licenses, license, { digest: blob.digest, size: blob.size });
      t.itemCount += 1;
      t.bytes += blob.size;
    });
    return { type: "license", license, path, size: blob.size, digest: blob.digest };
  }

  /** Sets attributes (key → value). */
  async setAttributes(trans: TransactionRecord, attributes: Record<string, string>): Promise<AddResult> {
    const next = await this.mutate(trans.id, (t) => {
      const merged = { ...t.attributes, ...attributes };
      if (Object.keys(merged).length > this.settings.limits.attributes) {
        throw new RunnerDepotError("TOO_MANY_ITEMS", `A transaction holds at most ${this.settings.limits.attributes} attributes`);
      }
      t.attributes = merged;
    });
    return { type: "set", attributes: next.attributes };
  }

  /** Adds requirements (a later one on the same name replaces the earlier). */
  async require(trans: TransactionRecord, requires: Requirement[]): Promise<Requirement[]> {
    for (const r of requires) {
      if (r.name === trans.name) throw new RunnerDepotError("SELF_DEPENDENCY", `${trans.name} cannot require itself`);
    }
    const next = await this.mutate(trans.id, (t) => {
      const byName = new Map(t.requires.map((r) => [r.name, r]));
      for (const r of requires) byName.set(r.name, r);
      if (byName.size > this.settings.limits.requires) {
        throw new RunnerDepotError("TOO_MANY_ITEMS", `A transaction holds at most ${this.settings.limits.requires} requirements`);
      }
      t.requires = [...byName.values()].sort((a, b) => compareUtf8(a.name, b.name));
    });
    return next.requires;
  }

  /** Abandons a transaction: 204 semantics, its blobs left to garbage collection. */
  async abandon(trans: TransactionRecord): Promise<void> {
    if (trans.state === "committing") throw new RunnerDepotError("CONFLICT", `Transaction ${trans.id} is being committed`);
    await this.finish(trans.id, "abandoned");
  }

  /** Moves an open transaction to a final state and drops its working records. */
  async finish(id: string, state: "abandoned" | "expired"): Promise<void> {
    const { value } = await updateRecord<TransactionRecord>(this.store, keys.trans(id), (current) => {
      if (!current || (current.value.state !== "open" && current.value.state !== "committing")) return undefined;
      return { ...current.value, state, finishedAt: this.settings.now().toISOString() };
    });
    if (value) await this.dropWorkingRecords(value);
  }

  /** Frees the slot and deletes the item and marker records of a finished transaction. */
  async dropWorkingRecords(trans: TransactionRecord): Promise<void> {
    await this.releaseSlot(trans);
    for (const prefix of [keys.items(trans.id), keys.dirMarks(trans.id)]) {
      const found: string[] = [];
      for await (const key of allKeys(this.store, prefix)) found.push(key);
      await mapLimit(found, 16, (key) => this.store.deleteRecord(key));
    }
  }

  /** Every item of a transaction, in archive order: the `added` ones (in-flight additions are not yet part of it). */
  async items(trans: TransactionRecord): Promise<ItemRecord[]> {
    const found: string[] = [];
    for await (const key of allKeys(this.store, keys.items(trans.id))) found.push(key);
    const items = await mapLimit(found, 32, async (key) => (await this.store.getRecord<ItemRecord>(key))?.value);
    return items.filter((i): i is ItemRecord => i !== undefined && (i.state ?? "added") === "added").map(withoutState).sort((a, b) => compareUtf8(a.path, b.path));
  }

  /**
   * The items a commit publishes, read after its transaction went `committing`: every
   * `added` record, while each `pending` one (an addition still in flight) is turned
   * `rejected` by compare-and-swap, so its addition can no longer confirm it (it answers
   * 409 and withdraws the record); when the addition confirmed first, the record is
   * re-read and taken. Rejected records are deleted so the path is free if the commit fails.
   */
  private async settle(trans: TransactionRecord): Promise<ItemRecord[]> {
    const found: string[] = [];
    for await (const key of allKeys(this.store, keys.items(trans.id))) found.push(key);
    const items = await mapLimit(found, 32, async (key) => {
      for (let attempt = 0; attempt < 100; attempt++) {
        const current = await this.store.getRecord<ItemRecord>(key);
        if (!current) return undefined;
        const state = current.value.state ?? "added";
        if (state === "added") return withoutState(current.value);
        if (state === "rejected") {
          await this.store.deleteRecord(key, { ifRevision: current.revision });
          return undefined;
        }
        const rejected = await this.store.putRecord(key, { ...current.value, state: "rejected" } satisfies ItemRecord, { ifRevision: current.revision });
        if (rejected !== null) {
          await this.store.deleteRecord(key, { ifRevision: rejected });
          return undefined;
        }
      }
      throw new RunnerDepotError("CONFLICT", `Too much contention on the items of transaction ${trans.id}; retry the commit`);
    });
    return items.filter((i): i is ItemRecord => i !== undefined).sort((a, b) => compareUtf8(a.path, b.path));
  }

  /** Every problem that would stop a commit. */
  async validate(trans: TransactionRecord, items: ItemRecord[]): Promise<CommitProblem[]> {
    const problems: CommitProblem[] = [];
    // No items is fine: a meta-package may carry only requirements.
    const byPath = new Map(items.map((i) => [i.path, i]));
    for (const item of items) {
      for (const ancestor of ancestorsOf(item.path)) {
        const above = byPath.get(ancestor);
        if (above && above.type !== "dir") {
          problems.push({ code: "PATH_INVALID", path: item.path, detail: `${item.path} lies below the ${above.type} ${ancestor}` });
        }
      }
      if (item.type === "link") {
        try {
          parseLinkTarget(item.path, item.target ?? "");
        } catch (error) {
          problems.push({ code: "PATH_INVALID", path: item.path, detail: (error as Error).message });
        }
      }
    }
    const blobs = [
      ...items.filter((i) => i.type === "file").map((i) => ({ path: i.path, digest: i.digest!, size: i.size })),
      ...Object.entries(trans.licenses).map(([name, l]) => ({ path: `${LICENSES_DIR}/${name}`, digest: l.digest, size: l.size })),
    ];
    const stats = await mapLimit(blobs, 32, (b) => this.store.statBlob(b.digest));
    blobs.forEach((b, i) => {
      if (stats[i]?.size !== b.size) {
        problems.push({ code: "CONTENT_MISSING", path: b.path, detail: `The content of ${b.path} (${b.digest}) is no longer stored; add it again` });
      }
    });
    return problems;
  }

  /**
   * Commits: validates, builds the archive, creates `version/<name>/<version>` (the
   * arbiter: first commit wins), then publishes it in the catalog. `first` is false when
   * this answers a repeated commit.
   *
   * Additions racing the commit. The commit first moves the transaction to `committing`
   * by compare-and-swap (time C), and only then reads the item list and settles it (see
   * {@link settle}). An addition writes its item `pending` (W), counts it on the
   * transaction record, which must be `open` (M), and confirms it `pending → added` (F),
   * answering 201 only after F succeeded. Attributes, requirements and licences are a
   * single compare-and-swap on the transaction record (which must be `open`) and are
   * taken from the record this commit's own compare-and-swap wrote, so they are in the
   * package exactly when they were applied before C, and refused (409) after it.
   * - 201 ⇒ published: M saw `open`, and the state stays `committing` from C until the
   *   publishing attempt ends (a failed attempt reopens only when no other attempt is
   *   live), so M came before C, hence W before C and before the list is read: the commit
   *   sees the record. Either it reads `added` and takes it, or it reads `pending` and
   *   its CAS to `rejected` races F on the same revision; F won (it answered 201), so the
   *   commit's CAS fails, it re-reads `added` and takes it.
   * - 409/410 ⇒ not published: the addition failed at M (its record was never `added`) or
   *   at F (a commit made it `rejected` or it was deleted); either way it never became
   *   `added`, and a commit takes only `added` records. The addition then withdraws it.
   * A reservation counted at M whose item was then rejected is taken back: by the commit,
   * which recounts `itemCount` from what it settled when it reopens or finishes, or, when
   * M came after that recount (the transaction had reopened), by the addition itself.
   */
  async commit(trans: TransactionRecord): Promise<{ result: CommitResult; first: boolean }> {
    if (trans.state === "committed") return { result: trans.result!, first: false };
    const attempt = randomUUID();
    const { value: committing } = await updateRecord<TransactionRecord>(this.store, keys.trans(trans.id), (current) => {
      if (!current) throw new RunnerDepotError("TRANSACTION_NOT_FOUND", `No transaction ${trans.id}`);
      const t = current.value;
      if (t.state === "committed") return undefined;
      if (t.state !== "open" && t.state !== "committing") throw new RunnerDepotError("TRANSACTION_GONE", `Transaction ${trans.id} is ${t.state}`);
      const nowMs = this.settings.now().getTime();
      // A retry of an interrupted commit keeps its commit time, so it rebuilds the same bytes.
      const commitTime = t.state === "committing" && t.commitTime !== undefined ? t.commitTime : Math.floor(nowMs / 1000);
      const commitAttempts = { ...this.liveAttempts(t), [attempt]: nowMs };
      const commitEpoch = (t.commitEpoch ?? 0) + 1;
      return { ...t, state: "committing", commitTime, commitAttempts, commitEpoch, touchedAt: new Date(nowMs).toISOString() };
    });
    if (committing!.state === "committed") return { result: committing!.result!, first: false };
    const t = committing!;
    let settled: ItemRecord[] | undefined;
    try {
      settled = await this.settle(t);
      return { result: await this.build(t, settled), first: true };
    } catch (error) {
      // Back to open so the client can fix problems (or abandon), unless another attempt
      // is still running (it decides); a crash here is rolled forward by a retried commit,
      // since commitTime is kept.
      await updateRecord<TransactionRecord>(this.store, keys.trans(t.id), (current) => {
        if (current?.value.state !== "committing") return undefined;
        const others = this.liveAttempts(current.value);
        delete others[attempt];
        if (Object.keys(others).length > 0) return { ...current.value, commitAttempts: others };
        const reopened: TransactionRecord = { ...current.value, state: "open" };
        delete reopened.commitAttempts;
        return settled ? { ...reopened, ...totals(reopened, settled) } : reopened;
      }).catch(() => undefined);
      throw error;
    }
  }

  /** The commit attempts of a transaction that may still be running (an attempt that crashed is forgotten after COMMIT_LEASE_MS). */
  private liveAttempts(t: TransactionRecord): Record<string, number> {
    const since = this.settings.now().getTime() - COMMIT_LEASE_MS;
    return Object.fromEntries(Object.entries(t.commitAttempts ?? {}).filter(([, startedAt]) => startedAt > since));
  }

  private async build(t: TransactionRecord, items: ItemRecord[]): Promise<CommitResult> {
    const problems = await this.validate(t, items);
    if (problems.length > 0) {
      throw new RunnerDepotError("COMMIT_INVALID", `${problems.length} problem(s) stop this commit`, { details: { problems } });
    }
    const existing = await this.store.getRecord<VersionRecord>(keys.version(t.name, t.version));
    if (existing && existing.value.transaction !== t.id) {
      throw new RunnerDepotError("VERSION_EXISTS", `${t.name}@${t.version} was published by another transaction`);
    }
    const mtime = t.commitTime!;
    const publishedAt = new Date(mtime * 1000).toISOString();
    const licenses: ManifestLicense[] = Object.entries(t.licenses)
      .map(([name, l]) => ({ name, path: `${LICENSES_DIR}/${name}`, size: l.size, digest: l.digest }))
      .sort((a, b) => compareUtf8(a.path, b.path));
    const manifest: PackageManifest = {
      name: t.name,
      version: t.version,
      publishedAt,
      attributes: sortedObject(t.attributes),
      requires: t.requires,
      licenses,
      items: items.map(manifestItem),
    };
    let version = existing?.value;
    if (!version) {
      const manifestBlob = await this.store.putBlob(once(Buffer.from(JSON.stringify(manifest), "utf8")));
      const archive = await writeArchive(this.store, manifest, mtime);
      version = {
        name: t.name,
        version: t.version,
        publishedAt,
        mtime,
        digest: archive.digest,
        size: archive.size,
        manifest: manifestBlob.digest,
        itemCount: items.length,
        attributes: manifest.attributes,
        requires: t.requires,
        transaction: t.id,
      };
      if ((await this.store.putRecord(keys.version(t.name, t.version), version, { ifRevision: null })) === null) {
        const winner = await this.store.getRecord<VersionRecord>(keys.version(t.name, t.version));
        if (winner?.value.transaction !== t.id) {
          throw new RunnerDepotError("VERSION_EXISTS", `${t.name}@${t.version} was published by another transaction`);
        }
        version = winner.value;
      }
    }
    await publishToCatalog(this.store, t.name, t.version, this.settings.now());
    const result: CommitResult = {
      name: t.name,
      version: t.version,
      digest: version.digest,
      location: `/data/${t.name}@${t.version}`,
    };
    const { value: done } = await updateRecord<TransactionRecord>(this.store, keys.trans(t.id), (current) =>
      current && current.value.state !== "committed"
        ? { ...withoutAttempts(current.value), ...totals(t, items), state: "committed", result, finishedAt: this.settings.now().toISOString() }
        : undefined,
    );
    if (done) await this.dropWorkingRecords(done).catch(() => undefined);
    return result;
  }
}

/** How long a commit attempt counts as running when it never reported back (it crashed). */
const COMMIT_LEASE_MS = 10 * 60 * 1000;

function withoutState(item: ItemRecord): ItemRecord {
  const { state: _state, ...rest } = item;
  return rest;
}

function withoutAttempts(t: TransactionRecord): TransactionRecord {
  const { commitAttempts: _attempts, ...rest } = t;
  return rest;
}

/** Item count and bytes of a transaction from its settled items and its licences. */
function totals(t: TransactionRecord, items: ItemRecord[]): { itemCount: number; bytes: number } {
  const licenses = Object.values(t.licenses);
  return {
    itemCount: items.length + licenses.length,
    bytes: items.reduce((sum, i) => sum + i.size, 0) + licenses.reduce((sum, l) => sum + l.size, 0),
  };
}

function manifestItem(item: ItemRecord): ManifestItem {
  const out: ManifestItem = { type: item.type, path: item.path, mode: item.mode, size: item.size };
  if (item.type === "file") out.digest = item.digest;
  if (item.type === "link") out.target = item.target;
  return out;
}

function sortedObject(record: Record<string, string>): Record<string, string> {
  return Object.fromEntries(Object.entries(record).sort(([a], [b]) => compareUtf8(a, b)));
}

async function* once(bytes: Uint8Array): AsyncIterable<Uint8Array> {
  yield bytes;
}
