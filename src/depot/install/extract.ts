/**
 * Safe extraction of depot archives. An archive comes from the network, so nothing in
 * it is trusted: every entry must be listed in the manifest (the first entry), every
 * file must hash to the manifest's digest, and no path or link may leave the target
 * directory — absolute paths, `..`, backslashes, control characters, links whose target
 * resolves outside (through the package's own links too, checked before anything is
 * written), and entries that pass through a link are refused.
 */
import { createHash } from "node:crypto";
import { constants } from "node:fs";
import { chmod, lstat, mkdir, open, readdir, readlink, rm, symlink } from "node:fs/promises";
import path from "node:path";
import { RunnerDepotError } from "../../errors.js";
import { LICENSES_DIR } from "../package/archive.js";
import { digestToHex, sha256OfStream } from "../client/http.js";
import { resolveLink, treeOf, type TreeEntry, type TreeLookup } from "../package/links.js";
import {
  checkLinkTarget,
  checkPackagePath,
  invalid,
  modeOf,
  type ManifestItem,
  type PackageManifest,
} from "./manifest.js";
import { entryType, firstManifest, withEntries, type ArchiveSource } from "./tar-entries.js";

/** Options of {@link extractPackage}. */
interface ExtractOptions {
  /**
   * Apply a delta onto the existing contents of the directory: delete `removed`,
   * replace changed items. Without it the directory must be empty.
   */
  delta?: boolean;
  /** Refuse a manifest larger than this many bytes. Default 64 MiB. */
  maxManifestBytes?: number;
  /** Refuse an archive whose manifest names another package, version or base. */
  expect?: { name?: string; version?: string; from?: string };
  /** Called after each extracted entry with the bytes written so far. */
  onEntry?: (item: ManifestItem, bytesWritten: number) => void;
}

async function lstatOrNull(p: string) {
  try {
    return await lstat(p);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return null;
    throw error;
  }
}

/**
 * Creates the parents of `rel` under `root`, refusing any that is a link or a file.
 * `known` holds the directories (relative) this extraction already created or checked:
 * the walk starts below the deepest of them, so each path component is checked once and
 * an archive of deep paths costs time linear in their length (issue 30, item 5).
 */
async function ensureParents(root: string, rel: string, create: boolean, known?: Set<string>): Promise<boolean> {
  const parent = rel.lastIndexOf("/");
  if (parent < 0) return true;
  // The deepest ancestor already checked (paths are checked clean: no `.`, `..` or empty segment).
  let from = parent;
  while (from > 0 && !known?.has(rel.slice(0, from))) from = rel.lastIndexOf("/", from - 1);
  if (from === parent) return true;
  const segments = rel.slice(from < 0 ? 0 : from + 1, parent).split("/");
  let current = from < 0 ? root : `${root}${path.sep}${rel.slice(0, from)}`;
  let done = from < 0 ? "" : rel.slice(0, from);
  for (const segment of segments) {
    current = `${current}${path.sep}${segment}`;
    done = done === "" ? segment : `${done}/${segment}`;
    const st = await lstatOrNull(current);
    if (st === null) {
      if (!create) return false;
      await mkdir(current, { mode: 0o755 });
    } else if (st.isSymbolicLink()) {
      throw new RunnerDepotError("PATH_INVALID", `${rel} passes through the link ${path.relative(root, current)}`);
    } else if (!st.isDirectory()) {
      throw new RunnerDepotError("PATH_INVALID", `${rel} passes through the file ${path.relative(root, current)}`);
    }
    known?.add(done);
  }
  return true;
}

/**
 * Extracts a package (or, with `delta`, applies a delta) into `dir`, verifying every
 * entry against the manifest, and returns the manifest.
 *
 * @example
 * const manifest = await extractPackage(createReadStream("app-1.0.0.tar"), "/opt/pkgs/app");
 */
export async function extractPackage(
  source: ArchiveSource,
  dir: string,
  options: ExtractOptions = {},
): Promise<PackageManifest> {
  const root = path.resolve(dir);
  await mkdir(root, { recursive: true });
  if (!options.delta && (await readdir(root)).length > 0) {
    throw new RunnerDepotError("PATH_EXISTS", `extraction target ${root} is not empty`);
  }
  return withEntries(source, async (entries) => {
    const manifest = await firstManifest(entries, options);
    const pending = new Map(manifest.items.map((item) => [item.path, item]));
    const licenses = new Map((manifest.licenses ?? []).map((l) => [l.path, l]));
    const done = new Set<string>();
    const dirModes: Array<[string, number]> = [];
    const knownDirs = new Set<string>();
    let written = 0;

    // Before anything is written: no link may lead out through the package's links.
    await checkLinkChains(manifest, root, options.delta === true);

    if (options.delta) {
      for (const rel of manifest.removed ?? []) {
        // A removed path below a link would delete outside the package: refuse it.
        if (!(await ensureParents(root, rel, false))) continue;
        await rm(path.join(root, rel), { recursive: true, force: true });
      }
    } else if ((manifest.removed?.length ?? 0) > 0 || manifest.from !== undefined) {
      throw invalid("a delta archive was given where a whole package was expected");
    }

    for (;;) {
      const next = await entries.next();
      if (next.done) break;
      const entry = next.value;
      const header = entry.header;
      const type = entryType(header);
      if (header.name.startsWith(".pkg/")) {
        // Licence texts live in the reserved prefix: check them, keep them out of the tree.
        const license = licenses.get(header.name);
        if (!license || type !== "file")
          throw new RunnerDepotError("PATH_INVALID", `archive entry ${header.name} is in the reserved .pkg/ prefix`);
        licenses.delete(header.name);
        const { hex, size } = await sha256OfStream(entry as unknown as AsyncIterable<Uint8Array>);
        if (hex !== digestToHex(license.digest) || size !== license.size) {
          throw new RunnerDepotError(
            "DIGEST_MISMATCH",
            `${header.name}: got sha256:${hex}, the manifest says ${license.digest}`,
          );
        }
        continue;
      }
      const rel = type === "dir" ? header.name.replace(/\/+$/, "") : header.name;
      checkPackagePath(rel, "archive entry");
      if (done.has(rel)) throw invalid(`the archive holds ${rel} twice`);
      const item = pending.get(rel);
      if (!item) throw invalid(`the archive entry ${rel} is not in the manifest`);
      if (item.type !== type) throw invalid(`the archive entry ${rel} is a ${type}, the manifest says ${item.type}`);
      pending.delete(rel);
      done.add(rel);

      await ensureParents(root, rel, true, knownDirs);
      const full = `${root}${path.sep}${rel}`;
      const existing = await lstatOrNull(full);
      if (existing) {
        if (type === "dir" && existing.isDirectory()) {
          // A parent made earlier for an out-of-order entry, or a kept directory in a delta.
        } else if (!options.delta) {
          throw invalid(`the archive entry ${rel} collides with an earlier one`);
        } else {
          await rm(full, { recursive: true, force: true });
          knownDirs.clear(); // what was checked below it is gone
        }
      }
      if (type === "dir") knownDirs.add(rel);

      if (type === "file") {
        const expected = digestToHex(item.digest!)!;
        const hash = createHash("sha256");
        let size = 0;
        // O_EXCL | O_NOFOLLOW: never write through a link planted at this path.
        const fh = await open(
          full,
          constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW,
          0o600,
        );
        try {
          for await (const chunk of entry as unknown as AsyncIterable<Buffer>) {
            hash.update(chunk);
            size += chunk.byteLength;
            await fh.write(chunk);
          }
          await fh.chmod(modeOf(item.mode ?? header.mode, 0o644));
        } finally {
          await fh.close();
        }
        const actual = hash.digest("hex");
        if (actual !== expected || (item.size !== undefined && size !== item.size)) {
          throw new RunnerDepotError(
            "DIGEST_MISMATCH",
            `${rel}: got sha256:${actual} (${size} bytes), the manifest says ${item.digest} (${String(item.size)} bytes)`,
          );
        }
        written += size;
      } else {
        entry.resume();
        if (type === "link") {
          const target = checkLinkTarget(rel, header.linkname);
          if (item.target !== target)
            throw invalid(`link ${rel} → ${target}, the manifest says → ${String(item.target)}`);
          await symlink(target, full);
        } else {
          if (!existing) await mkdir(full, { mode: 0o700 });
          dirModes.push([full, modeOf(item.mode ?? header.mode, 0o755)]);
        }
      }
      options.onEntry?.(item, written);
    }
    if (licenses.size > 0) throw invalid(`licence(s) missing from the archive: ${[...licenses.keys()].join(", ")}`);
    if (pending.size > 0) {
      const missing = [...pending.keys()].slice(0, 5).join(", ");
      throw invalid(`${pending.size} manifest item(s) missing from the archive: ${missing}`);
    }
    // Deepest first, so a read-only directory is locked only after its contents exist.
    dirModes.sort((a, b) => b[0].length - a[0].length);
    for (const [p, mode] of dirModes) await chmod(p, mode);
    return manifest;
  });
}

/**
 * Refuses (PATH_INVALID) a manifest with a link whose chain through the package's links leaves the root
 * (depot/package/links.ts, the server's own rule).
 * Why: docs/decisions/depot-client.md, "extract.ts: checkLinkChains".
 */
async function checkLinkChains(manifest: PackageManifest, root: string, delta: boolean): Promise<void> {
  const listed = treeOf(manifest.items);
  const removed = new Set(delta ? (manifest.removed ?? []) : []);
  const isRemoved = (p: string) =>
    removed.has(p) || p.split("/").some((_, i, all) => removed.has(all.slice(0, i).join("/")));
  const lookup: TreeLookup = delta
    ? async (p) => listed(p) ?? (isRemoved(p) ? undefined : await installedEntry(root, p))
    : listed;
  for (const item of manifest.items) {
    if (item.type === "link") await resolveLink(item.path, checkLinkTarget(item.path, item.target), lookup);
  }
}

/** What is installed at `rel` under `root`, never through a link (then: nothing). */
async function installedEntry(root: string, rel: string): Promise<TreeEntry | undefined> {
  const segments = rel.split("/");
  let current = root;
  for (const [i, segment] of segments.entries()) {
    current = path.join(current, segment);
    const st = await lstatOrNull(current);
    if (st === null) return undefined;
    if (i === segments.length - 1) {
      if (st.isSymbolicLink()) return { type: "link", target: await readlink(current) };
      return { type: st.isDirectory() ? "dir" : "file" };
    }
    if (!st.isDirectory()) return undefined;
  }
  return undefined;
}
