/**
 * When each version was last downloaded, to the hour: what retention's "not downloaded for D days" reads. Recorded
 * off the hot path: a download only looks up a bounded in-memory map, and at most once per version per hour per
 * process a write is started (never awaited by the download), so a reader can make the server write at most one
 * small record update per published version per hour, and never store anything for a version that is not published.
 * Why: docs/decisions/depot-yank-mirror.md, "downloads.ts".
 */
import type { PackageStore } from "../ports.js";
import { remember, updateRecord } from "./records.js";

/** A `used/<name>` record: per version, the start (ms) of the last hour it was downloaded in. */
export interface UsedRecord {
  versions: Record<string, number>;
}

/** The record key of a package's download hours. */
export const usedKey = (name: string) => `used/${name}`;
/** The prefix of every `used/` record. */
export const USED_PREFIX = "used/";

const HOUR_MS = 3600_000;
/** Versions whose last noted hour this process holds (about 100 bytes each). */
const NOTED = 100_000;
/** Writes in flight at once; a download past it notes nothing (the next one in the hour tries again). */
const IN_FLIGHT = 16;

/**
 * Notes downloads per store. O(1) per download: one map lookup; a write (one read and one compare-and-swap of the
 * package's `used/` record, lazy) at most once per version per hour.
 *
 * @example
 * const clock = new DownloadClock(store, () => new Date());
 * clock.note("libgreet", "2.1.0"); // after the version was found published
 */
export class DownloadClock {
  private readonly noted = new Map<string, number>();
  private inFlight = 0;
  private readonly writes = new Set<Promise<unknown>>();

  constructor(
    private readonly store: PackageStore,
    private readonly now: () => Date,
  ) {}

  /** Notes a download of a published `name@version`. Never throws, never waits. */
  note(name: string, version: string): void {
    const hour = Math.floor(this.now().getTime() / HOUR_MS) * HOUR_MS;
    const key = `${name}@${version}`;
    if ((this.noted.get(key) ?? -1) >= hour || this.inFlight >= IN_FLIGHT) return;
    remember(this.noted, key, hour, NOTED);
    this.inFlight++;
    const write = recordDownload(this.store, name, version, hour)
      .catch(() => this.noted.delete(key)) // tried again at the next download
      .finally(() => {
        this.inFlight--;
        this.writes.delete(write);
      });
    this.writes.add(write);
  }

  /** Resolves once the writes started so far are done (tests, and a host closing its store). */
  async idle(): Promise<void> {
    while (this.writes.size > 0) await Promise.all([...this.writes]);
  }
}

/** Raises `name@version`'s download hour to `hour` (a no-op when it is there already). Lazy: a lost hour is a stale one. */
export async function recordDownload(store: PackageStore, name: string, version: string, hour: number): Promise<void> {
  await updateRecord<UsedRecord>(
    store,
    usedKey(name),
    (current) => {
      const versions = current?.value.versions ?? {};
      if ((Object.hasOwn(versions, version) ? versions[version]! : -1) >= hour) return undefined;
      return { versions: { ...versions, [version]: hour } };
    },
    { lazy: true },
  );
}
