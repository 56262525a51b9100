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

  /** Stores an item record and counts it; PATH_EXISTS / TOO_MANY_ITEMS on races. */
  private async record(trans: TransactionRecord, item: ItemRecord): Promise<void> {
    if ((await this.store.putRecord(keys.item(trans.id, item.path), item, { ifRevision: null })) === null) {
      throw new RunnerDepotError("PATH_EXISTS", `${JSON.stringify(item.path)} was already added to this transaction`);
    }
    await mapLimit(ancestorsOf(item.path), 16, (a) => this.store.putRecord(keys.dirMark(trans.id, a), { path: a }, { ifRevision: null }));
    try {
      await this.mutate(trans.id, (t) => {
        if (t.itemCount >= this.settings.limits.items) {
          throw new RunnerDepotError("TOO_MANY_ITEMS", `A transaction holds at most ${this.settings.limits.items} items`);
        }
        t.itemCount += 1;
        t.bytes += item.size;
      });
    } catch (error) {
      if (error instanceof RunnerDepotError && error.code === "TOO_MANY_ITEMS") await this.store.deleteRecord(keys.item(trans.id, item.path));
      throw error;
    }
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

  /** Every item of a transaction, in archive order. */
  async items(trans: TransactionRecord): Promise<ItemRecord[]> {
    const found: string[] = [];
    for await (const key of allKeys(this.store, keys.items(trans.id))) found.push(key);
    const items = await mapLimit(found, 32, async (key) => (await this.store.getRecord<ItemRecord>(key))?.value);
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
   */
  async commit(trans: TransactionRecord): Promise<{ result: CommitResult; first: boolean }> {
    if (trans.state === "committed") return { result: trans.result!, first: false };
    const { value: committing } = await updateRecord<TransactionRecord>(this.store, keys.trans(trans.id), (current) => {
      if (!current) throw new RunnerDepotError("TRANSACTION_NOT_FOUND", `No transaction ${trans.id}`);
      const t = current.value;
      if (t.state === "committed") return undefined;
      if (t.state !== "open" && t.state !== "committing") throw new RunnerDepotError("TRANSACTION_GONE", `Transaction ${trans.id} is ${t.state}`);
      if (t.state === "committing" && t.commitTime !== undefined) return undefined;
      return { ...t, state: "committing", commitTime: Math.floor(this.settings.now().getTime() / 1000), touchedAt: this.settings.now().toISOString() };
    });
    if (committing!.state === "committed") return { result: committing!.result!, first: false };
    const t = committing!;
    try {
      return { result: await this.build(t), first: true };
    } catch (error) {
      // Back to open so the client can fix problems (or abandon); a crash here is rolled
      // forward by a retried commit, since commitTime is kept.
      await updateRecord<TransactionRecord>(this.store, keys.trans(t.id), (current) =>
        current?.value.state === "committing" ? { ...current.value, state: "open" } : undefined,
      ).catch(() => undefined);
      throw error;
    }
  }

  private async build(t: TransactionRecord): Promise<CommitResult> {
    const items = await this.items(t);
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
        ? { ...current.value, state: "committed", result, finishedAt: this.settings.now().toISOString() }
        : undefined,
    );
    if (done) await this.dropWorkingRecords(done).catch(() => undefined);
    return result;
  }
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
