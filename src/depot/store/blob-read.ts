/**
 * Reading a whole blob the depot wrote itself (a manifest, an attestation bundle) into memory, bounded: the store is
 * the depot's own, but an S3 endpoint that answers a 300-byte manifest with an endless body grew a depot's memory
 * without a limit (an attack round, 2026-12-02).
 */
import { RunnerDepotError } from "../../errors.js";
import type { PackageStore } from "../ports.js";

/** The largest manifest the depot reads whole (the installer's own bound on one, tar-entries.ts). */
export const MAX_MANIFEST_BYTES = 64 * 2 ** 20;

/**
 * Blob `digest` whole, or null when the store has none; STORE_UNAVAILABLE once it passes `maxBytes` (what the caller
 * knows the blob's size to be, or its kind's bound), the rest not read. O(maxBytes).
 */
export async function readBlobWhole(store: PackageStore, digest: string, maxBytes: number): Promise<Buffer | null> {
  const body = await store.getBlob(digest);
  if (!body) return null;
  const chunks: Buffer[] = [];
  let bytes = 0;
  for await (const chunk of body) {
    bytes += chunk.byteLength;
    if (bytes > maxBytes)
      throw new RunnerDepotError("STORE_UNAVAILABLE", `the store served more than ${maxBytes} bytes of blob ${digest}`);
    chunks.push(Buffer.from(chunk));
  }
  return Buffer.concat(chunks);
}

/**
 * A JSON blob the depot wrote (a manifest), within MAX_MANIFEST_BYTES; null when the store has none.
 *
 * @example
 * const manifest = await readJsonBlob<PackageManifest>(store, version.manifest);
 */
export async function readJsonBlob<T>(store: PackageStore, digest: string): Promise<T | null> {
  const bytes = await readBlobWhole(store, digest, MAX_MANIFEST_BYTES);
  return bytes === null ? null : (JSON.parse(bytes.toString("utf8")) as T);
}
