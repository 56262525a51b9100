/**
 * Quotas per principal (a token's scope: bearerTokens names each token's principal), in archive bytes and in
 * versions published. A commit reserves its version's room by compare-and-swap before the version record is
 * written, and gives it back when it fails before that; a removal (retention) gives it back too. So a commit over
 * quota stops before anything is written, and two racing commits can never both take the last room.
 * Why: docs/decisions/depot-yank-mirror.md, "quota.ts".
 */
import { createHash } from "node:crypto";
import { RunnerDepotError } from "../../errors.js";
import type { PackageStore } from "../ports.js";
import { updateRecord, type VersionRecord } from "./records.js";

/** One principal's quota; an absent bound is no bound. */
export interface Quota {
  /** The most archive bytes (each version's `size`, as listed) its published versions may hold. */
  bytes?: number;
  /** The most versions it may hold published. */
  versions?: number;
}

/** The router's `quota` option: a principal's quota, or undefined for none. Called once per commit. */
export type QuotaOf = (principal: string) => Quota | undefined;

/** A `quota/<hash>` record: what a principal's published versions hold now. */
export interface UsageRecord {
  principal: string;
  bytes: number;
  versions: number;
}

/** The record key of a principal's usage. */
export const usageKey = (principal: string) =>
  `quota/${createHash("sha256").update(`principal:${principal}`).digest("hex").slice(0, 32)}`;

/**
 * Takes room for one version of `bytes` from `principal`'s usage, or throws QUOTA_EXCEEDED (413) with what is used,
 * asked and allowed in `details`, changing nothing. O(1): one read and one compare-and-swap.
 */
export async function reserveUsage(store: PackageStore, principal: string, quota: Quota, bytes: number): Promise<void> {
  await updateRecord<UsageRecord>(store, usageKey(principal), (current) => {
    const used = current?.value ?? { principal, bytes: 0, versions: 0 };
    const overBytes = quota.bytes !== undefined && used.bytes + bytes > quota.bytes;
    const overVersions = quota.versions !== undefined && used.versions + 1 > quota.versions;
    if (overBytes || overVersions)
      throw new RunnerDepotError(
        "QUOTA_EXCEEDED",
        overBytes
          ? `This version's ${bytes} bytes would take this token's published bytes to ${used.bytes + bytes}; its quota is ${quota.bytes}`
          : `This token holds ${used.versions} published versions; its quota is ${quota.versions}`,
        {
          details: {
            usedBytes: used.bytes,
            usedVersions: used.versions,
            versionBytes: bytes,
            ...(quota.bytes !== undefined ? { quotaBytes: quota.bytes } : {}),
            ...(quota.versions !== undefined ? { quotaVersions: quota.versions } : {}),
          },
        },
      );
    return { principal, bytes: used.bytes + bytes, versions: used.versions + 1 };
  });
}

/** Gives back the room of one version of `bytes` (a failed commit's reservation, a removed version). O(1). */
export async function giveBack(store: PackageStore, principal: string, bytes: number): Promise<void> {
  await updateRecord<UsageRecord>(store, usageKey(principal), (current) =>
    current
      ? {
          principal,
          bytes: Math.max(0, current.value.bytes - bytes),
          versions: Math.max(0, current.value.versions - 1),
        }
      : undefined,
  );
}

/** A removed version's room given back to the principal that published it (versions recorded without one: none). */
export async function releaseUsage(store: PackageStore, version: VersionRecord): Promise<void> {
  if (version.principal !== undefined) await giveBack(store, version.principal, version.size);
}

/** A principal's usage now (zeros when it never published under a quota). One read. */
export async function readUsage(store: PackageStore, principal: string): Promise<UsageRecord> {
  return (await store.getRecord<UsageRecord>(usageKey(principal)))?.value ?? { principal, bytes: 0, versions: 0 };
}
