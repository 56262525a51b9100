/**
 * Package names, versions and `<pkg_name>` path segments as docs/depot-api.md (§3) defines them.
 */
import semver from "semver";
import { RunnerDepotError } from "../../errors.js";

const NAME_RE = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;
// The SemVer 2.0.0 grammar itself: `semver.valid` alone would also take `v1.0.0` and `=1.0.0`.
const SEMVER_RE =
  /^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$/;
const MAX_VERSION_LENGTH = 128;
const MAX_RANGE_LENGTH = 256;

/** A package reference parsed from a path segment: `name` or `name@version`. */
interface PackageRef {
  /** Lower-case package name. */
  name: string;
  /** Canonical version (build metadata dropped), when one was given. */
  version?: string;
}

/** Validates a package name and returns it lower-cased; NAME_INVALID otherwise. */
export function parsePackageName(raw: string): string {
  if (!NAME_RE.test(raw)) {
    throw new RunnerDepotError(
      "NAME_INVALID",
      `Invalid package name ${JSON.stringify(raw.slice(0, 80))}: ASCII letters, digits, '.', '_', '-', starting with a letter or digit, at most 64 characters`,
    );
  }
  return raw.toLowerCase();
}

const LICENSE_RE = /^[A-Za-z0-9][A-Za-z0-9.+-]{0,127}$/;

/** True when `raw` is a licence name (`Pkg-License`, `.pkg/licenses/<name>`): an SPDX-like token. */
export function isLicenseName(raw: string): boolean {
  return LICENSE_RE.test(raw);
}

/** True when `raw` is a valid package name. */
export function isPackageName(raw: string): boolean {
  return NAME_RE.test(raw);
}

/**
 * Validates a SemVer 2.0.0 version and returns its canonical identity (build metadata
 * dropped, since `1.0.0+a` and `1.0.0+b` are the same version); VERSION_INVALID otherwise.
 */
export function parseVersion(raw: string): string {
  if (raw.length > MAX_VERSION_LENGTH || !SEMVER_RE.test(raw)) {
    throw new RunnerDepotError(
      "VERSION_INVALID",
      `Invalid version ${JSON.stringify(raw.slice(0, 80))}: expected SemVer 2.0.0 such as 1.2.3 or 1.2.3-rc.1`,
    );
  }
  const parsed = semver.parse(raw);
  if (!parsed) throw new RunnerDepotError("VERSION_INVALID", `Invalid version ${JSON.stringify(raw)}`);
  return parsed.version;
}

/** Validates a SemVer range (`*` when empty; no control characters inside) and returns it; RANGE_INVALID otherwise. */
export function parseRange(raw: string): string {
  const range = raw.trim() === "" ? "*" : raw.trim();
  // semver takes a tab or a line break as a separator; a stored range holds none (C0, DEL, C1).
  if (
    range.length > MAX_RANGE_LENGTH ||
    /[\u0000-\u001f\u007f-\u009f]/.test(range) ||
    semver.validRange(range) === null
  ) {
    throw new RunnerDepotError("RANGE_INVALID", `Invalid version range ${JSON.stringify(range.slice(0, 80))}`);
  }
  return range;
}

/** Decodes a percent-encoded path segment; BAD_REQUEST on malformed escapes. */
export function decodeSegment(raw: string): string {
  try {
    return decodeURIComponent(raw);
  } catch {
    throw new RunnerDepotError("BAD_REQUEST", `Malformed percent-encoding in ${JSON.stringify(raw.slice(0, 80))}`);
  }
}

/** Parses a `<pkg_name>` path segment: `name` or `name@version`, `@` possibly percent-encoded. */
export function parsePackageRef(segment: string): PackageRef {
  const decoded = decodeSegment(segment);
  const at = decoded.indexOf("@");
  if (at === -1) return { name: parsePackageName(decoded) };
  return { name: parsePackageName(decoded.slice(0, at)), version: parseVersion(decoded.slice(at + 1)) };
}

/** Versions in ascending SemVer precedence. */
export function sortVersions(versions: readonly string[]): string[] {
  return [...versions].sort(semver.compare);
}

/** The newest version: the highest release, or the highest prerelease when no release exists. */
export function newestVersion(versions: readonly string[]): string | undefined {
  const sorted = sortVersions(versions);
  const releases = sorted.filter((v) => semver.prerelease(v) === null);
  return (releases.length > 0 ? releases : sorted).at(-1);
}
