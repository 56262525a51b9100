/**
 * Stored copies of version archives on a store that serves downloads by redirect (S3: a
 * signed URL must point at stored bytes), made after the commit rather than in it. The
 * commit hashes the assembled archive once and answers; the archive is then uploaded in
 * the background with its digest and size declared, so it goes straight to its content
 * address, checked by the store (S3: the signed payload hash). Until it is there, a
 * download is served from the item blobs, as on a store that keeps no archives, and asks
 * for the copy again (a process that died before its copy landed leaves none). An archive
 * the store never signs (`unsignedMaxBytes`: small ones over PostgreSQL records) gets no copy.
 * Why: docs/decisions/depot-blob-uploads.md, "The commit on S3".
 */
import type { BlobInfo, PackageStore } from "../ports.js";
import { readArchive, type ArchiveLayout } from "./archive.js";

/** Archive copies uploading at once per store; more are not started (a later download asks again). */
const MAX_KEEPING = 4;
/** Archives known stored, per store (bounded: the least recently added dropped first). */
const KNOWN_STORED = 10_000;

/** One store's archive copies (see the module comment). */
interface Keeper {
  keeping: Map<string, Promise<boolean>>;
  stored: Set<string>;
}

const keepers = new WeakMap<PackageStore, Keeper>();

function keeperOf(store: PackageStore): Keeper {
  let keeper = keepers.get(store);
  if (!keeper) keepers.set(store, (keeper = { keeping: new Map(), stored: new Set() }));
  return keeper;
}

function remember(keeper: Keeper, digest: string): void {
  keeper.stored.add(digest);
  if (keeper.stored.size > KNOWN_STORED) keeper.stored.delete(keeper.stored.values().next().value!);
}

/**
 * Starts uploading the archive laid out by `layout` (digest and size in `archive`) as a
 * blob, unless it is being uploaded already or MAX_KEEPING are; resolves to whether it is
 * stored. Never rejects: a failed copy leaves the archive to be served from its items.
 * O(1) to start; the copy is O(archive size) of background work.
 *
 * @example
 * void keepArchive(store, layout, { digest, size }); // after the commit hashed it
 */
export function keepArchive(store: PackageStore, layout: ArchiveLayout, archive: BlobInfo): Promise<boolean> {
  // An archive the store would never sign is served from its items: a copy would only cost a write.
  if (archive.size <= (store.unsignedMaxBytes ?? -1)) return Promise.resolve(false);
  const keeper = keeperOf(store);
  const running = keeper.keeping.get(archive.digest);
  if (running) return running;
  if (keeper.keeping.size >= MAX_KEEPING) return Promise.resolve(false);
  const keeping = (async () => {
    try {
      await store.putBlob(readArchive(store, layout), { expectedDigest: archive.digest, size: archive.size });
      remember(keeper, archive.digest);
      return true;
    } catch {
      return false;
    } finally {
      keeper.keeping.delete(archive.digest);
    }
  })();
  keeper.keeping.set(archive.digest, keeping);
  return keeping;
}

/**
 * Whether the archive is stored, for a download about to redirect to it: yes when known,
 * after the copy when one is uploading in this process, else as the store says; when it is
 * not there, starts a copy (for the downloads after this one) and says no. O(1) when known,
 * else one `statBlob`.
 *
 * @example
 * if (await archiveStored(store, layout, { digest, size })) return redirectTo(await store.signBlobUrl!(digest));
 */
export async function archiveStored(store: PackageStore, layout: ArchiveLayout, archive: BlobInfo): Promise<boolean> {
  if (archive.size <= (store.unsignedMaxBytes ?? -1)) return false;
  const keeper = keeperOf(store);
  if (keeper.stored.has(archive.digest)) return true;
  const running = keeper.keeping.get(archive.digest);
  if (running && (await running)) return true;
  if ((await store.statBlob(archive.digest))?.size === archive.size) {
    remember(keeper, archive.digest);
    return true;
  }
  void keepArchive(store, layout, archive);
  return false;
}
