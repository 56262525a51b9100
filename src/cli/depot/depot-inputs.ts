/**
 * Everything `publish` and `install` take from the command line, checked before the
 * first request: a bad name, version, range, attribute or folder is a usage error
 * (exit 2) that names the fix, never a half-done upload or a raw ENOENT.
 */
import { stat } from "node:fs/promises";
import path from "node:path";
import { isRunnerDepotError } from "../../errors.js";
import { isPackageName, parseRange, parseVersion } from "../../depot/package/names.js";
import { parsePackageSpec } from "../../depot/install/resolve.js";
import { CliError } from "../args.js";

/** A dependency as `publish` sends it. */
interface Requirement {
  name: string;
  range: string;
}

/** Checks a package name for publishing: valid and already lower-case (the depot stores names lower-case). */
function checkPublishName(name: string, what: string): string {
  if (!isPackageName(name)) {
    throw new CliError(
      `${what} '${name}' is not a package name: ASCII letters, digits, '.', '_', '-', starting with a letter or digit, at most 64 characters`,
      2,
    );
  }
  if (name !== name.toLowerCase()) {
    throw new CliError(
      `${what} '${name}' has upper-case letters; the depot keeps names lower-case, so write '${name.toLowerCase()}'`,
      2,
    );
  }
  return name;
}

/** `name@version` of `publish`. */
export function parsePublishSpec(spec: string): { name: string; version: string } {
  const at = spec.lastIndexOf("@");
  if (at <= 0) throw new CliError(`'${spec}' needs a version: name@version, e.g. mypkg@1.0.0`, 2);
  const name = checkPublishName(spec.slice(0, at), "package name");
  const raw = spec.slice(at + 1);
  try {
    parseVersion(raw);
    return { name, version: raw };
  } catch {
    throw new CliError(`'${raw}' in '${spec}' is not a version: SemVer 2.0.0 such as 1.2.3 or 1.2.3-rc.1`, 2);
  }
}

/** `--require name@range` (repeatable); a bare name is refused rather than read as `name@*`. */
export function parseRequires(list: readonly string[]): Requirement[] {
  return list.map((req) => {
    const at = req.indexOf("@", 1);
    if (at < 0)
      throw new CliError(
        `--require '${req}' needs a range: name@range, e.g. ${req}@^1.0 (or ${req}@* for any version)`,
        2,
      );
    const name = checkPublishName(req.slice(0, at), "--require");
    const raw = req.slice(at + 1);
    try {
      if (raw.trim() === "") throw new Error("empty");
      return { name, range: parseRange(raw) };
    } catch {
      throw new CliError(`--require '${req}': '${raw}' is not a SemVer range (e.g. ^1.2, >=1.0.0 <2, 1.x, *)`, 2);
    }
  });
}

/** `--attr key=value` (repeatable). */
export function parseAttributes(list: readonly string[]): Record<string, string> {
  const attributes: Record<string, string> = {};
  for (const attr of list) {
    const eq = attr.indexOf("=");
    if (eq <= 0) throw new CliError(`--attr '${attr}' must be key=value`, 2);
    attributes[attr.slice(0, eq)] = attr.slice(eq + 1);
  }
  return attributes;
}

/** `name[@range]` of `install`, as the installer will read it. */
export function checkInstallSpec(spec: string): void {
  try {
    parsePackageSpec(spec);
  } catch (error) {
    if (isRunnerDepotError(error) && error.code === "NAME_INVALID") {
      throw new CliError(
        `'${spec}' is not a package name: ASCII letters, digits, '.', '_', '-', starting with a letter or digit`,
        2,
      );
    }
    throw new CliError(`'${spec}' has no valid version or range: name, name@1.2.3 or name@^1.2`, 2);
  }
}

/** The folder `publish` reads: it must exist and be a directory. */
export async function checkSourceDir(dir: string): Promise<string> {
  const abs = path.resolve(dir);
  const st = await stat(abs).catch((error: NodeJS.ErrnoException) => {
    if (error.code === "ENOENT" || error.code === "ENOTDIR")
      throw new CliError(`there is no directory ${dir} to publish`, 2);
    throw new CliError(`cannot read ${dir}: ${error.code ?? error.message}`, 2);
  });
  if (!st.isDirectory())
    throw new CliError(`${dir} is a file; publish takes a directory (its files become the package)`, 2);
  return abs;
}

/** The folder `install` writes into: a directory, or creatable (its nearest existing parent is a directory). */
export async function checkTargetDir(dir: string): Promise<string> {
  const abs = path.resolve(dir);
  for (let at = abs; ; at = path.dirname(at)) {
    const st = await stat(at).catch((error: NodeJS.ErrnoException) => {
      // ENOTDIR: a parent is a file; keep climbing until it is found.
      if (error.code === "ENOENT" || error.code === "ENOTDIR") return null;
      throw new CliError(`cannot use ${dir}: ${error.code ?? error.message}`, 2);
    });
    if (st === null) {
      if (at === path.dirname(at)) break;
      continue;
    }
    if (!st.isDirectory()) {
      throw new CliError(
        at === abs
          ? `${dir} is a file; install needs a directory to install into`
          : `cannot create ${dir}: ${at} is a file, not a directory`,
        2,
      );
    }
    break;
  }
  return abs;
}
