/**
 * The archives and deltas the depot serves, as byte sources assembled from the manifest
 * and item blobs (depot/package/archive.ts), with their layouts cached by manifest so a repeated
 * download or Range costs O(log parts) to position instead of O(items) to lay out.
 */
import { RunnerDepotError } from "../../errors.js";
import {
  archiveLayout,
  commitArchive,
  readArchive,
  type ArchiveLayout,
  type PackageManifest,
} from "../package/archive.js";
import type { ByteSource } from "./blob-response.js";
import { deltaManifest } from "../package/delta.js";
import type { PackageStore } from "../ports.js";
import { keys, type DeltaRecord, type VersionRecord } from "../store/records.js";

/** Settings of {@link createArchiveSources}. */
interface ArchiveSourceSettings {
  /** Lifetime of signed URLs when the store serves by redirect, seconds. */
  signedUrlSeconds: number;
  now: () => Date;
  /** Parts (about three per item) kept in the layout cache (default 1,000,000: some tens of MiB). */
  cachedParts?: number;
}

/** Byte sources for versions and deltas over one store. */
export interface ArchiveSources {
  /** The archive of a published version. */
  version(version: VersionRecord): Promise<ByteSource>;
  /** The delta from `from` to `to`, its digest computed (once, kept in a record) on first request. */
  delta(from: VersionRecord, to: VersionRecord): Promise<ByteSource>;
}

/** Reads a stored manifest: its exact bytes (the archive's first entry) and its value. */
async function readManifest(store: PackageStore, digest: string): Promise<{ json: Buffer; manifest: PackageManifest }> {
  const body = await store.getBlob(digest);
  if (!body) throw new RunnerDepotError("INTERNAL", `Manifest blob ${digest} is missing`);
  const chunks: Buffer[] = [];
  for await (const chunk of body) chunks.push(Buffer.from(chunk));
  const json = Buffer.concat(chunks);
  return { json, manifest: JSON.parse(json.toString("utf8")) as PackageManifest };
}

/**
 * Creates the byte sources of one router.
 *
 * @example
 * const sources = createArchiveSources(store, { signedUrlSeconds: 300, now: () => new Date() });
 * const source = await sources.version(versionRecord); // source.read({ start: 0, end: 511 })
 */
export function createArchiveSources(store: PackageStore, settings: ArchiveSourceSettings): ArchiveSources {
  const cache = new LayoutCache(settings.cachedParts ?? 1_000_000);
  const deltaBuilds = new Map<string, Promise<DeltaRecord>>();

  function source(digest: string, layout: ArchiveLayout, filename: string): ByteSource {
    const sign = store.signBlobUrl?.bind(store);
    return {
      digest,
      size: layout.size,
      read: (range, options) => readArchive(store, layout, range, options),
      signedUrl: sign ? () => sign(digest, { expiresInSeconds: settings.signedUrlSeconds, filename }) : undefined,
    };
  }

  async function versionLayout(version: VersionRecord): Promise<ArchiveLayout> {
    const key = `${version.manifest}@${version.mtime}`;
    const cached = cache.get(key);
    if (cached) return cached;
    const { json, manifest } = await readManifest(store, version.manifest);
    return cache.put(key, archiveLayout(manifest, json, version.mtime));
  }

  async function deltaLayout(
    from: VersionRecord,
    to: VersionRecord,
  ): Promise<{ layout: ArchiveLayout; manifest: PackageManifest; json: Buffer }> {
    const [a, b] = await Promise.all([readManifest(store, from.manifest), readManifest(store, to.manifest)]);
    const manifest = deltaManifest(a.manifest, b.manifest);
    const json = Buffer.from(JSON.stringify(manifest), "utf8");
    return { layout: archiveLayout(manifest, json, to.mtime), manifest, json };
  }

  /** The layout cache's key of a delta (manifests and time decide its bytes). */
  const deltaKey = (from: VersionRecord, to: VersionRecord) => `delta:${from.manifest}:${to.manifest}@${to.mtime}`;

  /** Computes (and for a redirecting store, materialises) a delta once; concurrent requests share it. */
  async function deltaRecord(from: VersionRecord, to: VersionRecord): Promise<DeltaRecord> {
    const key = keys.delta(from.name, from.version, to.version);
    const stored = (await store.getRecord<DeltaRecord>(key))?.value;
    if (stored) return stored;
    let building = deltaBuilds.get(key);
    if (!building) {
      building = (async () => {
        const { layout, manifest, json } = await deltaLayout(from, to);
        // The download that asked for it lays it out next: keep this layout for it.
        cache.put(deltaKey(from, to), layout);
        const info = await commitArchive(store, manifest, to.mtime, json);
        const record: DeltaRecord = { digest: info.digest, size: info.size, builtAt: settings.now().toISOString() };
        // Deterministic bytes: a concurrent builder elsewhere found the same digest; keep theirs.
        if ((await store.putRecord(key, record, { ifRevision: null })) === null)
          return (await store.getRecord<DeltaRecord>(key))?.value ?? record;
        return record;
      })().finally(() => deltaBuilds.delete(key));
      deltaBuilds.set(key, building);
    }
    return building;
  }

  return {
    async version(version) {
      return source(version.digest, await versionLayout(version), `${version.name}-${version.version}.tar`);
    },
    async delta(from, to) {
      const record = await deltaRecord(from, to);
      const key = deltaKey(from, to);
      const layout = cache.get(key) ?? cache.put(key, (await deltaLayout(from, to)).layout);
      if (layout.size !== record.size)
        throw new RunnerDepotError(
          "INTERNAL",
          `Delta ${from.name} ${from.version}→${to.version} lays out to ${layout.size} bytes, its record says ${record.size}`,
        );
      return source(record.digest, layout, `${from.name}-${from.version}-to-${to.version}.tar`);
    },
  };
}

/** A least-recently-used map of layouts bounded by their total parts. */
class LayoutCache {
  private readonly entries = new Map<string, ArchiveLayout>();
  private parts = 0;
  constructor(private readonly maxParts: number) {}

  get(key: string): ArchiveLayout | undefined {
    const layout = this.entries.get(key);
    if (layout) {
      this.entries.delete(key);
      this.entries.set(key, layout);
    }
    return layout;
  }

  put(key: string, layout: ArchiveLayout): ArchiveLayout {
    if (layout.parts.length > this.maxParts || this.entries.has(key)) return layout;
    this.entries.set(key, layout);
    this.parts += layout.parts.length;
    for (const [oldest, old] of this.entries) {
      if (this.parts <= this.maxParts) break;
      this.entries.delete(oldest);
      this.parts -= old.parts.length;
    }
    return layout;
  }
}
