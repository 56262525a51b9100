/**
 * Installs never destroy (docs/decisions/install-preserve.md).
 * Why: docs/decisions/install-preserve.md, "preserve.ts: how installs keep the user's files".
 */
import { randomUUID } from "node:crypto";
import { createReadStream } from "node:fs";
import { lstat, mkdir, readFile, readdir, readlink, rename, writeFile } from "node:fs/promises";
import path from "node:path";
import { RunnerDepotError } from "../../errors.js";
import { digestToHex, sha256OfStream } from "../client/http.js";
import type { ManifestItem } from "./manifest.js";

/**
 * What an install does with a user's entry where the new version has another:
 * `refuse` (default) stops the install naming the paths; `renameold` keeps the
 * user's entry next to the package's as `<path>.old` (`.old.1`, … when taken).
 */
export type PreserveMode = "refuse" | "renameold";

/** One entry an install wrote. */
export interface RecordItem {
  path: string;
  type: "file" | "dir" | "link";
  /** SHA-256 hex of a file's bytes. */
  sha256?: string;
  /** A link's target. */
  target?: string;
}

/** `<target>/.runner-depot/records/<name>.json`: what the install of a package wrote. */
interface InstallRecord {
  name: string;
  version: string;
  items: RecordItem[];
}

/** A live entry the record does not vouch for. */
export interface UserEntry {
  /** Package-relative POSIX path. */
  path: string;
  type: "file" | "dir" | "link" | "other";
  /** `untracked`: the install did not write it; `changed`: it did, and it changed since. */
  why: "untracked" | "changed";
}

/** A move of a user's entry from the live folder into the staged one. */
interface CarryMove {
  from: string;
  to: string;
}

/** What {@link planPreserve} decided for one package. */
export interface PreservePlan {
  moves: CarryMove[];
  /** Entries that would be replaced and cannot be kept under the mode. */
  conflicts: UserEntry[];
}

/** The record's items from a manifest's: what extraction wrote. */
export function recordItems(items: readonly ManifestItem[]): RecordItem[] {
  return items.map((item) =>
    item.type === "file"
      ? { path: item.path, type: "file", sha256: digestToHex(item.digest ?? "") ?? "" }
      : item.type === "link"
        ? { path: item.path, type: "link", target: item.target ?? "" }
        : { path: item.path, type: "dir" },
  );
}

const recordFile = (stateDir: string, name: string) => path.join(stateDir, "records", `${name}.json`);

/**
 * The record of a package's last install, or null when none was kept (an install by an
 * older runner-depot, or none).
 *
 * @example
 * const record = await readInstallRecord("/opt/pkgs/.runner-depot", "toolchain");
 */
export async function readInstallRecord(stateDir: string, name: string): Promise<InstallRecord | null> {
  try {
    return parseInstallRecord(await readFile(recordFile(stateDir, name), "utf8"));
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return null;
    throw error;
  }
}

/**
 * Parses a record's text; null for anything that is not a well-formed record (a damaged
 * record vouches for nothing). O(items).
 *
 * @example
 * parseInstallRecord('{"name":"app","version":"1.0.0","items":[]}'); // { name: "app", … }
 */
export function parseInstallRecord(text: string): InstallRecord | null {
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    return null;
  }
  if (typeof parsed !== "object" || parsed === null) return null;
  const { name, version, items } = parsed as Record<string, unknown>;
  if (typeof name !== "string" || typeof version !== "string" || !Array.isArray(items)) return null;
  const good = items.every((item: unknown) => {
    if (typeof item !== "object" || item === null) return false;
    const { path: p, type, sha256: digest, target } = item as Record<string, unknown>;
    if (typeof p !== "string" || p === "") return false;
    if (type === "file") return typeof digest === "string";
    if (type === "link") return typeof target === "string";
    return type === "dir";
  });
  return good ? { name, version, items: items as RecordItem[] } : null;
}

/** Writes a package's record atomically (temp file, then rename). */
export async function writeInstallRecord(stateDir: string, record: InstallRecord): Promise<void> {
  await mkdir(path.join(stateDir, "records"), { recursive: true });
  const tmp = path.join(stateDir, "records", `.${record.name}.${randomUUID()}.tmp`);
  await writeFile(tmp, `${JSON.stringify(record)}\n`);
  await rename(tmp, recordFile(stateDir, record.name));
}

/** The SHA-256 of a file's bytes, hex (the client's one hashing loop). */
const sha256 = async (file: string): Promise<string> => (await sha256OfStream(createReadStream(file))).hex;

type Kind = UserEntry["type"];

async function kindOf(p: string): Promise<Kind | null> {
  try {
    const st = await lstat(p);
    return st.isDirectory() ? "dir" : st.isSymbolicLink() ? "link" : st.isFile() ? "file" : "other";
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT" || (error as NodeJS.ErrnoException).code === "ENOTDIR")
      return null;
    throw error;
  }
}

/**
 * The entries under `live` that `items` (the record; null: none) does not vouch for.
 * An untracked directory is one entry (everything below it is the user's too).
 *
 * @example
 * const mine = await findUserEntries("/opt/pkgs/toolchain", record?.items ?? null);
 */
export async function findUserEntries(live: string, items: readonly RecordItem[] | null): Promise<UserEntry[]> {
  if ((await kindOf(live)) !== "dir") return [];
  const tracked = new Map((items ?? []).map((i) => [i.path, i]));
  // Directories the record implies as parents of its items.
  // Deepest first, stopping at a parent already walked up from: linear in the paths' length.
  const walked = new Set<string>();
  for (const item of items ?? []) {
    for (let end = item.path.lastIndexOf("/"); end > 0; end = item.path.lastIndexOf("/", end - 1)) {
      const dir = item.path.slice(0, end);
      if (walked.has(dir)) break;
      walked.add(dir);
      if (!tracked.has(dir)) tracked.set(dir, { path: dir, type: "dir" });
    }
  }
  const found: UserEntry[] = [];
  const walk = async (rel: string): Promise<void> => {
    const names = (await readdir(rel === "" ? live : path.join(live, rel))).sort();
    for (const name of names) {
      const p = rel === "" ? name : `${rel}/${name}`;
      const abs = path.join(live, p);
      const kind = (await kindOf(abs))!;
      const record = tracked.get(p);
      if (!record) {
        found.push({ path: p, type: kind, why: "untracked" });
        continue;
      }
      if (record.type !== kind) {
        found.push({ path: p, type: kind, why: "changed" });
        continue;
      }
      if (kind === "dir") await walk(p);
      else if (kind === "link" && (await readlink(abs)) !== record.target)
        found.push({ path: p, type: kind, why: "changed" });
      else if (kind === "file" && (await sha256(abs)) !== record.sha256)
        found.push({ path: p, type: kind, why: "changed" });
    }
  };
  await walk("");
  return found;
}

/** True when the staged entry holds exactly what the live one does (nothing is lost by replacing it). */
async function sameEntry(liveAbs: string, stagedAbs: string, kind: Kind): Promise<boolean> {
  const staged = await kindOf(stagedAbs);
  if (staged !== kind) return false;
  if (kind === "link") return (await readlink(liveAbs)) === (await readlink(stagedAbs));
  if (kind === "file") return (await sha256(liveAbs)) === (await sha256(stagedAbs));
  return false;
}

/** True when every ancestor of `rel` inside `stage` is a directory or absent (so the entry can be placed). */
async function placeable(stage: string, rel: string): Promise<boolean> {
  const parts = rel.split("/");
  for (let i = 1; i < parts.length; i++) {
    const kind = await kindOf(path.join(stage, ...parts.slice(0, i)));
    if (kind === null) return true;
    if (kind !== "dir") return false;
  }
  return true;
}

/**
 * Decides, without changing anything, where each user entry goes: carried to the same
 * path in `stage`, dropped when the staged one is identical, kept as `.old` under
 * `renameold`, or a conflict.
 *
 * @example
 * const plan = await planPreserve(live, stage, await findUserEntries(live, record?.items ?? null), "refuse");
 * if (plan.conflicts.length > 0) throw preserveConflict(target, name, plan.conflicts);
 */
export async function planPreserve(
  live: string,
  stage: string,
  entries: readonly UserEntry[],
  mode: PreserveMode,
): Promise<PreservePlan> {
  const plan: PreservePlan = { moves: [], conflicts: [] };
  const claimed = new Set<string>();
  const visit = async (entry: UserEntry): Promise<void> => {
    const liveAbs = path.join(live, entry.path);
    const stagedAbs = path.join(stage, entry.path);
    const staged = await kindOf(stagedAbs);
    if (staged === null && (await placeable(stage, entry.path))) {
      plan.moves.push({ from: liveAbs, to: stagedAbs });
      return;
    }
    if (entry.type === "dir" && staged === "dir") {
      // The user's folder where the new version has one too: look at what is inside.
      for (const name of (await readdir(liveAbs)).sort()) {
        const p = `${entry.path}/${name}`;
        await visit({ path: p, type: (await kindOf(path.join(live, p)))!, why: entry.why });
      }
      return;
    }
    if (staged !== null && (await sameEntry(liveAbs, stagedAbs, entry.type))) return;
    if (mode === "renameold" && (await placeable(stage, entry.path))) {
      for (let n = 0; ; n++) {
        const rel = `${entry.path}.old${n === 0 ? "" : `.${n}`}`;
        if (
          claimed.has(rel) ||
          (await kindOf(path.join(stage, rel))) !== null ||
          (await kindOf(path.join(live, rel))) !== null
        )
          continue;
        claimed.add(rel);
        plan.moves.push({ from: liveAbs, to: path.join(stage, rel) });
        return;
      }
    }
    plan.conflicts.push(entry);
  };
  for (const entry of entries) await visit(entry);
  return plan;
}

/** The CONFLICT an install refuses with: names the paths (under the target) and the option that keeps them. */
export function preserveConflict(
  target: string,
  conflicts: ReadonlyArray<UserEntry & { pkg: string }>,
): RunnerDepotError {
  const paths = conflicts.map((c) => `${c.pkg}/${c.path}`);
  const shown = conflicts
    .slice(0, 10)
    .map((c) => `${c.pkg}/${c.path} (${c.why === "changed" ? "changed since installed" : "not written by an install"})`)
    .join(", ");
  const more = conflicts.length > 10 ? ` and ${conflicts.length - 10} more` : "";
  return new RunnerDepotError(
    "CONFLICT",
    `the install would replace ${conflicts.length} file(s) in ${target} that it did not write or that changed since: ${shown}${more}; ` +
      `nothing was changed. Move them away, or install with preserve "renameold" to keep each as <path>.old`,
    { details: { paths, option: "preserve" } },
  );
}

/**
 * Performs the moves; returns the undo (moves back, newest first), which the installer
 * calls when a later step fails, so a user's file never stays behind in a staging
 * folder that is about to be deleted.
 */
export async function carryOver(moves: readonly CarryMove[]): Promise<() => Promise<void>> {
  const done: CarryMove[] = [];
  const undo = async () => {
    for (const move of done.reverse()) {
      await mkdir(path.dirname(move.from), { recursive: true });
      await rename(move.to, move.from);
    }
  };
  try {
    for (const move of moves) {
      await mkdir(path.dirname(move.to), { recursive: true });
      await rename(move.from, move.to);
      done.push(move);
    }
  } catch (error) {
    await undo();
    throw error;
  }
  return undo;
}
