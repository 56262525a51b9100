/**
 * Recovery of commits whose process died (issue 9, depot item 5). A transaction left `committing` with no
 * live attempt (depot/transactions/attempts.ts) is settled at once instead of after the attempt lease: when
 * its version record exists the commit is rolled forward (listed, sequenced exactly once, the transaction
 * `committed`, its slot freed); otherwise it goes back to `open` so the client may add, retry or abandon.
 * Why: docs/decisions/depot-catalog.md, "recovery.ts: recovering commits whose process died".
 */
import { compactAfter } from "../catalog/pages.js";
import { publishVersion } from "../catalog/packages.js";
import type { PackageStore } from "../ports.js";
import {
  allKeys,
  keys,
  updateRecord,
  type CommitResult,
  type TransactionRecord,
  type VersionRecord,
} from "../store/records.js";
import { liveAttempts } from "./attempts.js";
import { totals, withoutAttempts } from "./commit.js";
import type { Transactions } from "./lifecycle.js";

/** Settles one transaction if it is `committing` with no live attempt; returns its record afterwards. */
export async function recoverCommit(
  store: PackageStore,
  transactions: Transactions,
  id: string,
  now: () => Date,
): Promise<TransactionRecord | null> {
  const current = (await store.getRecord<TransactionRecord>(keys.trans(id)))?.value ?? null;
  if (
    !current ||
    current.state !== "committing" ||
    Object.keys(liveAttempts(current.commitAttempts, now().getTime())).length > 0
  )
    return current;
  const version = (await store.getRecord<VersionRecord>(keys.version(current.name, current.version)))?.value;
  const ours = version?.transaction === current.id ? version : undefined;
  if (ours) await compactAfter(store, await publishVersion(store, ours.name, ours.version, now()));
  const items = await transactions.items(current);
  const { value, changed } = await updateRecord<TransactionRecord>(store, keys.trans(id), (stored) => {
    const t = stored?.value;
    // Only while nobody else settled it or started a new attempt meanwhile.
    if (!t || t.state !== "committing" || Object.keys(liveAttempts(t.commitAttempts, now().getTime())).length > 0)
      return undefined;
    if (!ours) return { ...withoutAttempts(t), ...totals(t, items), state: "open" };
    const result: CommitResult = {
      name: ours.name,
      version: ours.version,
      digest: ours.digest,
      location: `/data/${ours.name}@${ours.version}`,
    };
    return { ...withoutAttempts(t), ...totals(t, items), state: "committed", result, finishedAt: now().toISOString() };
  });
  if (changed && value?.state === "committed") await transactions.dropWorkingRecords(value);
  return changed ? value! : ((await store.getRecord<TransactionRecord>(keys.trans(id)))?.value ?? null);
}

/** Settles every dead commit listed in an open-transaction slot; returns how many were rolled forward or reopened. */
export async function recoverDeadCommits(
  store: PackageStore,
  transactions: Transactions,
  now: () => Date,
): Promise<number> {
  let recovered = 0;
  for await (const key of allKeys(store, "slots/")) {
    const ids = (await store.getRecord<{ ids: string[] }>(key))?.value.ids ?? [];
    for (const id of ids) {
      const before = (await store.getRecord<TransactionRecord>(keys.trans(id)))?.value;
      if (before?.state !== "committing") continue;
      const after = await recoverCommit(store, transactions, id, now);
      if (after && after.state !== "committing") recovered++;
    }
  }
  return recovered;
}
