/**
 * Recovery and garbage collection on a PackageStore: settle commits whose process died,
 * expire idle transactions, and delete blobs nothing references (item blobs stay while a
 * published version's manifest names them).
 */
import type { PackageManifest } from "../package/archive.js";
import type { PackageStore } from "../ports.js";
import {
  allKeys,
  keys,
  emptyRecord,
  own,
  setOwn,
  WHOLE_LISTING,
  type DeltaRecord,
  type ItemRecord,
  type TransactionRecord,
  type VersionRecord,
} from "./records.js";
import { forgetReferences } from "../transactions/references.js";
import { recoverCommit, recoverDeadCommits } from "../transactions/recovery.js";
import type { Transactions } from "../transactions/lifecycle.js";
import { readVersionManifest } from "./blob-read.js";

/** What one garbage collection did. */
export interface GarbageReport {
  /** Commits whose process died, now rolled forward or reopened (depot/transactions/recovery.ts). */
  recovered: number;
  /** Transactions that expired in this run. */
  expired: number;
  /** Finished transaction records removed after their retention. */
  forgotten: number;
  /** Blobs deleted. */
  deletedBlobs: number;
  /** Bytes of the deleted blobs (their size just before deletion). */
  reclaimedBytes: number;
  /** Blobs unreferenced now but younger than the grace period (deleted by a later run). */
  pendingBlobs: number;
}

/** Settings of {@link collectGarbage}. */
interface GarbageSettings {
  now: () => Date;
  /** A blob must be unreferenced in two runs at least this far apart before it goes. */
  graceMs: number;
  /** How long a finished (committed, abandoned, expired) transaction still answers. */
  retainMs: number;
  /** Told of each transaction this run expired (the router logs `transaction expired`). */
  onExpired?: (trans: TransactionRecord) => void;
}

/**
 * One garbage-collection run: recover, expire, then delete blobs referenced by no
 * published version, kept delta or live transaction, once they have stayed unreferenced
 * for `graceMs` (so a blob uploaded while this runs is never taken).
 */
export async function collectGarbage(
  store: PackageStore,
  transactions: Transactions,
  settings: GarbageSettings,
): Promise<GarbageReport> {
  const report: GarbageReport = {
    recovered: 0,
    expired: 0,
    forgotten: 0,
    deletedBlobs: 0,
    reclaimedBytes: 0,
    pendingBlobs: 0,
  };
  report.recovered = await recoverDeadCommits(store, transactions, settings.now);

  // Snapshot the blobs first: anything stored after this point is not a candidate.
  const stored: string[] = [];
  for await (const digest of store.listBlobs()) stored.push(digest);

  const live = new Set<string>();
  const nowMs = settings.now().getTime();
  for await (const key of allKeys(store, keys.transactions)) {
    const record = await store.getRecord<TransactionRecord>(key);
    if (!record) {
      // Listed, yet no record: one just forgotten, or a create a machine crash tore on a
      // store whose records can tear (the fs store's record files could, before records.db;
      // a store reads such a record as absent: the transaction was lost whole,
      // depot-publish-durability.md). Its item and marker records can never be used again, nor the name (ids
      // are never reused): both go, where they would otherwise stay for ever.
      await transactions.dropItemRecords(key.slice(keys.transactions.length));
      await store.deleteRecord(key);
      continue;
    }
    let trans = record.value;
    if (trans.state === "committing") {
      // One no slot lists (recovery above walks the slots): a machine crash can lose the
      // lazy `committed` write while a later slot write that dropped it survives (where one
      // directory's fsync does not carry a rename in another). Settle it before judging its
      // expiry: its version may be published, and expiring it would answer 410 for a 201.
      const settled = await recoverCommit(store, transactions, trans.id, settings.now);
      if (!settled) continue;
      if (settled.state !== "committing") report.recovered++;
      trans = settled;
    }
    const active = trans.state === "open" || trans.state === "committing";
    if (active && nowMs >= transactions.expiresAt(trans).getTime()) {
      await transactions.finish(trans.id, "expired");
      report.expired++;
      settings.onExpired?.(trans);
      continue;
    }
    if (!active) {
      const finished = Date.parse(trans.finishedAt ?? trans.touchedAt);
      if (nowMs - finished >= settings.retainMs) {
        await transactions.dropWorkingRecords(trans);
        await store.deleteRecord(key, { ifRevision: record.revision });
        report.forgotten++;
      }
      continue;
    }
    for (const license of Object.values(trans.licenses)) live.add(license.digest);
    for await (const itemKey of allKeys(store, keys.items(trans.id), WHOLE_LISTING)) {
      const item = (await store.getRecord<ItemRecord>(itemKey))?.value;
      if (item?.digest) live.add(item.digest);
    }
  }

  // Archives are assembled from item blobs at read time (depot/package/archive.ts): a version references
  // its manifest, its items and its licences. Only a store that serves by redirect keeps
  // a materialised archive (and delta) blob; elsewhere an old store's archive blobs are
  // garbage, since the assembled bytes are identical. O(versions + items) per run.
  const keepsArchives = store.signBlobUrl !== undefined;
  for await (const key of allKeys(store, keys.versions)) {
    const version = (await store.getRecord<VersionRecord>(key))?.value;
    if (!version) continue;
    if (keepsArchives) live.add(version.digest);
    live.add(version.manifest);
    const manifest = await readVersionManifest<PackageManifest>(store, version);
    for (const item of manifest?.items ?? []) if (item.digest) live.add(item.digest);
    for (const license of manifest?.licenses ?? []) live.add(license.digest);
  }
  // A version's attestations (issue 26): their bundles live while the version's record lists them. O(versions).
  for await (const key of allKeys(store, keys.attestations)) {
    const listed = (await store.getRecord<{ attestations?: Array<{ digest: string }> }>(key))?.value;
    for (const attestation of listed?.attestations ?? []) live.add(attestation.digest);
  }
  // Deltas are no longer stored (issue 30 item 1): an older depot's delta records go, and
  // with them the reference that kept their materialised blobs.
  for await (const key of allKeys(store, keys.deltas)) {
    const delta = await store.getRecord<DeltaRecord>(key);
    if (delta) await store.deleteRecord(key, { ifRevision: delta.revision });
  }

  const previous = (await store.getRecord<{ since: Record<string, number> }>(keys.gcCandidates)) ?? null;
  const since = emptyRecord<number>();
  for (const digest of stored) {
    if (live.has(digest)) continue;
    const first = own(previous?.value.since, digest) ?? nowMs;
    if (nowMs - first >= settings.graceMs) {
      // One stat per deleted blob, for the report's (and depot.gc.reclaimed's) bytes.
      const size = (await store.statBlob(digest))?.size ?? 0;
      await store.deleteBlob(digest);
      report.reclaimedBytes += size;
      await forgetReferences(store, digest);
      report.deletedBlobs++;
    } else {
      setOwn(since, digest, first);
      report.pendingBlobs++;
    }
  }
  await store.putRecord(keys.gcCandidates, { since }, { ifRevision: previous?.revision ?? null });
  return report;
}
