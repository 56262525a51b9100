/**
 * A version's manifest read from the upstream by byte range (the archive's first entry: its tar header, then its
 * bytes, each bounded) and checked before anything is built from it: the shape, every path and digest.
 * Why: docs/decisions/depot-yank-mirror.md, "mirror.ts".
 */
import { RunnerDepotError } from "../../errors.js";
import { MANIFEST_PATH, type PackageManifest } from "../package/archive.js";
import { parseItemPath } from "../package/paths.js";
import { UPSTREAM_LIMITS, type Upstream } from "./upstream.js";

/** A tar header's size field (octal digits, NUL or space padded); NaN for anything else. */
export function headerSize(header: Buffer): number {
  const text = header
    .subarray(124, 136)
    .toString("latin1")
    .replace(/[\0 ]+$/, "");
  return /^[0-7]{1,11}$/.test(text) ? Number.parseInt(text, 8) : Number.NaN;
}

/** The archive's first entry, `.pkg/manifest.json`: its header, then its bytes, each a bounded range. */
export async function readManifest(
  upstream: Upstream,
  name: string,
  version: string,
  archiveSize: number,
  report: { bytesFetched: number },
): Promise<{ manifest: PackageManifest; json: Buffer }> {
  const bad = (why: string) => new RunnerDepotError("UNAVAILABLE", `upstream: ${name}@${version}: ${why}`);
  if (archiveSize < 1024) throw bad("the archive is too small to hold a manifest");
  const header = await upstream.bytes(name, version, 0, 512);
  const size = headerSize(header);
  if (header.subarray(0, MANIFEST_PATH.length + 1).toString("latin1") !== `${MANIFEST_PATH}\0`)
    throw bad("the archive does not start with its manifest");
  if (!Number.isSafeInteger(size) || size === 0 || size > UPSTREAM_LIMITS.maxManifestBytes || 512 + size > archiveSize)
    throw bad("the manifest's size is out of bounds");
  const json = await upstream.bytes(name, version, 512, size);
  report.bytesFetched += 512 + size;
  let manifest: PackageManifest;
  try {
    manifest = JSON.parse(json.toString("utf8")) as PackageManifest;
  } catch {
    throw bad("the manifest is not JSON");
  }
  checkManifest(manifest, name, version, bad);
  return { manifest, json };
}

/** What the rebuilt archive and the store's records rely on: the shape and every path checked. O(items). */
export function checkManifest(
  m: PackageManifest,
  name: string,
  version: string,
  bad: (why: string) => RunnerDepotError,
): void {
  if (typeof m !== "object" || m === null || m.name !== name || m.version !== version)
    throw bad("the manifest names another version");
  if (!Array.isArray(m.items) || !Array.isArray(m.licenses) || !Array.isArray(m.requires))
    throw bad("the manifest lacks items, licences or requirements");
  if (typeof m.attributes !== "object" || m.attributes === null || typeof m.publishedAt !== "string")
    throw bad("the manifest lacks attributes or publishedAt");
  const digest = /^sha256:[0-9a-f]{64}$/;
  for (const item of m.items) {
    parseItemPath(String(item?.path));
    const sizeOk = Number.isSafeInteger(item.size) && item.size >= 0;
    const modeOk = Number.isInteger(item.mode) && item.mode > 0 && item.mode <= 0o777;
    const kindOk =
      item.type === "file"
        ? typeof item.digest === "string" && digest.test(item.digest)
        : item.type === "dir"
          ? item.size === 0
          : item.type === "link" && typeof item.target === "string" && item.size === 0;
    if (!sizeOk || !modeOk || !kindOk) throw bad(`item ${JSON.stringify(String(item.path).slice(0, 80))} is malformed`);
  }
  for (const license of m.licenses)
    if (
      typeof license?.path !== "string" ||
      !license.path.startsWith(".pkg/licenses/") ||
      !Number.isSafeInteger(license.size) ||
      typeof license.digest !== "string" ||
      !digest.test(license.digest)
    )
      throw bad("a licence entry is malformed");
}
