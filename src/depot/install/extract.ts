/**
 * Safe extraction of depot archives. An archive comes from the network, so nothing in
 * it is trusted: every entry must be listed in the manifest (the first entry), every
 * file must hash to the manifest's digest, and no path or link may leave the target
 * directory — absolute paths, `..`, backslashes, control characters, links whose target
 * resolves outside (through the package's own links too, checked before anything is
 * written), and entries that pass through a link are refused.
 */
import { createHash } from "node:crypto";
import { constants, createReadStream } from "node:fs";
import { chmod, lstat, mkdir, open, readdir, readlink, rm, rmdir, symlink } from "node:fs/promises";
import path from "node:path";
import { Readable } from "node:stream";
import type { ReadableStream as WebReadableStream } from "node:stream/web";
import { createTarDecoder, type ParsedTarEntry, type TarHeader } from "modern-tar";
import semver from "semver";
import { RunnerDepotError } from "../../errors.js";
import { LICENSES_DIR, MANIFEST_PATH } from "../package/archive.js";
import { digestToHex, sha256OfStream } from "../client/http.js";
import { resolveLink, treeOf, type TreeEntry, type TreeLookup } from "../package/links.js";
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

type ArchiveSource = AsyncIterable<Uint8Array> | Iterable<Uint8Array> | NodeJS.ReadableStream;
/** One archive entry: its header, and its bytes to read once (or `resume()` to skip them). */
interface TarEntry extends AsyncIterable<Uint8Array> {
  header: TarHeader;
  resume(): void;
}
type TarEntries = AsyncIterator<TarEntry>;

const invalid = (message: string) => new RunnerDepotError("ARCHIVE_INVALID", message);

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
function modeOf(mode: number | string | undefined, fallback: number): number {
  if (mode === undefined || mode === null) return fallback;
  const n = typeof mode === "number" ? mode : Number.parseInt(mode, 8);
  if (!Number.isInteger(n) || n < 0) throw invalid(`invalid mode ${JSON.stringify(mode)}`);
  return n & 0o777;
}

function parseManifest(bytes: Buffer, options: ExtractOptions): PackageManifest {
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

function entryType(header: TarHeader): ManifestItem["type"] {
  switch (header.type) {
    case "file":
      return "file";
    case "directory":
      return "dir";
    case "symlink":
      return "link";
    default:
      throw new RunnerDepotError(
        "TYPE_INVALID",
        `archive entry ${header.name} has the unsupported type ${String(header.type)}`,
      );
  }
}

async function readAll(entry: AsyncIterable<Uint8Array>, max: number): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of entry) {
    size += chunk.byteLength;
    if (size > max) throw invalid(`the manifest is larger than ${max} bytes`);
    chunks.push(Buffer.from(chunk));
  }
  return Buffer.concat(chunks);
}

/**
 * The decoder's entries one at a time: an entry whose bytes were neither read nor skipped
 * is drained before the next is read (the decoder waits for them). O(1) memory per entry.
 */
function entriesOf(reader: ReadableStreamDefaultReader<ParsedTarEntry>): TarEntries {
  let unread: WebReadableStream<Uint8Array> | ReadableStream<Uint8Array> | null = null;
  const drain = async (body: ReadableStream<Uint8Array>) => {
    for await (const _ of body as unknown as AsyncIterable<Uint8Array>) {
      // skipped: an entry whose bytes nothing needs (a directory's or a link's are empty)
    }
  };
  return {
    async next() {
      if (unread !== null) await drain(unread as ReadableStream<Uint8Array>);
      unread = null;
      const read = await reader.read();
      if (read.done) return { done: true, value: undefined };
      const { header, body } = read.value;
      unread = body;
      let skipping: Promise<void> | null = null;
      const entry: TarEntry = {
        header,
        [Symbol.asyncIterator]() {
          unread = null;
          return (body as unknown as AsyncIterable<Uint8Array>)[Symbol.asyncIterator]();
        },
        resume() {
          unread = null;
          skipping ??= drain(body).catch(() => undefined);
        },
      };
      return { done: false, value: entry };
    },
  };
}

/**
 * Runs `body` over the archive's tar entries (modern-tar's strict decoder: checksums,
 * magic and truncation checked, metadata entries capped at 8 MiB), tearing the decoder
 * and source down on error or when `stopEarly` has what it needs.
 */
async function withEntries<T>(
  source: ArchiveSource,
  body: (entries: TarEntries) => Promise<T>,
  stopEarly = false,
): Promise<T> {
  const input =
    source instanceof Readable ? source : Readable.from(source as AsyncIterable<Uint8Array> | Iterable<Uint8Array>);
  const reader = (Readable.toWeb(input) as unknown as ReadableStream<Uint8Array>)
    .pipeThrough(createTarDecoder({ strict: true }))
    .getReader();
  const stop = async () => {
    await reader.cancel().catch(() => undefined);
    input.destroy();
  };
  try {
    const result = await body(entriesOf(reader));
    if (stopEarly) await stop();
    return result;
  } catch (error) {
    await stop();
    if (error instanceof RunnerDepotError) throw error;
    throw new RunnerDepotError("ARCHIVE_INVALID", `the archive is malformed: ${(error as Error).message}`, {
      cause: error,
    });
  }
}

async function firstManifest(entries: TarEntries, options: ExtractOptions): Promise<PackageManifest> {
  const first = await entries.next();
  if (first.done) throw invalid("the archive is empty");
  const entry = first.value;
  if (entry.header.name !== MANIFEST_PATH || entryType(entry.header) !== "file") {
    throw invalid(`the archive's first entry is ${entry.header.name}, not ${MANIFEST_PATH}`);
  }
  return parseManifest(
    await readAll(entry as unknown as AsyncIterable<Uint8Array>, options.maxManifestBytes ?? 64 * 2 ** 20),
    options,
  );
}

/**
 * Reads only the manifest (the first entry) of an archive; the rest of the stream is
 * not consumed, so a ranged download of the archive's head is enough.
 */
export async function readPackageManifest(
  source: ArchiveSource,
  options: ExtractOptions = {},
): Promise<PackageManifest> {
  return withEntries(source, (entries) => firstManifest(entries, options), true);
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

async function fileSha256(p: string): Promise<{ hex: string; size: number }> {
  const hash = createHash("sha256");
  let size = 0;
  for await (const chunk of createReadStream(p) as AsyncIterable<Buffer>) {
    hash.update(chunk);
    size += chunk.byteLength;
  }
  return { hex: hash.digest("hex"), size };
}

/** Options of {@link verifyPackageTree}. */
interface VerifyTreeOptions {
  /** First delete empty directories that neither the manifest nor any item below needs. */
  prune?: boolean;
}

/**
 * Checks that `dir` holds exactly the manifest's items: types, bytes (SHA-256), sizes,
 * permission bits and link targets; directories only as listed or as parents of items.
 * Throws DIGEST_MISMATCH listing the differences.
 */
export async function verifyPackageTree(
  dir: string,
  items: readonly ManifestItem[],
  options: VerifyTreeOptions = {},
): Promise<void> {
  const root = path.resolve(dir);
  const wanted = new Map(items.map((i) => [i.path, i]));
  const needed = new Set<string>();
  for (const item of items) {
    const parts = item.path.split("/");
    for (let i = 1; i < parts.length; i++) needed.add(parts.slice(0, i).join("/"));
  }
  const problems: string[] = [];
  const seen = new Set<string>();

  const walk = async (rel: string): Promise<void> => {
    const abs = rel === "" ? root : path.join(root, rel);
    for (const dirent of await readdir(abs, { withFileTypes: true })) {
      const childRel = rel === "" ? dirent.name : `${rel}/${dirent.name}`;
      const child = path.join(abs, dirent.name);
      const st = await lstat(child);
      const item = wanted.get(childRel);
      if (st.isDirectory()) {
        await walk(childRel);
        if (!item && !needed.has(childRel) && options.prune && (await readdir(child)).length === 0) {
          await rmdir(child);
          continue;
        }
      }
      seen.add(childRel);
      if (!item) {
        if (!(st.isDirectory() && needed.has(childRel))) problems.push(`${childRel}: not in the manifest`);
        continue;
      }
      const actual = st.isDirectory() ? "dir" : st.isSymbolicLink() ? "link" : st.isFile() ? "file" : "other";
      if (actual !== item.type) {
        problems.push(`${childRel}: is a ${actual}, the manifest says ${item.type}`);
        continue;
      }
      if (item.type === "link") {
        const target = await readlink(child);
        if (target !== item.target)
          problems.push(`${childRel}: links to ${target}, the manifest says ${String(item.target)}`);
        continue;
      }
      const mode = modeOf(item.mode, item.type === "dir" ? 0o755 : 0o644);
      if ((st.mode & 0o777) !== mode) {
        problems.push(`${childRel}: mode ${(st.mode & 0o777).toString(8)}, the manifest says ${mode.toString(8)}`);
      }
      if (item.type === "file") {
        const { hex, size } = await fileSha256(child);
        if (hex !== digestToHex(item.digest ?? "") || (item.size !== undefined && size !== item.size)) {
          problems.push(`${childRel}: content differs from ${String(item.digest)}`);
        }
      }
    }
  };
  await walk("");
  for (const item of items) if (!seen.has(item.path)) problems.push(`${item.path}: missing`);
  // The tree is the manifest's: its links must not lead out through each other either.
  const tree = treeOf(items);
  for (const item of items) {
    if (item.type !== "link") continue;
    try {
      await resolveLink(item.path, checkLinkTarget(item.path, item.target), tree);
    } catch (error) {
      problems.push(`${item.path}: ${(error as Error).message}`);
    }
  }
  if (problems.length > 0) {
    throw new RunnerDepotError(
      "DIGEST_MISMATCH",
      `${dir} does not match the manifest (${problems.length} difference(s)): ${problems.slice(0, 10).join("; ")}`,
      { details: { problems: problems.slice(0, 100) } },
    );
  }
}
