/**
 * Yanking: a packager marks a published version yanked, with a reason (or takes the mark back). The
 * version stays listed and an exact request still gets it; `latest` and resolution skip it. Each
 * change of the mark is one entry of the change sequence, so `GET /catalog?since=` (and mirrors) carry it.
 * Why: docs/decisions/depot-yank-mirror.md, "yank.ts".
 */
import { RunnerDepotError } from "../../errors.js";
import { appendChange } from "./changes.js";
import { latestOf, packageKey, type PackageRecord, type YankMark } from "./packages.js";
import { compactAfter } from "./pages.js";
import type { PackageStore } from "../ports.js";
import { updateRecord } from "../store/records.js";

/** The longest yank reason, in characters. */
export const YANK_REASON_MAX = 1024;

/** A yank reason: 1 to 1,024 characters, no control characters; BAD_REQUEST otherwise. */
export function parseYankReason(reason: string): string {
  const text = reason.trim();
  if (text.length === 0 || text.length > YANK_REASON_MAX || /\p{Cc}/u.test(text))
    throw new RunnerDepotError(
      "BAD_REQUEST",
      `A yank reason is 1 to ${YANK_REASON_MAX} characters without control characters`,
    );
  return text;
}

/** What {@link setYank} did. */
export interface YankOutcome {
  name: string;
  version: string;
  /** The reason now in force, or null when the version is not yanked. */
  yanked: string | null;
  /** The change-sequence position this call appended, or null when the mark was already so. */
  position: number | null;
}

/**
 * Yanks `name@version` with `reason`, or un-yanks it with null. O(versions of the package) plus one append.
 *
 * The mark is written first with `unsequenced`, then the entry is appended, then the flag dropped: a
 * call killed in between leaves the flag, and the next call with the same reason appends the entry it
 * missed (a kill after the append but before the drop appends it twice, which a reader applies twice
 * to the same effect). An un-yank of a version that is not yanked appends nothing.
 *
 * `options.at` is the time the mark records (default `now`).
 *
 * @example
 * await setYank(store, "libgreet", "2.1.0", "breaks TLS on arm64", new Date());
 */
export async function setYank(
  store: PackageStore,
  name: string,
  version: string,
  reason: string | null,
  now: Date,
  options: { at?: string } = {},
): Promise<YankOutcome> {
  // A mirror passes the upstream's time of the yank; the entry is still appended now.
  const at = options.at ?? now.toISOString();
  let missing = false;
  let settled = false;
  await updateRecord<PackageRecord>(store, packageKey(name), (current) => {
    missing = false;
    settled = false;
    const record = current?.value;
    if (!record || !record.versions.includes(version)) {
      missing = true;
      return undefined;
    }
    const mark = record.yanked && Object.hasOwn(record.yanked, version) ? record.yanked[version] : undefined;
    if (reason === null ? mark === undefined : mark?.reason === reason && !mark.unsequenced) {
      settled = true;
      return undefined;
    }
    const yanked: Record<string, YankMark> = { ...record.yanked };
    if (reason === null) delete yanked[version];
    // A repeated yank keeps the first time; its entry is the one that may be missing.
    else yanked[version] = { reason, at: mark?.reason === reason ? mark.at : at, unsequenced: true };
    const next: PackageRecord = { ...record, yanked, latest: latestOf(record.versions, yanked), updatedAt: at };
    if (Object.keys(yanked).length === 0) delete next.yanked;
    return next;
  });
  if (missing) throw new RunnerDepotError("VERSION_NOT_FOUND", `No version ${version} of ${name}`);
  if (settled) return { name, version, yanked: reason, position: null };
  const position = await appendChange(store, { name, version, first: false, at: now.toISOString(), yanked: reason });
  if (reason !== null)
    await updateRecord<PackageRecord>(store, packageKey(name), (current) => {
      const mark = current?.value.yanked?.[version];
      if (!mark?.unsequenced || mark.reason !== reason) return undefined;
      return { ...current!.value, yanked: { ...current!.value.yanked, [version]: { reason, at: mark.at } } };
    });
  await compactAfter(store, position);
  return { name, version, yanked: reason, position };
}

/** The yank reason of `version` in a package record, or undefined when it is not yanked. */
export function yankReason(record: PackageRecord, version: string): string | undefined {
  return record.yanked && Object.hasOwn(record.yanked, version) ? record.yanked[version]!.reason : undefined;
}
