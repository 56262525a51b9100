/**
 * Deltas between two versions of a package: what a holder of `from` needs to reach `to`.
 */
import type { ManifestItem, PackageManifest } from "./archive.js";
import { compareUtf8 } from "./paths.js";

function sameItem(a: ManifestItem, b: ManifestItem): boolean {
  return a.type === b.type && a.mode === b.mode && a.digest === b.digest && a.target === b.target && a.size === b.size;
}

/**
 * The manifest of the delta from `from` to `to`: `to`'s metadata, `from` and `removed`,
 * and only the items that are new or changed (a change of mode or link target counts).
 */
export function deltaManifest(from: PackageManifest, to: PackageManifest): PackageManifest {
  const before = new Map(from.items.map((item) => [item.path, item]));
  const after = new Set(to.items.map((item) => item.path));
  const items = to.items.filter((item) => {
    const old = before.get(item.path);
    return old === undefined || !sameItem(old, item);
  });
  const removed = from.items
    .map((item) => item.path)
    .filter((path) => !after.has(path))
    .sort(compareUtf8);
  return { ...to, from: from.version, removed, items };
}
