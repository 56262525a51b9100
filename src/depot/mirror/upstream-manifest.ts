/**
 * A version's manifest read from the upstream by byte range (the archive's first entry: its tar header, then its
 * bytes, each bounded) and checked before anything is built from it: the shape, every path and digest, and every
 * rule and limit a publish applies, so a mirror or pull-through never holds what the depot would refuse to publish.
 * Why: docs/decisions/depot-yank-mirror.md, "mirror.ts".
 */
import { isRunnerDepotError, RunnerDepotError } from "../../errors.js";
import { LICENSES_DIR, MANIFEST_PATH, type PackageManifest } from "../package/archive.js";
import { isLicenseName, parsePackageName, parseRange } from "../package/names.js";
import { checkStoredItemPath, checkStoredLinkTarget } from "../package/paths.js";
import { checkAttributeValue, isAttributeKey } from "../server/request-headers.js";
import { treeProblems } from "../transactions/commit.js";
import { DEFAULT_LIMITS, refuseSelfDependency, type DepotLimits } from "../transactions/lifecycle.js";
import type { Upstream } from "./upstream.js";

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
  // The bound the Upstream was built with (mirrorDepot's or pull-through's `limits`), not the default.
  const maxManifestBytes = upstream.limits.maxManifestBytes;
  if (archiveSize < 1024) throw bad("the archive is too small to hold a manifest");
  const header = await upstream.bytes(name, version, 0, 512);
  const size = headerSize(header);
  if (header.subarray(0, MANIFEST_PATH.length + 1).toString("latin1") !== `${MANIFEST_PATH}\0`)
    throw bad("the archive does not start with its manifest");
  if (!Number.isSafeInteger(size) || size === 0 || size > maxManifestBytes || 512 + size > archiveSize)
    throw bad("the manifest's size is out of bounds");
  const json = await upstream.bytes(name, version, 512, size);
  report.bytesFetched += 512 + size;
  let manifest: PackageManifest;
  try {
    manifest = JSON.parse(json.toString("utf8")) as PackageManifest;
  } catch {
    throw bad("the manifest is not JSON");
  }
  await checkManifest(manifest, name, version, bad);
  return { manifest, json };
}

/**
 * Refuses (`bad`) a manifest the depot would not publish: its shape, what the rebuilt archive and the store's records
 * rely on, then the publish rules and limits (docs/depot-api.md §8 and §11), each by the very function a publish
 * applies (item paths and link targets: depot/package/paths.ts; the tree: `treeProblems` of the commit; licence names,
 * package names and ranges: depot/package/names.ts; attributes: the `Pkg-Attr` checks; `limits`: the router's
 * defaults). A refusal names the publish code it breaks. O(items × depth) plus each link's resolution.
 *
 * @example
 * await checkManifest(manifest, "lib", "1.0.0", (why) => new RunnerDepotError("UNAVAILABLE", why));
 */
export async function checkManifest(
  m: PackageManifest,
  name: string,
  version: string,
  bad: (why: string) => RunnerDepotError,
  limits: DepotLimits = DEFAULT_LIMITS,
): Promise<void> {
  if (typeof m !== "object" || m === null || m.name !== name || m.version !== version)
    throw bad("the manifest names another version");
  if (!Array.isArray(m.items) || !Array.isArray(m.licenses) || !Array.isArray(m.requires))
    throw bad("the manifest lacks items, licences or requirements");
  if (
    typeof m.attributes !== "object" ||
    m.attributes === null ||
    Array.isArray(m.attributes) ||
    typeof m.publishedAt !== "string"
  )
    throw bad("the manifest lacks attributes or publishedAt");
  // A publish never writes a delta's members into a version's manifest; an installer refuses a version carrying them.
  if (m.from !== undefined || m.removed !== undefined) throw bad("the manifest is a delta's, not a version's");
  // A rule's own refusal, reported as the upstream's (so the mirror's run and a pull answer as for any bad version).
  const rule = <T>(check: () => T): T => {
    try {
      return check();
    } catch (error) {
      if (isRunnerDepotError(error)) throw bad(`${error.code}: ${error.message}`);
      throw error;
    }
  };
  // The counts first: everything after is linear in them.
  const attributes = Object.entries(m.attributes);
  if (m.items.length + m.licenses.length > limits.items)
    throw bad(`TOO_MANY_ITEMS: more than ${limits.items} items and licences`);
  if (m.requires.length > limits.requires) throw bad(`TOO_MANY_ITEMS: more than ${limits.requires} requirements`);
  if (attributes.length > limits.attributes) throw bad(`TOO_MANY_ITEMS: more than ${limits.attributes} attributes`);
  for (const [key, value] of attributes) {
    if (!isAttributeKey(key) || typeof value !== "string")
      throw bad(`HEADER_INVALID: attribute ${JSON.stringify(key.slice(0, 80))} is malformed`);
    rule(() => checkAttributeValue(key, value));
  }
  const required = new Set<string>();
  for (const r of m.requires as unknown[]) {
    const { name: needed, range } = (typeof r === "object" && r !== null ? r : {}) as Record<string, unknown>;
    // As a publish stores one: exactly a canonical name and range, one per name, never the package itself.
    if (typeof needed !== "string" || typeof range !== "string" || Object.keys(r as object).length !== 2)
      throw bad("a requirement is malformed");
    if (rule(() => parsePackageName(needed)) !== needed || rule(() => parseRange(range)) !== range)
      throw bad(`requirement ${JSON.stringify(`${needed}@${range}`.slice(0, 80))} is not as a publish stores it`);
    rule(() => refuseSelfDependency(name, [{ name: needed, range }]));
    if (required.has(needed)) throw bad(`requirement ${JSON.stringify(needed)} is listed twice`);
    required.add(needed);
  }
  const digest = /^sha256:[0-9a-f]{64}$/;
  const licensed = new Set<string>();
  for (const license of m.licenses) {
    // `Pkg-License` names a token, stored at `.pkg/licenses/<name>`: never a path of its own.
    if (
      typeof license?.name !== "string" ||
      !isLicenseName(license.name) ||
      license.path !== `${LICENSES_DIR}/${license.name}` ||
      licensed.has(license.name) ||
      !Number.isSafeInteger(license.size) ||
      license.size < 0 ||
      license.size > limits.itemBytes ||
      typeof license.digest !== "string" ||
      !digest.test(license.digest)
    )
      throw bad(`licence entry ${JSON.stringify(String(license?.path).slice(0, 80))} is not as a publish stores it`);
    licensed.add(license.name);
  }
  for (const item of m.items) {
    if (typeof item?.path !== "string") throw bad("an item has no path");
    rule(() => checkStoredItemPath(item.path));
    const sizeOk = Number.isSafeInteger(item.size) && item.size >= 0 && item.size <= limits.itemBytes;
    const modeOk = Number.isInteger(item.mode) && item.mode > 0 && item.mode <= 0o777;
    const kindOk =
      item.type === "file"
        ? typeof item.digest === "string" && digest.test(item.digest)
        : item.type === "dir"
          ? item.size === 0
          : item.type === "link" && typeof item.target === "string" && item.size === 0;
    if (!sizeOk || !modeOk || !kindOk) throw bad(`item ${JSON.stringify(item.path.slice(0, 80))} is malformed`);
    if (item.type === "link") rule(() => checkStoredLinkTarget(item.path, item.target!));
  }
  // The commit's whole-tree rules: nothing below a file or link, no link chain out of the root, one path once.
  const problems = await treeProblems(m.items);
  if (problems.length > 0) {
    const more = problems.length > 1 ? ` (and ${problems.length - 1} more problem(s))` : "";
    throw bad(`${problems[0]!.code}: ${problems[0]!.detail.slice(0, 300)}${more}`);
  }
}
