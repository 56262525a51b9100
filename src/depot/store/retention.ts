/**
 * Retention (issue 27 item 3): which published versions a policy removes, and the bytes garbage collection will
 * reclaim for them, listed exactly by a dry run; a real run removes exactly those (depot/catalog/removal.ts: each
 * through the change feed, so mirrors converge). Never removes a package's `latest`, nor a version a kept version's
 * requirement resolves to (transitively).
 *
 * Cost: O(packages + versions) record reads, over pages of `pageSize` package keys (nothing loads every package at
 * once); memory O(distinct requirements of kept versions + versions removed + a few hundred packages' blob sets).
 * The bytes: one manifest read per version removed and per version kept of a package that loses one, one reference
 * listing and one stat per blob a removed version holds.
 * Why: docs/decisions/depot-yank-mirror.md, "retention.ts".
 */
import semver from "semver";
import { RunnerDepotError } from "../../errors.js";
import type { PackageManifest } from "../package/archive.js";
import { satisfyingVersions } from "../install/resolve.js";
import { packageKey, type PackageRecord } from "../catalog/packages.js";
import { finishRemovals, removeVersion } from "../catalog/removal.js";
import type { PackageStore } from "../ports.js";
import { publishedNames } from "../transactions/references.js";
import { readVersionManifest } from "./blob-read.js";
import { usedKey, type UsedRecord } from "./downloads.js";
import { keys, mapLimit, remember, type VersionRecord } from "./records.js";

/** What a retention pass removes; each rule is off when absent. A version goes when any rule that is on says so. */
export interface RetentionPolicy {
  /** Keep the newest N versions of each package (by SemVer); older ones go. At least 1. */
  keepLast?: number;
  /** Prereleases published more than D days ago go. */
  prereleaseDays?: number;
  /** Versions neither downloaded nor published in the last D days go (downloads are noted to the hour). */
  unusedDays?: number;
}

/** Options of {@link runRetention}. */
export interface RetentionOptions {
  /** List what would go, and its bytes, and change nothing. */
  dryRun?: boolean;
  /** The time the policy is judged at (default now). */
  now?: Date;
  /** Package keys read per page (default 1,000). */
  pageSize?: number;
}

/** Why a version goes. */
export type RetentionReason = "keep-last" | "prerelease" | "unused";

/** One version a pass removes (or, in a dry run, would). */
export interface RetainedOut {
  name: string;
  version: string;
  reason: RetentionReason;
  /** Bytes garbage collection reclaims for it: blobs no version left holds, each counted once in the whole pass. */
  bytes: number;
}

/** What a pass did. */
export interface RetentionReport {
  dryRun: boolean;
  /** Packages read. */
  packages: number;
  /** Versions read. */
  versions: number;
  /** The versions removed (dry run: that would be), by name then version. */
  removed: RetainedOut[];
  /** The sum of their `bytes`. */
  bytes: number;
  /** Versions a rule would remove, kept since a kept version requires them. */
  required: number;
  /** Removals an earlier pass left unfinished, finished by this one (not in a dry run). */
  finished: number;
}

/** A package with versions a rule removes: what the requirement pass and the byte count need. */
interface Planned {
  record: PackageRecord;
  out: Map<string, { version: VersionRecord; reason: RetentionReason }>;
}

const DAY_MS = 86_400_000;
/** Packages whose remaining blob sets are held while counting bytes. */
const HELD_PACKAGES = 256;

/**
 * One retention pass over every package of `store`.
 *
 * @example
 * const plan = await runRetention(store, { keepLast: 5, prereleaseDays: 30 }, { dryRun: true });
 * console.log(plan.removed.length, "versions,", plan.bytes, "bytes");
 */
export async function runRetention(
  store: PackageStore,
  policy: RetentionPolicy,
  options: RetentionOptions = {},
): Promise<RetentionReport> {
  checkPolicy(policy);
  const now = options.now ?? new Date();
  const dryRun = options.dryRun === true;
  const report: RetentionReport = { dryRun, packages: 0, versions: 0, removed: [], bytes: 0, required: 0, finished: 0 };
  /** Ranges kept versions require, by package name (deduplicated). */
  const requiredRanges = new Map<string, Set<string>>();
  const planned = new Map<string, Planned>();
  const pageSize = options.pageSize ?? 1000;
  let cursor: string | undefined;
  do {
    const page = await store.listRecords("pkg/", { cursor, limit: pageSize });
    cursor = page.cursor;
    await mapLimit(page.keys, 16, async (key) => {
      const record = (await store.getRecord<PackageRecord>(key))?.value;
      if (!record) return;
      if (record.removing && !dryRun) {
        await finishRemovals(store, record, now);
        report.finished += Object.keys(record.removing).length;
      }
      if (record.versions.length === 0) return;
      report.packages++;
      report.versions += record.versions.length;
      await judgePackage(store, record, policy, now, requiredRanges, planned);
    });
  } while (cursor !== undefined);
  report.required = keepRequired(planned, requiredRanges);
  const out = [...planned.values()]
    .flatMap((p) => [...p.out.entries()].map(([version, o]) => ({ name: p.record.name, version, reason: o.reason })))
    .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : semver.compare(a.version, b.version)));
  const bytes = await freedBytes(store, planned, out);
  report.removed = out.map((o, i) => ({ name: o.name, version: o.version, reason: o.reason, bytes: bytes[i]! }));
  report.bytes = bytes.reduce((sum, b) => sum + b, 0);
  if (!dryRun) {
    for (const o of report.removed) {
      const outcome = await removeVersion(store, o.name, o.version, now);
      if (outcome !== "removed" && outcome !== "absent")
        throw new RunnerDepotError(
          "CONFLICT",
          `${o.name}@${o.version} changed during retention (${outcome}); run again`,
        );
    }
  }
  return report;
}

/** BAD_REQUEST for a rule out of range; at least one rule must be on. */
function checkPolicy(policy: RetentionPolicy): void {
  const { keepLast, prereleaseDays, unusedDays } = policy;
  if (keepLast !== undefined && (!Number.isSafeInteger(keepLast) || keepLast < 1))
    throw new RunnerDepotError("BAD_REQUEST", "keepLast must be a whole number of at least 1");
  for (const [name, days] of [
    ["prereleaseDays", prereleaseDays],
    ["unusedDays", unusedDays],
  ] as const)
    if (days !== undefined && (!Number.isFinite(days) || days < 0 || days > 100_000))
      throw new RunnerDepotError("BAD_REQUEST", `${name} must be a number of days from 0 to 100000`);
  if (keepLast === undefined && prereleaseDays === undefined && unusedDays === undefined)
    throw new RunnerDepotError("BAD_REQUEST", "a retention policy needs keepLast, prereleaseDays or unusedDays");
}

/**
 * One package: its versions' records read, the rules applied (never to `latest`, nor to a version whose own entry
 * may still be missing), the kept versions' requirements noted. O(versions) reads.
 */
async function judgePackage(
  store: PackageStore,
  record: PackageRecord,
  policy: RetentionPolicy,
  now: Date,
  requiredRanges: Map<string, Set<string>>,
  planned: Map<string, Planned>,
): Promise<void> {
  const [used, versions] = await Promise.all([
    policy.unusedDays !== undefined ? store.getRecord<UsedRecord>(usedKey(record.name)) : Promise.resolve(null),
    mapLimit(
      record.versions,
      8,
      async (v) => (await store.getRecord<VersionRecord>(keys.version(record.name, v)))?.value,
    ),
  ]);
  const newestFirst = semver.rsort([...record.versions]);
  const rank = new Map(newestFirst.map((v, i) => [v, i]));
  const out = new Map<string, { version: VersionRecord; reason: RetentionReason }>();
  record.versions.forEach((v, i) => {
    const version = versions[i];
    if (!version) return;
    const reason =
      v === record.latest || Object.hasOwn(record.pending ?? {}, v)
        ? undefined
        : ruleFor(v, version, rank.get(v)!, policy, used?.value.versions, now);
    if (reason) out.set(v, { version, reason });
    else
      for (const r of version.requires) {
        let ranges = requiredRanges.get(r.name);
        if (!ranges) requiredRanges.set(r.name, (ranges = new Set()));
        ranges.add(r.range);
      }
  });
  if (out.size > 0) planned.set(record.name, { record, out });
}

/** The first rule that removes `v`, or undefined. */
function ruleFor(
  v: string,
  version: VersionRecord,
  rank: number,
  policy: RetentionPolicy,
  used: Record<string, number> | undefined,
  now: Date,
): RetentionReason | undefined {
  const published = Date.parse(version.publishedAt);
  const age = now.getTime() - published;
  if (policy.keepLast !== undefined && rank >= policy.keepLast) return "keep-last";
  if (policy.prereleaseDays !== undefined && semver.prerelease(v) !== null && age > policy.prereleaseDays * DAY_MS)
    return "prerelease";
  if (policy.unusedDays !== undefined) {
    // A download noted at an hour's start counts until that hour's end.
    const hour = used && Object.hasOwn(used, v) ? used[v]! + 3600_000 : 0;
    if (now.getTime() - Math.max(published, hour) > policy.unusedDays * DAY_MS) return "unused";
  }
  return undefined;
}

/**
 * Puts back every version a kept version's requirement resolves to (the installer's pick: the newest satisfying
 * version not yanked, else the newest satisfying), and theirs in turn. O(requirements on packages that lose versions).
 * Answers how many were put back.
 */
function keepRequired(planned: Map<string, Planned>, requiredRanges: Map<string, Set<string>>): number {
  let kept = 0;
  const work = [...planned.keys()];
  while (work.length > 0) {
    const name = work.pop()!;
    const plan = planned.get(name);
    const ranges = requiredRanges.get(name);
    if (!plan || !ranges) continue;
    const all = plan.record.versions;
    const usable = all.filter((v) => !Object.hasOwn(plan.record.yanked ?? {}, v));
    for (const range of ranges) {
      const target = satisfyingVersions(usable, [range])[0] ?? satisfyingVersions(all, [range])[0];
      const rescued = target === undefined ? undefined : plan.out.get(target);
      if (!rescued) continue;
      plan.out.delete(target!);
      kept++;
      for (const r of rescued.version.requires) {
        let more = requiredRanges.get(r.name);
        if (!more) requiredRanges.set(r.name, (more = new Set()));
        if (more.has(r.range)) continue;
        more.add(r.range);
        work.push(r.name);
      }
    }
    if (plan.out.size === 0) planned.delete(name);
  }
  return kept;
}

/**
 * The bytes garbage collection reclaims for each of `out` once they are removed: each blob one of them holds (its
 * manifest, its items and licences, its attestation bundles, its archive where the store keeps archives) that no
 * version left holds, counted once, at the size the store reports. A blob some other package may hold is checked
 * against that package's remaining versions.
 */
async function freedBytes(
  store: PackageStore,
  planned: Map<string, Planned>,
  out: ReadonlyArray<{ name: string; version: string }>,
): Promise<number[]> {
  const counted = new Set<string>();
  const held = new Map<string, Set<string>>();
  /** The item and licence blobs the remaining versions of `name` hold. */
  const remaining = async (name: string): Promise<Set<string>> => {
    const hit = held.get(name);
    if (hit) return hit;
    const digests = new Set<string>();
    const record = (await store.getRecord<PackageRecord>(packageKey(name)))?.value;
    const going = planned.get(name)?.out;
    const left = (record?.versions ?? []).filter((v) => !going?.has(v));
    await mapLimit(left, 8, async (v) => {
      const version = (await store.getRecord<VersionRecord>(keys.version(name, v)))?.value;
      if (version) for (const d of await blobsOf(store, version)) digests.add(d);
    });
    remember(held, name, digests, HELD_PACKAGES);
    return digests;
  };
  const sizes: number[] = [];
  for (const o of out) {
    const version = planned.get(o.name)!.out.get(o.version)!.version;
    const own = [version.manifest, ...(store.signBlobUrl ? [version.digest] : [])];
    const attested = await store.getRecord<{ attestations?: Array<{ digest: string }> }>(
      keys.attestation(o.name, o.version),
    );
    for (const a of attested?.value.attestations ?? []) own.push(a.digest);
    let bytes = 0;
    const candidates = [...own, ...(await blobsOf(store, version))];
    for (const digest of candidates) {
      if (counted.has(digest)) continue;
      if (!own.includes(digest) && (await stillHeld(store, digest, o.name, remaining))) continue;
      counted.add(digest);
      bytes += (await store.statBlob(digest))?.size ?? 0;
    }
    sizes.push(bytes);
  }
  return sizes;
}

/** Whether a version left (of `name`, or of a package the reference notes name) holds `digest`. */
async function stillHeld(
  store: PackageStore,
  digest: string,
  name: string,
  remaining: (name: string) => Promise<Set<string>>,
): Promise<boolean> {
  if ((await remaining(name)).has(digest)) return true;
  for await (const other of publishedNames(store, digest))
    if (other !== name && (await remaining(other)).has(digest)) return true;
  return false;
}

/** A version's item and licence blobs, from its manifest (one read). */
async function blobsOf(store: PackageStore, version: VersionRecord): Promise<string[]> {
  const manifest = await readVersionManifest<PackageManifest>(store, version);
  return [
    ...(manifest?.items ?? []).flatMap((i) => (i.digest ? [i.digest] : [])),
    ...(manifest?.licenses ?? []).map((l) => l.digest),
  ];
}
