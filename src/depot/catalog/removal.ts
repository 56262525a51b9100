/**
 * Removing a published version (retention, depot/store/retention.ts, and a mirror applying an upstream's removal):
 * the version leaves its package's listing, one `removed` entry of the change sequence says so (so mirrors converge
 * and catalog pages drop it), and its version and attestation records go, so garbage collection then reclaims the
 * blobs no other version holds. Every step is idempotent, so a run killed anywhere is finished by the next one.
 * Why: docs/decisions/depot-yank-mirror.md, "removal.ts".
 */
import { appendChange } from "./changes.js";
import { latestOf, packageKey, type PackageRecord } from "./packages.js";
import { compactAfter } from "./pages.js";
import type { PackageStore } from "../ports.js";
import { keys, updateRecord, type VersionRecord } from "../store/records.js";
import { releaseUsage } from "../store/quota.js";
import { usedKey } from "../store/downloads.js";

/** A package record (its `removing` marks: removals still to finish). */
type RemovingRecord = PackageRecord;

/** What {@link removeVersion} did. */
export type RemovalOutcome = "removed" | "absent" | "latest" | "pending";

/**
 * Removes `name@version`. O(versions of the package) plus one append and three deletes.
 *
 * Refused (answers without changing anything) for the package's `latest`, which retention never removes ("latest":
 * so a package never loses its resolution target, nor its last version), and for a version whose own change entry
 * may still be missing ("pending"). "absent": not listed (removed already, or never held).
 *
 * Order: the listing first, with a `removing` mark; then the entry; then the records; then the mark dropped. A run
 * killed in between leaves the mark, and {@link finishRemovals} (every retention pass calls it on every package it
 * reads) appends the entry again (a reader applies a removal twice to the same effect) and deletes what remains.
 *
 * @example
 * await removeVersion(store, "libgreet", "0.9.0", new Date());
 */
export async function removeVersion(
  store: PackageStore,
  name: string,
  version: string,
  now: Date,
): Promise<RemovalOutcome> {
  let outcome: RemovalOutcome = "removed";
  const { value } = await updateRecord<RemovingRecord>(store, packageKey(name), (current) => {
    const record = current?.value;
    if (!record || !record.versions.includes(version)) return ((outcome = "absent"), undefined);
    if (record.latest === version || record.versions.length === 1) return ((outcome = "latest"), undefined);
    if (record.pending && Object.hasOwn(record.pending, version)) return ((outcome = "pending"), undefined);
    outcome = "removed";
    const versions = record.versions.filter((v) => v !== version);
    const yanked = { ...record.yanked };
    delete yanked[version];
    const next: RemovingRecord = {
      ...record,
      versions,
      latest: latestOf(versions, yanked),
      updatedAt: now.toISOString(),
      removing: { ...record.removing, [version]: now.toISOString() },
    };
    if (Object.keys(yanked).length > 0) next.yanked = yanked;
    else delete next.yanked;
    return next;
  });
  if (outcome !== "removed") return outcome;
  await finishRemovals(store, value!, now);
  return "removed";
}

/**
 * Finishes every removal `record` marks: the `removed` entry appended, the version's records deleted, the mark
 * dropped. O(marks) appends; nothing when there are none.
 */
export async function finishRemovals(store: PackageStore, record: RemovingRecord, now: Date): Promise<void> {
  for (const version of Object.keys(record.removing ?? {})) {
    const name = record.name;
    const position = await appendChange(store, { name, version, first: false, at: now.toISOString(), removed: true });
    const versionRecord = await store.getRecord<VersionRecord>(keys.version(name, version));
    if (versionRecord) {
      // The publisher's quota gets the room back (depot/store/quota.ts), before the record that says whose it was goes.
      await releaseUsage(store, versionRecord.value);
      await store.deleteRecord(keys.version(name, version), { ifRevision: versionRecord.revision });
    }
    await store.deleteRecord(keys.attestation(name, version));
    await updateRecord<{ versions: Record<string, number> }>(store, usedKey(name), (current) => {
      if (!current || !Object.hasOwn(current.value.versions, version)) return undefined;
      const versions = { ...current.value.versions };
      delete versions[version];
      return { versions };
    });
    await updateRecord<RemovingRecord>(store, packageKey(name), (current) => {
      if (!current?.value.removing || !Object.hasOwn(current.value.removing, version)) return undefined;
      const next: RemovingRecord = { ...current.value, removing: { ...current.value.removing } };
      delete next.removing![version];
      if (Object.keys(next.removing!).length === 0) delete next.removing;
      return next;
    });
    await compactAfter(store, position);
  }
}
