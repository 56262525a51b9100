/**
 * The commit of a transaction: settle its items against in-flight additions, validate,
 * build the archive, create the version record (first commit wins) and publish it.
 */
import { RunnerDepotError } from "../../errors.js";
import { endAttempt, liveAttempts, startAttempt } from "./attempts.js";
import { keepArchive } from "../package/archive-keeper.js";
import {
  archiveLayout,
  commitArchive,
  LICENSES_DIR,
  type ManifestItem,
  type ManifestLicense,
  type PackageManifest,
} from "../package/archive.js";
import { belowOf, resolveLink, treeOf, type BelowLookup, type TreeLookup } from "../package/links.js";
import { compactAfter } from "../catalog/pages.js";
import { OrderedWrites } from "./ordered-writes.js";
import { ClaimWaits, MAX_CLAIM_WAITS, publishVersion } from "../catalog/packages.js";
import { ancestorsOf, caseCollisions, compareUtf8 } from "../package/paths.js";
import type { PackageStore } from "../ports.js";
import {
  allKeys,
  keys,
  mapLimit,
  updateRecord,
  type CommitResult,
  type ItemRecord,
  type TransactionRecord,
  type VersionRecord,
  WHOLE_LISTING,
} from "../store/records.js";
import { notePublished } from "./references.js";
import { giveBack, reserveUsage, type QuotaOf } from "../store/quota.js";
import { withoutState, type Transactions, type TransactionSettings } from "./lifecycle.js";

/** One problem found when validating a transaction. */
export interface CommitProblem {
  code: string;
  detail: string;
  path?: string;
}

/**
 * Commits transactions.
 *
 * @example
 * const { result } = await new Commits(store, transactions).commit(trans);
 */
export class Commits {
  private readonly settings: TransactionSettings;
  /** Work a commit goes on with after it answered (see the end of `build`). */
  private readonly afterAnswer = new Set<Promise<unknown>>();
  /** Commits of this router waiting for another attempt's live sequencing claim (packages.ts). */
  private readonly claimWaits = new ClaimWaits(MAX_CLAIM_WAITS);

  /**
   * `quota`, when given, makes every commit reserve its version's room in its principal's usage (depot/store/quota.ts)
   * before the version record is written: over quota is 413 QUOTA_EXCEEDED, and nothing is written.
   */
  constructor(
    private readonly store: PackageStore,
    private readonly transactions: Transactions,
    private readonly quota?: QuotaOf,
  ) {
    this.settings = transactions.settings;
  }

  /**
   * The items a commit publishes, read after its transaction went `committing`.
   * Why: docs/decisions/depot-catalog.md, "commit.ts: Commits.settle".
   */
  private async settle(trans: TransactionRecord): Promise<ItemRecord[]> {
    // Cost O(items log items): one listing of the keys (WHOLE_LISTING: one walk on the fs
    // store, not one per 1,000 items), one read per item, one sort. Every later step of the
    // commit is O(items) too (validate: O(depth) lookups and one stat per item; the archive:
    // one pass reading each item once), so the cost per item stays flat.
    const found: string[] = [];
    for await (const key of allKeys(this.store, keys.items(trans.id), WHOLE_LISTING)) found.push(key);
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
        const rejected = await this.store.putRecord(key, { ...current.value, state: "rejected" } satisfies ItemRecord, {
          ifRevision: current.revision,
        });
        if (rejected !== null) {
          await this.store.deleteRecord(key, { ifRevision: rejected });
          return undefined;
        }
      }
      throw new RunnerDepotError(
        "CONFLICT",
        `Too much contention on the items of transaction ${trans.id}; retry the commit`,
      );
    });
    return items.filter((i): i is ItemRecord => i !== undefined).sort((a, b) => compareUtf8(a.path, b.path));
  }

  /**
   * Every problem that would stop a commit: the tree's path problems ({@link treeProblems}: an item below a file or
   * link, two paths equal but for case, a link whose chain through the package's links leaves the root), content no
   * longer stored. `tree` is where ancestors and links are looked up (default: `items`
   * themselves, the whole tree at commit); `licenses: false` skips the licences (a
   * summary page after the first). O(items × depth) lookups plus one stat per file.
   */
  async validate(
    trans: TransactionRecord,
    items: ItemRecord[],
    options: { tree?: TreeLookup; below?: BelowLookup; licenses?: boolean } = {},
  ): Promise<CommitProblem[]> {
    const problems = await treeProblems(items, options);
    const blobs = [
      ...items.filter((i) => i.type === "file").map((i) => ({ path: i.path, digest: i.digest!, size: i.size })),
      ...(options.licenses === false ? [] : Object.entries(trans.licenses)).map(([name, l]) => ({
        path: `${LICENSES_DIR}/${name}`,
        digest: l.digest,
        size: l.size,
      })),
    ];
    const stats = await mapLimit(blobs, 32, (b) => this.store.statBlob(b.digest));
    blobs.forEach((b, i) => {
      if (stats[i]?.size !== b.size) {
        problems.push({
          code: "CONTENT_MISSING",
          path: b.path,
          detail: `The content of ${b.path} (${b.digest}) is no longer stored; add it again`,
        });
      }
    });
    return problems;
  }

  /**
   * Commits: validates, builds the archive, creates `version/<name>/<version>` (the
   * arbiter: first commit wins), then publishes it in the catalog. `first` is false when
   * this answers a repeated commit.
   *
   * `options.clientGone` says whether the client asking has hung up: a wait for another
   * attempt's sequencing claim then stops at its next poll (packages.ts).
   * Why: docs/decisions/depot-catalog.md, "commit.ts: additions racing the commit".
   */
  async commit(
    trans: TransactionRecord,
    options: { clientGone?: () => boolean } = {},
  ): Promise<{ result: CommitResult; first: boolean }> {
    if (trans.state === "committed") return { result: trans.result!, first: false };
    // The attempt id names this process, so a restart knows at once that it died (depot/transactions/attempts.ts).
    const attempt = startAttempt();
    // One flush for the commit's durable writes, before `committed` and the answer
    // (depot/transactions/ordered-writes.ts; publishVersion flushes them); the attempt stays live until then.
    const writes = new OrderedWrites(this.store);
    try {
      const outcome = await this.attemptCommit(trans, attempt, writes, options.clientGone);
      await writes.durable();
      return outcome;
    } finally {
      endAttempt(attempt);
    }
  }

  private async attemptCommit(
    trans: TransactionRecord,
    attempt: string,
    writes: OrderedWrites,
    clientGone: (() => boolean) | undefined,
  ): Promise<{ result: CommitResult; first: boolean }> {
    const { value: committing } = await updateRecord<TransactionRecord>(
      this.store,
      keys.trans(trans.id),
      (current) => {
        if (!current) throw new RunnerDepotError("TRANSACTION_NOT_FOUND", `No transaction ${trans.id}`);
        const t = current.value;
        if (t.state === "committed") return undefined;
        if (t.state !== "open" && t.state !== "committing")
          throw new RunnerDepotError("TRANSACTION_GONE", `Transaction ${trans.id} is ${t.state}`);
        const nowMs = this.settings.now().getTime();
        // A retry of an interrupted commit keeps its commit time, so it rebuilds the same bytes.
        const commitTime =
          t.state === "committing" && t.commitTime !== undefined ? t.commitTime : Math.floor(nowMs / 1000);
        const commitAttempts = { ...this.liveAttempts(t), [attempt]: nowMs };
        const commitEpoch = (t.commitEpoch ?? 0) + 1;
        return {
          ...t,
          state: "committing",
          commitTime,
          commitAttempts,
          commitEpoch,
          touchedAt: new Date(nowMs).toISOString(),
        };
      },
      { guess: true, writes },
    );
    if (committing!.state === "committed") return { result: committing!.result!, first: false };
    const t = committing!;
    let settled: ItemRecord[] | undefined;
    const progress = { versionWritten: false };
    try {
      settled = await this.settle(t);
      return { result: await this.build(t, settled, writes, clientGone, progress), first: true };
    } catch (error) {
      // Back to open so the client can fix problems (or abandon), unless another attempt is still running (it
      // decides) or this transaction's version record is written.
      // Why: docs/decisions/depot-catalog.md, "commit.ts: inside Commits.attemptCommit".
      await updateRecord<TransactionRecord>(
        this.store,
        keys.trans(t.id),
        (current) => {
          if (current?.value.state !== "committing") return undefined;
          const others = this.liveAttempts(current.value);
          delete others[attempt];
          if (Object.keys(others).length > 0 || progress.versionWritten)
            return { ...current.value, commitAttempts: others };
          const reopened: TransactionRecord = { ...current.value, state: "open" };
          delete reopened.commitAttempts;
          return settled ? { ...reopened, ...totals(reopened, settled) } : reopened;
        },
        { guess: true },
      ).catch(() => undefined);
      throw error;
    }
  }

  /**
   * The commit attempts of a transaction that may still be running (depot/transactions/attempts.ts tells dead ones at
   * once).
   */
  private liveAttempts(t: TransactionRecord): Record<string, number> {
    return liveAttempts(t.commitAttempts, this.settings.now().getTime());
  }

  private async build(
    t: TransactionRecord,
    items: ItemRecord[],
    writes: OrderedWrites,
    clientGone: (() => boolean) | undefined,
    progress: { versionWritten: boolean },
  ): Promise<CommitResult> {
    const problems = await this.validate(t, items);
    if (problems.length > 0) {
      throw new RunnerDepotError("COMMIT_INVALID", `${problems.length} problem(s) stop this commit`, {
        details: { problems },
      });
    }
    // The package's room for one more version (DepotLimits.versions) is read beside the
    // version record, and only matters when this commit would write it.
    const [existing, room] = await Promise.all([
      this.store.getRecord<VersionRecord>(keys.version(t.name, t.version)),
      this.transactions.checkVersionRoom(t.name, t.version).catch((error: unknown) => error),
    ]);
    if (existing && existing.value.transaction !== t.id) {
      throw new RunnerDepotError("VERSION_EXISTS", `${t.name}@${t.version} was published by another transaction`);
    }
    // Additions check the count on the transaction record, a lazy write a machine crash may
    // lose (depot-publish-durability.md): a transaction that survived one may have taken
    // more than the limit since. Checked again on what was settled, unless this
    // transaction's version is already written (then the commit only rolls forward).
    if (!existing && room !== undefined) throw room;
    const counted = totals(t, items); // O(items): once, for this check and the committed record
    if (!existing && counted.itemCount > this.settings.limits.items) {
      throw new RunnerDepotError(
        "TOO_MANY_ITEMS",
        `Transaction ${t.id} holds ${counted.itemCount} items and licences; at most ${this.settings.limits.items} are accepted (abandon it)`,
      );
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
    let written: Buffer | undefined; // the manifest's JSON, when this call wrote the version
    if (!version) {
      const manifestJson = Buffer.from(JSON.stringify(manifest), "utf8");
      written = manifestJson;
      // The room is taken before any byte is written, and given back if the version record is not ours.
      const reserved = this.quota ? await this.reserve(t.principal, manifest, manifestJson, mtime) : undefined;
      try {
        version = await this.writeVersion(t, items, manifest, manifestJson, mtime, publishedAt, writes, reserved);
      } catch (error) {
        if (reserved !== undefined) await giveBack(this.store, t.principal, reserved).catch(() => undefined);
        throw error;
      }
    }
    // From here on the version record is this transaction's: a failure must not reopen it.
    progress.versionWritten = true;
    const result: CommitResult = {
      name: t.name,
      version: t.version,
      digest: version.digest,
      location: `/data/${t.name}@${t.version}`,
    };
    // Lazy: the version is durable and listed by then (publishVersion flushes the commit's
    // ordered writes before it calls this), and a machine crash that loses this
    // write leaves the transaction `committing` under a dead attempt, still listed in its
    // slot (kept below), which recovery rolls forward to this same answer (depot/transactions/recovery.ts).
    // Written beside the drop of the sequencing claim (both lazy; packages.ts).
    let done: TransactionRecord | undefined;
    const markCommitted = async () => {
      ({ value: done } = await updateRecord<TransactionRecord>(
        this.store,
        keys.trans(t.id),
        (current) =>
          current && current.value.state !== "committed"
            ? {
                ...withoutAttempts(current.value),
                ...counted,
                state: "committed",
                result,
                finishedAt: this.settings.now().toISOString(),
              }
            : undefined,
        { guess: true, lazy: true },
      ));
    };
    // Visible in its package's record, then one position in the change sequence (packages.ts).
    const position = await publishVersion(this.store, t.name, t.version, this.settings.now(), {
      sequenced: markCommitted,
      writes,
      clientGone,
      waits: this.claimWaits,
    });
    // A store serving by redirect gets its copy of the archive now, beside the answer, not
    // during the commit's own writes (archive-keeper.ts). The version record is written, so GC keeps it.
    if (written && this.store.signBlobUrl) {
      const layout = archiveLayout(manifest, written, mtime);
      void keepArchive(this.store, layout, { digest: version.digest, size: version.size });
    }
    // After the answer: readers of this package may now add its bytes by reference.
    // Why: docs/decisions/depot-catalog.md, "commit.ts: inside Commits.build".
    const digests = [
      version.digest,
      ...licenses.map((l) => l.digest),
      ...items.flatMap((i) => (i.digest ? [i.digest] : [])),
    ];
    // And when this commit filled a shard of the change sequence, its pack and catalog page
    // are written (depot/catalog/pages.ts), so a catalog page never reads 1,000 packages one by one.
    const later = notePublished(this.store, t.name, digests)
      .catch(() => undefined)
      .then(() => compactAfter(this.store, position))
      .catch(() => undefined)
      .then(() => (done ? this.transactions.dropWorkingRecords(done, { keepSlot: true }) : undefined))
      .catch(() => undefined)
      .finally(() => this.afterAnswer.delete(later));
    this.afterAnswer.add(later);
    return result;
  }

  /** Quota on: this version's archive size reserved from `principal`'s usage (QUOTA_EXCEEDED); the bytes reserved. */
  private async reserve(principal: string, manifest: PackageManifest, json: Buffer, mtime: number): Promise<number> {
    const bytes = archiveLayout(manifest, json, mtime).size; // O(items), no read: the archive's exact length
    await reserveUsage(this.store, principal, this.quota!(principal) ?? {}, bytes);
    return bytes;
  }

  /** Stores the manifest blob, hashes the archive, creates the version record (first commit wins). */
  private async writeVersion(
    t: TransactionRecord,
    items: ItemRecord[],
    manifest: PackageManifest,
    manifestJson: Buffer,
    mtime: number,
    publishedAt: string,
    writes: OrderedWrites,
    reserved: number | undefined,
  ): Promise<VersionRecord> {
    // The manifest blob is stored while the archive is hashed (one pass over the
    // assembled archive: its digest and size, no second copy of the bytes); the version
    // record below needs both. A row is flushed with the commit's other writes, a file
    // before its put resolves (depot/transactions/ordered-writes.ts). A crash between them leaves at most
    // an unreferenced blob, which garbage collection takes.
    const [manifestBlob, archive] = await Promise.all([
      this.store.putBlob(once(manifestJson), writes.blob()),
      commitArchive(this.store, manifest, mtime, manifestJson),
    ]);
    const version: VersionRecord = {
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
      ...(reserved !== undefined ? { principal: t.principal } : {}),
    };
    if (
      (await this.store.putRecord(keys.version(t.name, t.version), version, writes.record({ ifRevision: null }))) ===
      null
    ) {
      const winner = await this.store.getRecord<VersionRecord>(keys.version(t.name, t.version));
      if (winner?.value.transaction !== t.id) {
        throw new RunnerDepotError("VERSION_EXISTS", `${t.name}@${t.version} was published by another transaction`);
      }
      // Another attempt of this transaction wrote it: its reservation is the one that stands.
      if (reserved !== undefined) await giveBack(this.store, t.principal, reserved);
      return winner.value;
    }
    return version;
  }

  /** Resolves once the work commits went on with after answering is done (a host closing its store waits for it). */
  async idle(): Promise<void> {
    while (this.afterAnswer.size > 0) await Promise.all([...this.afterAnswer]);
  }
}

/**
 * The path problems of a package tree by the commit's rules (docs/depot-api.md §8): an item below a file or link, a
 * link whose chain through the package's links leaves the root or enters `.pkg/` (depot/package/links.ts), and, with
 * the whole tree (no `options.tree`), two items at one path or two paths equal but for case. `tree` is where
 * ancestors and links are looked up (default: `items` themselves). Exported so that a version copied from an
 * upstream (depot/mirror/upstream-manifest.ts) passes the very rules a publish does. O(items × depth) lookups.
 *
 * @example
 * const problems = await treeProblems(manifest.items); // [] when a commit would take these items
 */
export async function treeProblems(
  items: ReadonlyArray<{ type: string; path: string; target?: string }>,
  options: { tree?: TreeLookup; below?: BelowLookup } = {},
): Promise<CommitProblem[]> {
  const problems: CommitProblem[] = [];
  // No items is fine: a meta-package may carry only requirements.
  const tree = options.tree ?? treeOf(items);
  const below = options.tree ? options.below : belowOf(items);
  for (const item of items) {
    for (const ancestor of ancestorsOf(item.path)) {
      const above = await tree(ancestor);
      if (above && above.type !== "dir") {
        problems.push({
          code: "PATH_INVALID",
          path: item.path,
          detail: `${item.path} lies below the ${above.type} ${ancestor}`,
        });
      }
    }
    if (item.type === "link") {
      try {
        await resolveLink(item.path, item.target ?? "", tree, below);
      } catch (error) {
        problems.push({ code: "PATH_INVALID", path: item.path, detail: (error as Error).message });
      }
    }
  }
  // Only with the whole tree (a commit): a summary page sees a part of it.
  if (!options.tree) {
    // A transaction holds one item per path (its records are keyed by path: PATH_EXISTS at the addition), so
    // only a list from elsewhere, such as an upstream's manifest, can name one twice.
    const seen = new Set<string>();
    for (const item of items) {
      if (seen.has(item.path))
        problems.push({ code: "PATH_EXISTS", path: item.path, detail: `${item.path} is listed more than once` });
      seen.add(item.path);
    }
    for (const [first, second] of caseCollisions(items.map((i) => i.path))) {
      problems.push({
        code: "PATH_INVALID",
        path: second,
        detail: `${second} and ${first} differ only in case: one path on a case-insensitive filesystem`,
      });
    }
  }
  return problems;
}

/** A transaction record without its commit attempts. */
export function withoutAttempts(t: TransactionRecord): TransactionRecord {
  const { commitAttempts: _attempts, ...rest } = t;
  return rest;
}

/** Item count and bytes of a transaction from its settled items and its licences. */
export function totals(t: TransactionRecord, items: ItemRecord[]): { itemCount: number; bytes: number } {
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
