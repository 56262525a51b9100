/**
 * Additions to an open transaction: files, directories, links and licences, each an item
 * record written `pending` and confirmed `added` (see {@link Additions.record}), and the
 * upload of their bytes into the blob store.
 */
import { RunnerDepotError } from "../../errors.js";
import { LICENSES_DIR, type ManifestItem } from "../package/archive.js";
import { EMPTY_DIGEST } from "../package/digest.js";
import { ancestorsOf, parseLinkTarget } from "../package/paths.js";
import type { BlobInfo, PackageStore } from "../ports.js";
import { resolveLink, type TreeEntry } from "../package/links.js";
import {
  keys,
  mapLimit,
  own,
  setOwn,
  updateRecord,
  type ItemRecord,
  type TransactionRecord,
} from "../store/records.js";
import { OrderedWrites } from "./ordered-writes.js";
import { mayReference, noteUpload } from "./references.js";
import type { AddResult, Transactions, TransactionSettings } from "./lifecycle.js";

/** What an addition by reference may read: asked for each package holding the referenced bytes. */
export interface ReferenceAccess {
  mayRead(name: string): Promise<boolean>;
}

/** A body being uploaded: its bytes, or `empty` when nothing was sent. */
export interface UploadBody {
  empty: boolean;
  chunks: AsyncIterable<Uint8Array>;
  /** Content-Length, when the client sent one. */
  length?: number;
}

/**
 * The addition paths of the transaction engine.
 *
 * @example
 * const additions = new Additions(store, transactions);
 * await additions.addDir(trans, "bin", 0o755);
 */
export class Additions {
  private readonly settings: TransactionSettings;

  constructor(
    private readonly store: PackageStore,
    private readonly transactions: Transactions,
  ) {
    this.settings = transactions.settings;
  }

  private mutate(id: string, change: (trans: TransactionRecord) => void): Promise<TransactionRecord> {
    return this.transactions.mutate(id, change);
  }

  /** Checks that `path` may be added: not taken, not below a file or link, nothing below a new file or link. */
  private async checkPlacement(trans: TransactionRecord, type: ManifestItem["type"], path: string): Promise<void> {
    if (trans.itemCount >= this.settings.limits.items) {
      throw new RunnerDepotError("TOO_MANY_ITEMS", `A transaction holds at most ${this.settings.limits.items} items`);
    }
    if (await this.store.getRecord(keys.item(trans.id, path))) {
      throw new RunnerDepotError("PATH_EXISTS", `${JSON.stringify(path)} was already added to this transaction`);
    }
    const ancestors = await mapLimit(ancestorsOf(path), 16, (a) =>
      this.store.getRecord<ItemRecord>(keys.item(trans.id, a)),
    );
    for (const ancestor of ancestors) {
      if (ancestor && ancestor.value.type !== "dir") {
        throw new RunnerDepotError(
          "PATH_INVALID",
          `${JSON.stringify(path)} would lie below the ${ancestor.value.type} ${JSON.stringify(ancestor.value.path)}`,
        );
      }
    }
    if (type !== "dir" && (await this.store.getRecord(keys.dirMark(trans.id, path)))) {
      throw new RunnerDepotError(
        "PATH_INVALID",
        `Items already lie below ${JSON.stringify(path)}, so it cannot be a ${type}`,
      );
    }
  }

  /**
   * Stores an item: a `pending` record (create-only, so PATH_EXISTS on a race).
   * Why: docs/decisions/depot-server.md, "additions.ts: Additions.record".
   */
  private async record(
    trans: TransactionRecord,
    item: ItemRecord,
    writes = new OrderedWrites(this.store),
  ): Promise<void> {
    const key = keys.item(trans.id, item.path);
    // Lazy: the confirmation below replaces it durably before the 201, and a `pending` one a
    // machine crash keeps or loses was never answered 201 (the commit rejects it).
    const revision = await this.store.putRecord(key, { ...item, state: "pending" } satisfies ItemRecord, {
      ifRevision: null,
      lazy: true,
    });
    if (revision === null) {
      throw new RunnerDepotError("PATH_EXISTS", `${JSON.stringify(item.path)} was already added to this transaction`);
    }
    try {
      // Read first: the marker of a directory that already holds items is not written again.
      await mapLimit(ancestorsOf(item.path), 16, async (a) => {
        const mark = keys.dirMark(trans.id, a);
        // Lazy: a marker only refuses early what the commit's validation refuses anyway (an
        // item below a file or link), so losing one in a machine crash loses no rule.
        if (!(await this.store.getRecord(mark)))
          await this.store.putRecord(mark, { path: a }, { ifRevision: null, lazy: true });
      });
      const counted = await this.transactions.reserve(trans.id, item.size);
      // Visible is enough to go on; flushed at the end, before the 201 (depot/transactions/ordered-writes.ts).
      if (
        (await this.store.putRecord(
          key,
          { ...item, state: "added" } satisfies ItemRecord,
          writes.record({ ifRevision: revision }),
        )) === null
      ) {
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
    // Outside the try: a failed flush answers an error but withdraws nothing (the item is visible).
    await writes.durable();
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

  /**
   * Streams a body into a blob, or takes an empty body with a known digest by reference:
   * only when the transaction's principal could read those bytes already (see
   * depot/transactions/references.ts); otherwise exactly the answer unknown content gets.
   */
  private async upload(
    trans: TransactionRecord,
    body: UploadBody,
    expectedDigest: string | undefined,
    what: string,
    access: ReferenceAccess,
    writes?: OrderedWrites,
  ): Promise<BlobInfo> {
    const maxBytes = this.settings.limits.itemBytes;
    if (body.length !== undefined && body.length > maxBytes) {
      throw new RunnerDepotError("TOO_LARGE", `${what} is ${body.length} bytes; at most ${maxBytes} are accepted`);
    }
    if (body.empty && expectedDigest !== undefined && expectedDigest !== EMPTY_DIGEST) {
      const allowed = await mayReference(this.store, expectedDigest, trans.principal, access.mayRead);
      const stat = allowed ? await this.store.statBlob(expectedDigest) : null;
      if (!stat)
        throw new RunnerDepotError(
          "DIGEST_UNKNOWN",
          `The depot holds no content with digest ${expectedDigest}; send the bytes`,
        );
      if (stat.size > maxBytes)
        throw new RunnerDepotError("TOO_LARGE", `${what} is ${stat.size} bytes; at most ${maxBytes} are accepted`);
      return { digest: expectedDigest, size: stat.size };
    }
    let blob: BlobInfo;
    try {
      // With `writes`: a blob kept in the records' order (a small one on the fs store) is
      // flushed with the item that references it, a file before this resolves.
      const options = { expectedDigest, maxBytes, size: body.length };
      blob = await this.store.putBlob(body.chunks, writes ? writes.blob(options) : options);
    } catch (error) {
      if (error instanceof RunnerDepotError && error.code === "TOO_LARGE") {
        throw new RunnerDepotError("TOO_LARGE", `${what} is larger than ${maxBytes} bytes`, { cause: error });
      }
      throw error;
    }
    // The bytes travelled: this principal may reference them from now on.
    if (blob.digest !== EMPTY_DIGEST) await noteUpload(this.store, blob.digest, trans.principal);
    return blob;
  }

  /** Adds a file. */
  async addFile(
    trans: TransactionRecord,
    path: string,
    mode: number,
    body: UploadBody,
    expectedDigest: string | undefined,
    access: ReferenceAccess,
  ): Promise<AddResult> {
    await this.checkPlacement(trans, "file", path);
    // The blob and the confirmed item share one flush, before the 201 (depot/transactions/ordered-writes.ts).
    const writes = new OrderedWrites(this.store);
    const blob = await this.upload(trans, body, expectedDigest, JSON.stringify(path), access, writes);
    const item: ItemRecord = { type: "file", path, mode, size: blob.size, digest: blob.digest };
    await this.record(trans, item, writes);
    return { ...item };
  }

  /** Adds a directory. */
  async addDir(trans: TransactionRecord, path: string, mode: number): Promise<AddResult> {
    await this.checkPlacement(trans, "dir", path);
    const item: ItemRecord = { type: "dir", path, mode, size: 0 };
    await this.record(trans, item);
    return { ...item, digest: null };
  }

  /**
   * Adds a symbolic link (target already decoded). The target is resolved through the
   * links added so far (and this one), so a chain that leaves the root is refused here;
   * the commit resolves every link again against the whole tree (links added later).
   */
  async addLink(trans: TransactionRecord, path: string, rawTarget: string): Promise<AddResult> {
    const target = parseLinkTarget(path, rawTarget);
    await this.checkPlacement(trans, "link", path);
    await resolveLink(
      path,
      target,
      (p) => (p === path ? { type: "link", target } : this.entryAt(trans, p)),
      (dir) => this.holdsItems(trans, dir),
    );
    const item: ItemRecord = { type: "link", path, mode: 0o777, size: 0, target };
    await this.record(trans, item);
    return { ...item, digest: null };
  }

  /** Whether any item lies below `dir` (its directory marker exists). */
  async holdsItems(trans: TransactionRecord, dir: string): Promise<boolean> {
    return (await this.store.getRecord(keys.dirMark(trans.id, dir))) !== null;
  }

  /** The item at `path` as link resolution sees it: pending and added items count, rejected ones do not. */
  async entryAt(trans: TransactionRecord, path: string): Promise<TreeEntry | undefined> {
    const item = (await this.store.getRecord<ItemRecord>(keys.item(trans.id, path)))?.value;
    if (!item || item.state === "rejected") return undefined;
    return item.type === "link" ? { type: "link", target: item.target ?? "" } : { type: item.type };
  }

  /** Adds a licence text. */
  async addLicense(
    trans: TransactionRecord,
    license: string,
    body: UploadBody,
    expectedDigest: string | undefined,
    access: ReferenceAccess,
  ): Promise<AddResult> {
    const path = `${LICENSES_DIR}/${license}`;
    if (own(trans.licenses, license)) throw new RunnerDepotError("PATH_EXISTS", `Licence ${license} was already added`);
    if (trans.itemCount >= this.settings.limits.items) {
      throw new RunnerDepotError("TOO_MANY_ITEMS", `A transaction holds at most ${this.settings.limits.items} items`);
    }
    const blob = await this.upload(trans, body, expectedDigest, `Licence ${license}`, access);
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
}
