/**
 * A version's manifest read from the upstream by byte range (the archive's first entry: its tar header, then its
 * bytes, each bounded) and checked before anything is built from it: the shape, every path and digest, and every
 * rule and limit a publish applies, so a mirror or pull-through never holds what the depot would refuse to publish.
 * A refusal by those rules (or by maxManifestBytes) is told apart from a broken answer: see isManifestRefusal.
 * Why: docs/decisions/depot-yank-mirror.md, "mirror.ts" and "Only what a publish would take".
 */
import { isRunnerDepotError, RunnerDepotError } from "../../errors.js";
import { LICENSES_DIR, MANIFEST_PATH, type PackageManifest } from "../package/archive.js";
import { isLicenseName, parsePackageName, parseRange } from "../package/names.js";
import { checkStoredItemPath, checkStoredLinkTarget } from "../package/paths.js";
import { checkAttributeValue, isAttributeKey } from "../package/attributes.js";
import { treeProblems } from "../transactions/commit.js";
import { DEFAULT_LIMITS, refuseSelfDependency, type DepotLimits } from "../transactions/lifecycle.js";
import type { Upstream } from "./upstream.js";

/**
 * Whether `error` is a refusal of a version's manifest by the publish rules and limits or by maxManifestBytes (an
 * UNAVAILABLE whose `details.refused` is true): a verdict on the version's own bytes, which never change, so the
 * mirror skips the version and pull-through remembers it. Any other failure (an archive that does not hold its
 * manifest, a digest mismatch, the network, an HTTP error) is not one: it may be the upstream's passing fault.
 */
export function isManifestRefusal(error: unknown): error is RunnerDepotError {
  return isRunnerDepotError(error) && error.code === "UNAVAILABLE" && error.details.refused === true;
}

/** A tar header's size field (octal digits, NUL or space padded); NaN for anything else. */
export function headerSize(header: Buffer): number {
  const text = header
    .subarray(124, 136)
    .toString("latin1")
    .replace(/[\0 ]+$/, "");
  return /^[0-7]{1,11}$/.test(text) ? Number.parseInt(text, 8) : Number.NaN;
}

/**
 * The UNAVAILABLE error of `name@version` from the upstream: `refused` marks a refusal by the publish rules and
 * limits or maxManifestBytes (isManifestRefusal).
 */
export function upstreamVersionError(name: string, version: string, why: string, refused = false): RunnerDepotError {
  return new RunnerDepotError("UNAVAILABLE", `upstream: ${name}@${version}: ${why}`, {
    ...(refused ? { details: { refused: true } } : {}),
  });
}

/**
 * The archive's first entry, `.pkg/manifest.json`: its header, then its bytes, each a bounded range; then
 * checkManifest with `limits` (the publish limits: mirrorDepot's `publishLimits`, pull-through's router `limits`).
 */
export async function readManifest(
  upstream: Upstream,
  name: string,
  version: string,
  archiveSize: number,
  report: { bytesFetched: number },
  limits: DepotLimits = DEFAULT_LIMITS,
): Promise<{ manifest: PackageManifest; json: Buffer }> {
  const bad = (why: string, refused?: boolean) => upstreamVersionError(name, version, why, refused);
  // The bound the Upstream was built with (mirrorDepot's or pull-through's `limits`), not the default.
  const maxManifestBytes = upstream.limits.maxManifestBytes;
  if (archiveSize < 1024) throw bad("the archive is too small to hold a manifest");
  const header = await upstream.bytes(name, version, 0, 512);
  const size = headerSize(header);
  if (header.subarray(0, MANIFEST_PATH.length + 1).toString("latin1") !== `${MANIFEST_PATH}\0`)
    throw bad("the archive does not start with its manifest");
  if (!Number.isSafeInteger(size) || size === 0 || 512 + size > archiveSize)
    throw bad("the manifest's size is out of bounds");
  // A well-formed header over the bound: the version's own size, so a refusal (not a broken answer).
  if (size > maxManifestBytes)
    throw bad(`the manifest's size is out of bounds (${size} bytes; at most ${maxManifestBytes} are read)`, true);
  const json = await upstream.bytes(name, version, 512, size);
  report.bytesFetched += 512 + size;
  let manifest: PackageManifest;
  try {
    manifest = JSON.parse(json.toString("utf8")) as PackageManifest;
  } catch {
    throw bad("the manifest is not JSON");
  }
  await checkManifest(manifest, name, version, bad, limits);
  return { manifest, json };
}

/**
 * Refuses (`fail`) a manifest the depot would not publish: its shape, what the rebuilt archive and the store's records
 * rely on, then the publish rules and limits (docs/depot-api.md §8 and §11), each by the very function a publish
 * applies (item paths and link targets: depot/package/paths.ts; the tree: `treeProblems` of the commit; licence names,
 * package names and ranges: depot/package/names.ts; attributes: the `Pkg-Attr` checks; `limits`: the caller's, a
 * router's `limits` or the defaults). A refusal names the publish code it breaks, and is `bad(why, true)`: a rule
 * the version's own manifest breaks; only a manifest naming another version (the upstream answered with another
 * archive) is `bad(why)` alone. O(items × depth) plus each link's resolution.
 *
 * @example
 * await checkManifest(manifest, "lib", "1.0.0", (why, refused) => upstreamVersionError("lib", "1.0.0", why, refused));
 */
export async function checkManifest(
  m: PackageManifest,
  name: string,
  version: string,
  fail: (why: string, refused?: boolean) => RunnerDepotError,
  limits: DepotLimits = DEFAULT_LIMITS,
): Promise<void> {
  if (typeof m !== "object" || m === null || m.name !== name || m.version !== version)
    throw fail("the manifest names another version");
  const bad = (why: string) => fail(why, true);
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
    // As a publish stores one: a canonical name and range, one per name, never the package itself. Other members (a
    // newer upstream's) are let through: the archive keeps them, the version record takes only these two (mirror.ts).
    if (typeof needed !== "string" || typeof range !== "string") throw bad("a requirement is malformed");
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
