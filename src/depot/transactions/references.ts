/**
 * Who may add content by reference (an empty body with a `Content-Digest`): only a principal that could read
 * those bytes already — it uploaded them itself, or they are in a published package it may read. Anyone else
 * gets the answer unknown content gets (409 DIGEST_UNKNOWN, same body), so a reference reveals nothing about
 * what the depot holds and never copies another publisher's private bytes.
 * Why: docs/decisions/depot-server.md, "references.ts: who may add content by reference".
 */
import { createHash } from "node:crypto";
import type { PackageStore } from "../ports.js";
import { allKeys, mapLimit } from "../store/records.js";

/** Names checked per reference at most: the packages holding one digest, first in key order. */
const MAX_REFERENCE_NAMES = 64;

const principalHash = (principal: string) =>
  createHash("sha256").update(`principal:${principal}`).digest("hex").slice(0, 32);

/** Record keys of the reference index. */
const referenceKeys = {
  digest: (digest: string) => `bref/${digest}/`,
  uploader: (digest: string, principal: string) => `bref/${digest}/u.${principalHash(principal)}`,
  published: (digest: string, name: string) => `bref/${digest}/p.${name}`,
  publishedPrefix: (digest: string) => `bref/${digest}/p.`,
};

/** The same notes in the earlier layout (a directory level each): read, never written. */
const olderKeys = {
  uploader: (digest: string, principal: string) => `bref/${digest}/u/${principalHash(principal)}`,
  publishedPrefix: (digest: string) => `bref/${digest}/p/`,
};

/** Notes that `principal` sent the bytes of `digest`: one create-only write (a no-op when noted before). */
export async function noteUpload(store: PackageStore, digest: string, principal: string): Promise<void> {
  // Lazy: lost in a machine crash, a reference is refused and the bytes are sent again.
  await store.putRecord(referenceKeys.uploader(digest, principal), {}, { ifRevision: null, lazy: true });
}

/**
 * Notes that a published version of `name` holds each of `digests`: one create-only
 * write per distinct digest (a no-op for bytes published under this name before).
 */
export async function notePublished(store: PackageStore, name: string, digests: Iterable<string>): Promise<void> {
  await mapLimit([...new Set(digests)], 32, (digest) =>
    store.putRecord(referenceKeys.published(digest, name), {}, { ifRevision: null, lazy: true }),
  );
}

/**
 * True when `principal` may reference `digest`: it uploaded the bytes, or one of the
 * (first {@link MAX_REFERENCE_NAMES}) published packages holding them passes `mayRead`.
 * O(1) reads plus a page of at most MAX_REFERENCE_NAMES keys in each layout.
 */
export async function mayReference(
  store: PackageStore,
  digest: string,
  principal: string,
  mayRead: (name: string) => Promise<boolean>,
): Promise<boolean> {
  if (await store.getRecord(referenceKeys.uploader(digest, principal))) return true;
  if (await store.getRecord(olderKeys.uploader(digest, principal))) return true;
  const names = new Set<string>();
  for (const prefix of [referenceKeys.publishedPrefix(digest), olderKeys.publishedPrefix(digest)]) {
    const page = await store.listRecords(prefix, { limit: MAX_REFERENCE_NAMES });
    for (const key of page.keys) names.add(key.slice(prefix.length));
  }
  for (const name of [...names].sort().slice(0, MAX_REFERENCE_NAMES)) {
    if (await mayRead(name)) return true;
  }
  return false;
}

/** Deletes a digest's index records (garbage collection, with its blob). */
export async function forgetReferences(store: PackageStore, digest: string): Promise<void> {
  const found: string[] = [];
  for await (const key of allKeys(store, referenceKeys.digest(digest))) found.push(key);
  await mapLimit(found, 16, (key) => store.deleteRecord(key));
}

/**
 * The packages noted as holding `digest` in a published version (both layouts), in key order. Retention reads it to
 * tell a blob some other package still holds; a note outlives a version removed, so a name here may no longer hold it.
 * O(names) over pages of 1,000.
 */
export async function* publishedNames(store: PackageStore, digest: string): AsyncIterable<string> {
  for (const prefix of [referenceKeys.publishedPrefix(digest), olderKeys.publishedPrefix(digest)])
    for await (const key of allKeys(store, prefix)) yield key.slice(prefix.length);
}
