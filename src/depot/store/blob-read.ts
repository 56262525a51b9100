/**
 * Reading a whole blob the depot wrote itself (a manifest, an attestation bundle) into memory, bounded: the store is
 * the depot's own, but an S3 endpoint that answers a 300-byte manifest with an endless body grew a depot's memory
 * without a limit (an attack round, 2026-12-02).
 */
import { RunnerDepotError } from "../../errors.js";
import type { PackageStore } from "../ports.js";

/**
 * Blob `digest` whole, or null when the store has none; STORE_UNAVAILABLE once it passes `maxBytes` (what the caller
 * knows the blob's size to be, or its kind's bound), the rest not read. O(maxBytes).
 */
export async function readBlobWhole(store: PackageStore, digest: string, maxBytes: number): Promise<Buffer | null> {
  const read = await readBlobWithin(store, digest, maxBytes);
  if (read === "over")
    throw new RunnerDepotError("STORE_UNAVAILABLE", `the store served more than ${maxBytes} bytes of blob ${digest}`);
  return read;
}

/**
 * Blob `digest` whole if it is at most `maxBytes` ("over", the rest not read, when it is longer), or null when the
 * store has none. O(maxBytes).
 */
export async function readBlobWithin(
  store: PackageStore,
  digest: string,
  maxBytes: number,
): Promise<Buffer | "over" | null> {
  const body = await store.getBlob(digest);
  if (!body) return null;
  const chunks: Buffer[] = [];
  let bytes = 0;
  for await (const chunk of body) {
    bytes += chunk.byteLength;
    if (bytes > maxBytes) return "over"; // leaving the loop ends the read
    chunks.push(Buffer.from(chunk));
  }
  return Buffer.concat(chunks);
}

/**
 * A version's manifest (JSON), within the size of the version's archive, which holds it whole as its first entry: a
 * bound the record carries, so a large manifest reads as it was published and an endless body stops there. Null when
 * the store has none. O(archive size) at most, O(manifest) read.
 *
 * @example
 * const manifest = await readVersionManifest<PackageManifest>(store, versionRecord);
 */
export async function readVersionManifest<T>(
  store: PackageStore,
  version: { manifest: string; size: number },
): Promise<T | null> {
  const bytes = await readVersionManifestBytes(store, version);
  return bytes === null ? null : (JSON.parse(bytes.toString("utf8")) as T);
}

/** {@link readVersionManifest}'s bytes, as stored. */
export function readVersionManifestBytes(
  store: PackageStore,
  version: { manifest: string; size: number },
): Promise<Buffer | null> {
  return readBlobWhole(store, version.manifest, version.size);
}
