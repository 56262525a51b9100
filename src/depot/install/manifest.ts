/**
 * What a depot archive's manifest (`.pkg/manifest.json`, its first entry) is, and the check
 * of one read from the network: paths and link targets by the server's own rules, digests,
 * licences, and the package, version and base the caller expects.
 */
import semver from "semver";
import { RunnerDepotError } from "../../errors.js";
import { LICENSES_DIR } from "../package/archive.js";
import { digestToHex } from "../client/http.js";
import { isLicenseName } from "../package/names.js";
import { checkStoredItemPath, checkStoredLinkTarget } from "../package/paths.js";
import type { Requirement } from "./resolve.js";

/** One item of a package manifest. */
export interface ManifestItem {
  type: "file" | "dir" | "link";
  path: string;
  /** Permission bits (a number, or an octal string such as `"0644"`). */
  mode?: number | string;
  size?: number;
  /** `sha256:<hex>` (or `sha-256=:<base64>:`) of a file's bytes. */
  digest?: string;
  /** A link's target, relative to the link's own directory. */
  target?: string;
}

/** The `.pkg/manifest.json` of a package or delta archive. */
export interface PackageManifest {
  name: string;
  version: string;
  attributes?: Record<string, unknown>;
  requires?: Requirement[];
  items: ManifestItem[];
  /** A delta's base version. */
  from?: string;
  /** A delta's paths to delete. */
  removed?: string[];
  /** Licence texts, shipped as `.pkg/licenses/<name>` entries (verified, not extracted). */
  licenses?: Array<{ name: string; path: string; size: number; digest: string }>;
}

/** What reading a manifest checks besides its shape. */
export interface ManifestReadOptions {
  /** Refuse a manifest larger than this many bytes. Default 64 MiB. */
  maxManifestBytes?: number;
  /** Refuse an archive whose manifest names another package, version or base. */
  expect?: { name?: string; version?: string; from?: string };
}

export const invalid = (message: string) => new RunnerDepotError("ARCHIVE_INVALID", message);

/**
 * Checks a package-relative POSIX path from an archive and returns it: the server's own
 * rule (parseItemPath: no absolute path, `..`, `.`, empty segment, backslash, NUL, `.pkg/`
 * in any case, over-long path or segment), and the path must already be NFC-normalised
 * as the server stores it; PATH_INVALID otherwise.
 */
export function checkPackagePath(p: unknown, what = "path"): string {
  if (typeof p !== "string") throw new RunnerDepotError("PATH_INVALID", `${what} is not a string`);
  return checkStoredItemPath(p, what);
}

/**
 * Checks that a link at `linkPath` pointing at `target` stays inside the package root
 * (lexically) by the server's rule (parseLinkTarget: relative, normalised segments, not
 * into `.pkg/`), already NFC-normalised; PATH_INVALID otherwise.
 */
export function checkLinkTarget(linkPath: string, target: unknown): string {
  if (typeof target !== "string") throw new RunnerDepotError("PATH_INVALID", `link ${linkPath} has no target`);
  return checkStoredLinkTarget(linkPath, target, `target of link ${JSON.stringify(linkPath)}`);
}

/** Permission bits of a manifest mode (number or octal string); setuid, setgid and sticky are dropped. */
export function modeOf(mode: number | string | undefined, fallback: number): number {
  if (mode === undefined || mode === null) return fallback;
  const n = typeof mode === "number" ? mode : Number.parseInt(mode, 8);
  if (!Number.isInteger(n) || n < 0) throw invalid(`invalid mode ${JSON.stringify(mode)}`);
  return n & 0o777;
}

/** Parses and checks a manifest's bytes (ARCHIVE_INVALID, PATH_INVALID or TYPE_INVALID). O(items). */
export function parseManifest(bytes: Buffer, options: ManifestReadOptions): PackageManifest {
  let parsed: unknown;
  try {
    parsed = JSON.parse(bytes.toString("utf8"));
  } catch (cause) {
    throw new RunnerDepotError("ARCHIVE_INVALID", "the manifest is not JSON", { cause });
  }
  const m = parsed as PackageManifest;
  if (
    !m ||
    typeof m !== "object" ||
    typeof m.name !== "string" ||
    typeof m.version !== "string" ||
    !Array.isArray(m.items)
  ) {
    throw invalid("the manifest lacks name, version or items");
  }
  const seen = new Set<string>();
  for (const item of m.items) {
    if (!item || typeof item !== "object") throw invalid("a manifest item is not an object");
    if (item.type !== "file" && item.type !== "dir" && item.type !== "link") {
      throw new RunnerDepotError("TYPE_INVALID", `manifest item type ${JSON.stringify(item.type)} is not supported`);
    }
    checkPackagePath(item.path, "manifest path");
    if (seen.has(item.path)) throw invalid(`the manifest lists ${item.path} twice`);
    seen.add(item.path);
    if (item.type === "link") checkLinkTarget(item.path, item.target);
    if (item.type === "file" && (item.digest === undefined || digestToHex(item.digest) === null)) {
      throw invalid(`manifest item ${item.path} has no usable sha-256 digest`);
    }
    modeOf(item.mode, 0);
  }
  if (m.licenses !== undefined) {
    if (!Array.isArray(m.licenses)) throw invalid("the manifest's licenses is not a list");
    for (const l of m.licenses) {
      // The server's licence-name rule: a token, so never a path of its own.
      const name =
        typeof l?.path === "string" && l.path.startsWith(`${LICENSES_DIR}/`)
          ? l.path.slice(LICENSES_DIR.length + 1)
          : "";
      if (!isLicenseName(name)) {
        throw new RunnerDepotError(
          "PATH_INVALID",
          `licence path ${JSON.stringify(l?.path)} is not .pkg/licenses/<name>`,
        );
      }
      if (typeof l.digest !== "string" || digestToHex(l.digest) === null)
        throw invalid(`licence ${l.path} has no usable digest`);
    }
  }
  if (m.removed !== undefined) {
    if (!Array.isArray(m.removed)) throw invalid("the manifest's removed is not a list");
    for (const p of m.removed) checkPackagePath(p, "removed path");
  }
  const expect = options.expect ?? {};
  if (expect.name !== undefined && m.name.toLowerCase() !== expect.name.toLowerCase()) {
    throw invalid(`the archive holds ${m.name}, not ${expect.name}`);
  }
  if (expect.version !== undefined && !sameVersion(m.version, expect.version)) {
    throw invalid(`the archive holds ${m.name}@${m.version}, not ${expect.version}`);
  }
  if (expect.from !== undefined && (m.from === undefined || !sameVersion(m.from, expect.from))) {
    throw invalid(`the delta starts from ${String(m.from)}, not ${expect.from}`);
  }
  return m;
}

function sameVersion(a: string, b: string): boolean {
  return semver.valid(a) !== null && semver.valid(b) !== null ? semver.eq(a, b) : a === b;
}
