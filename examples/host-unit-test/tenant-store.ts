/**
 * A host's own PackageStore adapter: one backing store shared by several tenants, each
 * tenant's records kept under its own key prefix (blobs are content-addressed, so they
 * are shared safely). The host proves it against the library's conformance suite in
 * host.test.ts, exactly as the shipped adapters do.
 */
import type { PackageStore } from "runner-depot/depot";

/**
 * Wraps `backing` so that every record key lives below `tenants/<tenant>/`.
 *
 * @example
 * const store = createTenantStore(createFsStore("/var/lib/depot"), "acme");
 * const depot = createPackageRouter(store);
 */
export function createTenantStore(backing: PackageStore, tenant: string): PackageStore {
  const prefix = `tenants/${tenant}/`;
  return {
    putBlob: (body, options) => backing.putBlob(body, options),
    getBlob: (digest, range) => backing.getBlob(digest, range),
    statBlob: (digest) => backing.statBlob(digest),
    deleteBlob: (digest) => backing.deleteBlob(digest),
    listBlobs: () => backing.listBlobs(),
    getRecord: (key) => backing.getRecord(prefix + key),
    putRecord: (key, value, cond) => backing.putRecord(prefix + key, value, cond),
    deleteRecord: (key, cond) => backing.deleteRecord(prefix + key, cond),
    async listRecords(keyPrefix, page) {
      // The cursor is the backing store's; it stays opaque to the caller.
      const found = await backing.listRecords(prefix + keyPrefix, page);
      return { ...found, keys: found.keys.map((key) => key.slice(prefix.length)) };
    },
    close: () => backing.close?.() ?? Promise.resolve(),
  };
}
