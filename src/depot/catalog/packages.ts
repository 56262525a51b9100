/**
 * Per-package visibility. Each package has one record, `pkg/<name>`, listing its published versions; a
 * version is visible exactly when it is listed there. A commit lists it by compare-and-swap on that record
 * alone, then appends it to the change sequence (depot/catalog/changes.ts), so commits of different packages
 * never touch the same record, and every read of one package costs O(1) in the number of packages held.
 * Why: docs/decisions/depot-catalog.md, "packages.ts: per-package visibility".
 */
import { RunnerDepotError } from "../../errors.js";
import { attemptAlive, endAttempt, startAttempt } from "../transactions/attempts.js";
import { appendChange, findRecentChange } from "./changes.js";
import { newestVersion, sortVersions } from "../package/names.js";
import type { OrderedWrites } from "../transactions/ordered-writes.js";
import type { PackageStore } from "../ports.js";
import { updateRecord } from "../store/records.js";

/** A `pkg/<name>` record: the package's visible versions. */
export interface PackageRecord {
  name: string;
  /** Ascending by semver. */
  versions: string[];
  latest: string;
  /** The version whose commit created the record (its change entry is the package's `first`). */
  firstVersion: string;
  createdAt: string;
  updatedAt: string;
  /** Versions listed but perhaps not yet in the change sequence, with who sequences them. */
  pending?: Record<string, SequencingClaim>;
  /** Yanked versions (depot/catalog/yank.ts): still listed and served by exact request, skipped by `latest`. */
  yanked?: Record<string, YankMark>;
  /**
   * Versions being removed (depot/catalog/removal.ts), already unlisted, with when: their change entry may be missing
   * and their records may remain until the removal is finished.
   */
  removing?: Record<string, string>;
}

/** Why and when a version was yanked; `unsequenced` while its change entry may be missing. */
export interface YankMark {
  reason: string;
  at: string;
  unsequenced?: true;
}

/**
 * The version resolution picks with no range: the newest one not yanked, or the newest when every
 * version is yanked (the record always names one; routes refuse it then). O(versions).
 */
export function latestOf(versions: readonly string[], yanked: Record<string, unknown> | undefined): string {
  const kept = yanked ? versions.filter((v) => !Object.hasOwn(yanked, v)) : versions;
  return newestVersion(kept.length > 0 ? kept : versions)!;
}

/** A claim to append a version to the change sequence. */
interface SequencingClaim {
  /** An attempt id (depot/transactions/attempts.ts): it says whether the claimant still runs. */
  claim: string;
  /** When it was claimed (ms). */
  at: number;
  /** The first claim's time when this one took a dead claim over (the scan for an entry starts there). */
  since?: number;
}

/** Options of {@link publishVersion}. */
interface PublishOptions {
  /**
   * Work to run once the version is listed and has its change entry (or was found so),
   * beside the lazy drop of the sequencing claim: a commit writes its transaction
   * `committed` here. Called at most once; not called when publishing fails before.
   */
  sequenced?: () => Promise<unknown>;
  /**
   * The caller's ordered writes (depot/transactions/ordered-writes.ts): steps 2 and 3 resolve once visible,
   * and this flushes them (with the caller's earlier ones) before step 4 and `sequenced`,
   * so a dropped claim or a `committed` transaction still implies a durable entry.
   */
  writes?: OrderedWrites;
  /**
   * Whether whoever asked for this publish is gone (its client hung up: depot/server/native-body.ts
   * `clientGone`). Checked at each poll of a wait for another attempt's live claim, so
   * such a wait stops at its next poll (within 100 ms) instead of polling on for
   * SEQUENCING_WAIT_MS. Stopping loses nothing: the other attempt still sequences the
   * version, or its claim dies and a later publish takes it over.
   */
  clientGone?: () => boolean;
  /** The waits for live claims the caller allows at once (see {@link ClaimWaits}); unbounded without. */
  waits?: ClaimWaits;
}

/**
 * A bound on how many publishes of one router wait for another attempt's live claim at
 * once. Past `max`, a publish that meets a live claim answers 409 CONFLICT at once
 * ("retry"), as one that waited its 30 s would. O(1).
 * Why: docs/decisions/depot-catalog.md, "packages.ts: ClaimWaits".
 *
 * @example
 * const waits = new ClaimWaits(32);
 * await publishVersion(store, name, version, now, { waits });
 */
export class ClaimWaits {
  /** Waits running now. */
  active = 0;
  constructor(readonly max: number) {}
}

/** The default of {@link ClaimWaits}: 32 waits re-read at most 320 package records per second. */
export const MAX_CLAIM_WAITS = 32;

/** The record key of a package. */
export const packageKey = (name: string) => `pkg/${name}`;

/** A package's record, or null when nothing of it is visible. One read. */
export async function readPackage(store: PackageStore, name: string): Promise<PackageRecord | null> {
  const record = (await store.getRecord<PackageRecord>(packageKey(name)))?.value;
  return record && Array.isArray(record.versions) && record.versions.length > 0 ? record : null;
}

/**
 * Makes a committed version visible and sequenced exactly once (steps 2 to 4 above); safe
 * to call again for the same version, from any process, at any time. O(versions of this
 * package) plus, after a takeover, O(changes since the dead claim). Returns the position
 * this call appended, or null when it appended none (callers compact a shard it completed:
 * depot/catalog/pages.ts). `options.sequenced` runs beside the claim's drop (step 5 beside step 4).
 */
export async function publishVersion(
  store: PackageStore,
  name: string,
  version: string,
  now: Date,
  options: PublishOptions = {},
): Promise<number | null> {
  const claim = startAttempt();
  try {
    const { value, changed, takeoverFrom } = await claimSequencing(store, name, version, now, claim, options);
    if (!changed) {
      // Found listed and sequenced: what the caller wrote before is flushed first.
      await options.writes?.durable();
      await options.sequenced?.();
      return null;
    }
    const record = value!;
    const appended =
      takeoverFrom !== undefined &&
      (await findRecentChange(store, name, version, takeoverFrom - CLOCK_MARGIN_MS)) !== null;
    const position = appended
      ? null
      : await appendChange(
          store,
          { name, version, first: record.firstVersion === version, at: now.toISOString() },
          options.writes,
        );
    // The listing and the entry on stable storage before the claim goes (see PublishOptions.writes).
    await options.writes?.durable();
    // Lazy: a claim a machine crash keeps is a dead claim, taken over as above (the scan
    // finds the entry), so it need not reach the disk before the commit answers. The
    // caller's `sequenced` work runs beside it: neither waits for the other's flush.
    const dropClaim = updateRecord<PackageRecord>(
      store,
      packageKey(name),
      (current) => {
        if (current?.value.pending?.[version]?.claim !== claim) return undefined;
        const pending = { ...current.value.pending };
        delete pending[version];
        const next: PackageRecord = { ...current.value, pending };
        if (Object.keys(pending).length === 0) delete next.pending;
        return next;
      },
      { lazy: true, guess: true },
    );
    await Promise.all([dropClaim, options.sequenced?.()]);
    return position;
  } finally {
    endAttempt(claim);
  }
}

/**
 * Step 2, or the claim taken over from a dead claimant.
 * Why: docs/decisions/depot-catalog.md, "packages.ts: claimSequencing".
 */
async function claimSequencing(
  store: PackageStore,
  name: string,
  version: string,
  now: Date,
  claim: string,
  options: PublishOptions,
) {
  const { writes, waits, clientGone } = options;
  const nowMs = now.getTime();
  const started = Date.now();
  let waiting = false;
  try {
    for (let pause = 5; ; pause = Math.min(pause * 2, 100)) {
      // Liveness is judged on the caller's clock moved on by the time waited.
      const checkedAt = nowMs + (Date.now() - started);
      let takeoverFrom: number | undefined;
      let heldByLive = false;
      const { value, changed } = await updateRecord<PackageRecord>(
        store,
        packageKey(name),
        (current) => {
          takeoverFrom = undefined;
          heldByLive = false;
          const existing = current?.value;
          const mine: SequencingClaim = { claim, at: nowMs };
          if (existing?.versions.includes(version)) {
            const pending = existing.pending?.[version];
            if (!pending) return undefined; // sequenced already
            if (attemptAlive(pending.claim, pending.at, checkedAt)) {
              heldByLive = true;
              return undefined;
            }
            takeoverFrom = pending.since ?? pending.at;
            return { ...existing, pending: { ...existing.pending, [version]: { ...mine, since: takeoverFrom } } };
          }
          const versions = sortVersions([...(existing?.versions ?? []), version]);
          return {
            name,
            versions,
            latest: latestOf(versions, existing?.yanked),
            firstVersion: existing?.firstVersion ?? version,
            createdAt: existing?.createdAt ?? now.toISOString(),
            updatedAt: now.toISOString(),
            pending: { ...existing?.pending, [version]: mine },
            ...(existing?.yanked ? { yanked: existing.yanked } : {}),
            ...(existing?.removing ? { removing: existing.removing } : {}),
          };
        },
        { guess: true, writes },
      );
      if (!heldByLive) return { value, changed, takeoverFrom };
      if (Date.now() - started >= SEQUENCING_WAIT_MS) {
        throw new RunnerDepotError("CONFLICT", `${name}@${version} is being sequenced by another attempt; retry`);
      }
      if (waits && !waiting) {
        if (waits.active >= waits.max)
          throw new RunnerDepotError(
            "CONFLICT",
            `${name}@${version} is being sequenced by another attempt, and this server waits for ${waits.max} such claims already; retry`,
          );
        waits.active++;
        waiting = true;
      }
      await new Promise((resolve) => setTimeout(resolve, pause));
      // Nobody would read the answer: stop re-reading (the claim's holder, or a later retry, sequences it).
      if (clientGone?.())
        throw new RunnerDepotError(
          "CONFLICT",
          `${name}@${version} is being sequenced by another attempt, and the client waiting for it is gone`,
        );
    }
  } finally {
    if (waiting) waits!.active--;
  }
}

/** How long a publish waits for another live attempt's sequencing claim (its append is normally milliseconds away). */
const SEQUENCING_WAIT_MS = 30_000;

/** How far clocks of processes sharing a store may disagree. */
const CLOCK_MARGIN_MS = 5 * 60_000;
