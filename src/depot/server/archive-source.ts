/**
 * The archives and deltas the depot serves, as byte sources assembled from the manifest
 * and item blobs (depot/package/archive.ts), with their layouts cached by manifest so a repeated
 * download or Range costs O(log parts) to position instead of O(items) to lay out. Deltas are
 * never stored: their digests are cached in memory and their builds bounded (docs/depot-api.md §Deltas).
 */
import { RunnerDepotError } from "../../errors.js";
import { readVersionManifestBytes } from "../store/blob-read.js";
import { createHash } from "node:crypto";
import { archiveLayout, readArchive, type ArchiveLayout, type PackageManifest } from "../package/archive.js";
import { archiveStored } from "../package/archive-keeper.js";
import type { ByteSource } from "./blob-response.js";
import { deltaManifest } from "../package/delta.js";
import type { PackageStore } from "../ports.js";
import type { VersionRecord } from "../store/records.js";

/** Settings of {@link createArchiveSources}. */
interface ArchiveSourceSettings {
  /** Lifetime of signed URLs when the store serves by redirect, seconds. */
  signedUrlSeconds: number;
  now: () => Date;
  /**
   * Bytes of layouts kept in the layout cache, as {@link layoutBytes} estimates them (default 64 MiB). By bytes, not
   * parts: a part may hold a whole manifest or a 4 KiB path.
   */
  cachedBytes?: number;
  /** Deltas laid out or hashed at once (default 2); more wait in {@link deltaQueue}. */
  deltaBuilds?: number;
  /** Delta requests waiting for a build slot (default 16); more answer 503 TOO_MANY_DELTA_BUILDS. */
  deltaQueue?: number;
  /** Delta digests kept in memory, least recently used dropped (default 10,000: about 3 MB). */
  cachedDeltaDigests?: number;
}

/** Byte sources for versions and deltas over one store. */
export interface ArchiveSources {
  /** The archive of a published version. */
  version(version: VersionRecord): Promise<ByteSource>;
  /**
   * The delta from `from` to `to`, streamed from the item blobs and never stored. With
   * `digest: false` (a HEAD) nothing is hashed: the source has a digest only if one is cached.
   */
  delta(from: VersionRecord, to: VersionRecord, options?: { digest?: boolean }): Promise<ByteSource>;
}

/** Reads a stored manifest: its exact bytes (the archive's first entry) and its value. */
async function readManifest(
  store: PackageStore,
  version: VersionRecord,
): Promise<{ json: Buffer; manifest: PackageManifest }> {
  const json = await readVersionManifestBytes(store, version);
  if (!json) throw new RunnerDepotError("INTERNAL", `Manifest blob ${version.manifest} is missing`);
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
  const cache = new LayoutCache(settings.cachedBytes ?? 64 * 1024 * 1024);
  // A layout being built, by key: concurrent misses of one archive share one read of its manifests.
  const building = new Map<string, Promise<ArchiveLayout>>();
  // A delta costs its reader, not the store (issue 30 item 1): its digest lives here, in bounded memory.
  const digests = new BoundedMap<string, string>(settings.cachedDeltaDigests ?? 10_000);
  const slots = new BuildSlots(settings.deltaBuilds ?? 2, settings.deltaQueue ?? 16);
  const hashing = new Map<string, Promise<string>>();

  function source(digest: string, layout: ArchiveLayout, filename: string): ByteSource {
    const sign = store.signBlobUrl?.bind(store);
    return {
      digest,
      size: layout.size,
      read: (range, options) => readArchive(store, layout, range, options),
      // Redirected once the archive is stored; until then served from its items (archive-keeper.ts).
      signedUrl: sign
        ? async () =>
            (await archiveStored(store, layout, { digest, size: layout.size }))
              ? sign(digest, { expiresInSeconds: settings.signedUrlSeconds, filename })
              : null
        : undefined,
    };
  }

  /** The cached layout of `key`, else the one being built, else `build()`'s (cached once built). */
  function layoutOf(key: string, build: () => Promise<ArchiveLayout>): Promise<ArchiveLayout> {
    const cached = cache.get(key);
    if (cached) return Promise.resolve(cached);
    return shared(building, key, () => build().then((layout) => cache.put(key, layout)));
  }

  function versionLayout(version: VersionRecord): Promise<ArchiveLayout> {
    return layoutOf(`${version.manifest}@${version.mtime}`, async () => {
      const { json, manifest } = await readManifest(store, version);
      return archiveLayout(manifest, json, version.mtime);
    });
  }

  /** The layout cache's key of a delta (manifests and time decide its bytes). */
  const deltaKey = (from: VersionRecord, to: VersionRecord) => `delta:${from.manifest}:${to.manifest}@${to.mtime}`;

  function deltaLayout(from: VersionRecord, to: VersionRecord): Promise<ArchiveLayout> {
    return layoutOf(deltaKey(from, to), async () => {
      const [a, b] = await Promise.all([readManifest(store, from), readManifest(store, to)]);
      const manifest = deltaManifest(a.manifest, b.manifest);
      return archiveLayout(manifest, Buffer.from(JSON.stringify(manifest), "utf8"), to.mtime);
    });
  }

  /** Hashes a delta's bytes once; concurrent requests for the same delta share the pass. */
  function deltaDigest(key: string, layout: ArchiveLayout): Promise<string> {
    return shared(hashing, key, () =>
      slots.run(async () => {
        // Borrowed chunks: hash.update is done with each before the next is read into its buffer.
        const hash = createHash("sha256");
        for await (const chunk of readArchive(store, layout, undefined, { borrow: true })) hash.update(chunk);
        return digests.set(key, `sha256:${hash.digest("hex")}`);
      }),
    );
  }

  return {
    async version(version) {
      return source(version.digest, await versionLayout(version), `${version.name}-${version.version}.tar`);
    },
    async delta(from, to, options = {}) {
      const key = deltaKey(from, to);
      const layout = cache.get(key) ?? (await slots.run(() => deltaLayout(from, to)));
      const digest = digests.get(key) ?? (options.digest === false ? undefined : await deltaDigest(key, layout));
      // No signed URL: a redirect would need the delta stored as a blob, which a reader must not cause.
      return {
        digest,
        size: layout.size,
        read: (range, readOptions) => readArchive(store, layout, range, readOptions),
      };
    },
  };
}

/** The work under way for `key` in `running`, else `start()`'s, shared until it settles (then forgotten). O(1). */
function shared<T>(running: Map<string, Promise<T>>, key: string, start: () => Promise<T>): Promise<T> {
  let work = running.get(key);
  if (!work) {
    work = start().finally(() => running.delete(key));
    running.set(key, work);
  }
  return work;
}

/** A Map that drops its least recently used entry beyond `max` entries. */
class BoundedMap<K, V> {
  private readonly entries = new Map<K, V>();
  constructor(private readonly max: number) {}

  get(key: K): V | undefined {
    const value = this.entries.get(key);
    if (value !== undefined) {
      this.entries.delete(key);
      this.entries.set(key, value);
    }
    return value;
  }

  set(key: K, value: V): V {
    this.entries.delete(key);
    this.entries.set(key, value);
    if (this.entries.size > this.max) this.entries.delete(this.entries.keys().next().value as K);
    return value;
  }
}

/** At most `max` jobs at once and `queue` waiting; beyond that, 503 TOO_MANY_DELTA_BUILDS at once. */
class BuildSlots {
  private running = 0;
  private readonly waiting: Array<() => void> = [];
  constructor(
    private readonly max: number,
    private readonly queue: number,
  ) {}

  async run<T>(job: () => Promise<T>): Promise<T> {
    if (this.running >= this.max) {
      if (this.waiting.length >= this.queue)
        throw new RunnerDepotError(
          "TOO_MANY_DELTA_BUILDS",
          `${this.max} deltas are being built and ${this.queue} wait; retry shortly`,
          {
            details: { retryAfter: 1 },
          },
        );
      await new Promise<void>((resolve) => this.waiting.push(resolve));
    } else this.running++;
    try {
      return await job();
    } finally {
      // The slot passes straight to the next waiter, so `running` counts it throughout.
      const next = this.waiting.shift();
      if (next) next();
      else this.running--;
    }
  }
}

/** Bytes a part's object is taken to hold, beyond what it points to; a header's fields object as much again. */
const PART_BYTES = 80;

/**
 * The memory a layout holds, estimated: each part's object, a header's fields and path (UTF-16, 2 bytes a code unit),
 * a blob's digest, the manifest's bytes. O(parts).
 *
 * @example
 * layoutBytes(archiveLayout(manifest, json, mtime)); // json.length plus ~200 bytes an item and its path
 */
export function layoutBytes(layout: ArchiveLayout): number {
  let bytes = 0;
  for (const part of layout.parts) {
    bytes += PART_BYTES;
    if (part.kind === "bytes") bytes += part.bytes.length;
    else if (part.kind === "blob") bytes += 2 * part.digest.length;
    else if (part.kind === "header")
      bytes += PART_BYTES + 2 * (part.fields.name.length + (part.fields.linkname?.length ?? 0));
  }
  return bytes;
}

/**
 * A least-recently-used map of layouts bounded by the bytes they hold ({@link layoutBytes}); a layout over the whole
 * bound is served and not kept.
 *
 * @example
 * const cache = new LayoutCache(64 * 1024 * 1024);
 * const layout = cache.get(key) ?? cache.put(key, archiveLayout(manifest, json, mtime));
 */
export class LayoutCache {
  private readonly entries = new Map<string, { layout: ArchiveLayout; bytes: number }>();
  private bytes = 0;
  constructor(private readonly maxBytes: number) {}

  /** Bytes held now. */
  get heldBytes(): number {
    return this.bytes;
  }

  /** The layout of `key` (now the most recently used), or undefined. O(1). */
  get(key: string): ArchiveLayout | undefined {
    const entry = this.entries.get(key);
    if (entry) {
      this.entries.delete(key);
      this.entries.set(key, entry);
    }
    return entry?.layout;
  }

  /** Keeps `layout` under `key`, dropping the least recently used past the bound; returns it. O(parts + dropped). */
  put(key: string, layout: ArchiveLayout): ArchiveLayout {
    if (this.entries.has(key)) return layout;
    const bytes = layoutBytes(layout);
    if (bytes > this.maxBytes) return layout;
    this.entries.set(key, { layout, bytes });
    this.bytes += bytes;
    for (const [oldest, old] of this.entries) {
      if (this.bytes <= this.maxBytes) break;
      this.entries.delete(oldest);
      this.bytes -= old.bytes;
    }
    return layout;
  }
}
