/**
 * The installer: resolves a package and its dependencies, stages every package in a
 * temporary directory (a delta applied onto a copy of the installed version, or a
 * whole archive), verifies each against its manifest, and only then swaps them all
 * into place. A failed install leaves the previous state.
 *
 * Layout: `<target>/<name>/` holds each package's files; `<target>/.runner-depot/`
 * holds `installed.json` (name → version, digest), the staging area and a lock.
 */
import { randomUUID } from "node:crypto";
import { createReadStream } from "node:fs";
import { cp, lstat, mkdir, open, readFile, rename, rm, writeFile } from "node:fs/promises";
import path from "node:path";
import semver from "semver";
import { RunnerDepotError, isRunnerDepotError } from "../errors.js";
import type { DepotClient, VersionEntry } from "./client.js";
import { digestToHex } from "./client-http.js";
import { extractPackage, verifyPackageTree } from "./extract.js";
import { isPackageName } from "./names.js";
import { emptyRecord, own, setOwn } from "./records.js";
import { resolveDependencies, type DependencySource } from "./resolve.js";

/** The installer's bookkeeping directory inside the target. */
export const STATE_DIR = ".runner-depot";

/** One installed package in `installed.json`. */
export interface InstalledEntry {
  version: string;
  digest: string;
  installedAt: string;
}

/** `<target>/.runner-depot/installed.json`. */
export interface InstalledState {
  packages: Record<string, InstalledEntry>;
}

/** Installer progress events. */
export type InstallProgress =
  | { phase: "resolved"; packages: Array<{ name: string; version: string }> }
  | { phase: "download"; name: string; version: string; from?: string; received: number; total?: number }
  | { phase: "fallback"; name: string; version: string; from: string; reason: string }
  | { phase: "staged"; name: string; version: string; via: "full" | "delta" }
  | { phase: "done" };

/** Options of {@link installPackage}. */
export interface InstallOptions {
  onProgress?: (event: InstallProgress) => void;
  /** Upgrade installed packages through deltas. Default true. */
  delta?: boolean;
  /** Reinstall packages already at the resolved version. Default false. */
  force?: boolean;
}

/** What happened to one package. */
export interface InstallAction {
  name: string;
  version: string;
  action: "installed" | "upgraded" | "downgraded" | "reinstalled" | "unchanged";
  from?: string;
  via?: "full" | "delta";
  /** Archive bytes downloaded for it. */
  bytes: number;
}

/** The outcome of an install. */
export interface InstallResult {
  root: { name: string; version: string };
  packages: InstallAction[];
}

/**
 * Reads `installed.json` under `targetDir` (empty when nothing is installed).
 *
 * @example
 * const { packages } = await readInstalled("./vendor");
 * console.log(packages["toolchain"]?.version);
 */
export async function readInstalled(targetDir: string): Promise<InstalledState> {
  try {
    const parsed = JSON.parse(await readFile(path.join(targetDir, STATE_DIR, "installed.json"), "utf8")) as InstalledState;
    // Null-prototype, so a package called `constructor` is looked up as itself.
    const packages = emptyRecord<InstalledEntry>();
    for (const [name, entry] of Object.entries(parsed.packages ?? {})) setOwn(packages, name, entry);
    return { packages };
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return { packages: emptyRecord() };
    throw error;
  }
}

async function acquireLock(stateDir: string): Promise<() => Promise<void>> {
  const lock = path.join(stateDir, "lock");
  for (let attempt = 0; ; attempt++) {
    try {
      const fh = await open(lock, "wx");
      await fh.writeFile(String(process.pid));
      await fh.close();
      return () => rm(lock, { force: true });
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "EEXIST" || attempt > 0) {
        throw new RunnerDepotError("CONFLICT", `another install holds ${lock}`, { cause: error });
      }
      // A lock left by a process that died is stale.
      const pid = Number((await readFile(lock, "utf8").catch(() => "")).trim());
      let alive = false;
      if (Number.isInteger(pid) && pid > 0) {
        try {
          process.kill(pid, 0);
          alive = true;
        } catch (e) {
          alive = (e as NodeJS.ErrnoException).code === "EPERM";
        }
      }
      if (alive) throw new RunnerDepotError("CONFLICT", `another install (pid ${pid}) holds ${lock}`);
      await rm(lock, { force: true });
    }
  }
}

interface Staged {
  name: string;
  version: string;
  digest: string;
  dir: string;
  action: InstallAction;
}

/**
 * Installs `spec` and its dependencies into `targetDir` through `client`.
 *
 * @example
 * const result = await installPackage(createDepotClient({ baseUrl }), "app@^2", "/opt/pkgs");
 * // /opt/pkgs/app, /opt/pkgs/<each dependency>, /opt/pkgs/.runner-depot/installed.json
 */
export async function installPackage(
  client: DepotClient,
  spec: string,
  targetDir: string,
  options: InstallOptions = {},
): Promise<InstallResult> {
  const target = path.resolve(targetDir);
  const stateDir = path.join(target, STATE_DIR);
  await mkdir(stateDir, { recursive: true });
  const release = await acquireLock(stateDir);
  const work = path.join(stateDir, `staging-${randomUUID()}`);
  await mkdir(work);
  const emit = options.onProgress ?? (() => undefined);
  try {
    const infos = new Map<string, Promise<Map<string, VersionEntry> | null>>();
    const versionInfo = (name: string) => {
      let p = infos.get(name);
      if (!p) {
        p = client.versions(name).then(
          (info) => new Map(info.versions.map((v) => [v.version, v])),
          (error: unknown) => {
            if (isRunnerDepotError(error) && error.status === 404) return null;
            throw error;
          },
        );
        infos.set(name, p);
      }
      return p;
    };
    const source: DependencySource = {
      versions: async (name) => {
        const map = await versionInfo(name);
        return map ? [...map.keys()] : null;
      },
      requires: async (name, version) => (await client.depends(`${name}@${version}`)).requires ?? [],
    };
    const resolution = await resolveDependencies(source, spec);
    emit({ phase: "resolved", packages: resolution.packages.map(({ name, version }) => ({ name, version })) });

    const installed = await readInstalled(target);
    const staged: Staged[] = [];
    const actions: InstallAction[] = [];
    for (const pkg of resolution.packages) {
      const entry = (await versionInfo(pkg.name))?.get(pkg.version);
      const expectedHex = entry?.digest ? digestToHex(entry.digest) : null;
      // The name becomes a directory under the target: never trust the depot with it.
      if (!isPackageName(pkg.name)) throw new RunnerDepotError("NAME_INVALID", `the depot named an invalid package ${JSON.stringify(pkg.name.slice(0, 80))}`);
      const current = own(installed.packages, pkg.name);
      const same = current && semver.eq(current.version, pkg.version) && digestToHex(current.digest) === expectedHex;
      if (same && !options.force) {
        actions.push({ name: pkg.name, version: pkg.version, action: "unchanged", bytes: 0 });
        continue;
      }
      const stageDir = path.join(work, pkg.name);
      const live = path.join(target, pkg.name);
      const action: InstallAction = {
        name: pkg.name,
        version: pkg.version,
        action: !current ? "installed" : same ? "reinstalled" : semver.gt(pkg.version, current.version) ? "upgraded" : "downgraded",
        ...(current && !same ? { from: current.version } : {}),
        bytes: 0,
      };
      let digest = "";
      let viaDelta = false;
      if (current && !same && options.delta !== false) {
        try {
          await cp(live, stageDir, { recursive: true, verbatimSymlinks: true, preserveTimestamps: true, errorOnExist: true, force: false });
          const file = path.join(work, `${pkg.name}.delta.tar`);
          const got = await client.download(`${pkg.name}@${pkg.version}`, {
            from: current.version,
            to: file,
            onProgress: (p) => emit({ phase: "download", name: pkg.name, version: pkg.version, from: current.version, received: p.received, total: p.total }),
          });
          action.bytes += got.size;
          await extractPackage(createReadStream(file), stageDir, {
            delta: true,
            expect: { name: pkg.name, version: pkg.version, from: current.version },
          });
          await rm(file, { force: true });
          // The delta holds only what changed: check the result against the full manifest.
          const full = await client.manifest(`${pkg.name}@${pkg.version}`);
          if (entry && typeof entry.itemCount === "number" && full.items.length !== entry.itemCount) {
            throw new RunnerDepotError("ARCHIVE_INVALID", `the manifest of ${pkg.name}@${pkg.version} lists ${full.items.length} items, /version says ${entry.itemCount}`);
          }
          await verifyPackageTree(stageDir, full.items, { prune: true });
          digest = entry?.digest ?? "";
          viaDelta = true;
        } catch (error) {
          // Local edits or a bad delta: fall back to the whole archive.
          emit({ phase: "fallback", name: pkg.name, version: pkg.version, from: current.version, reason: (error as Error).message });
          await rm(stageDir, { recursive: true, force: true });
        }
      }
      if (!viaDelta) {
        const file = path.join(work, `${pkg.name}.tar`);
        const got = await client.download(`${pkg.name}@${pkg.version}`, {
          to: file,
          onProgress: (p) => emit({ phase: "download", name: pkg.name, version: pkg.version, received: p.received, total: p.total }),
        });
        action.bytes += got.size;
        if (expectedHex && digestToHex(got.digest) !== expectedHex) {
          throw new RunnerDepotError("DIGEST_MISMATCH", `${pkg.name}@${pkg.version}: the archive is ${got.digest}, /version says ${entry!.digest}`);
        }
        await extractPackage(createReadStream(file), stageDir, { expect: { name: pkg.name, version: pkg.version } });
        await rm(file, { force: true });
        digest = got.digest;
      }
      action.via = viaDelta ? "delta" : "full";
      emit({ phase: "staged", name: pkg.name, version: pkg.version, via: action.via });
      staged.push({ name: pkg.name, version: pkg.version, digest, dir: stageDir, action });
      actions.push(action);
    }

    // Swap every staged package in; on a failure put back what was already moved.
    const swapped: Array<{ live: string; old: string | null }> = [];
    try {
      for (const s of staged) {
        const live = path.join(target, s.name);
        const old = (await exists(live)) ? path.join(work, `${s.name}.old`) : null;
        if (old) await rename(live, old);
        await rename(s.dir, live);
        swapped.push({ live, old });
      }
      const next: InstalledState = { packages: emptyRecord() };
      for (const [name, entry] of Object.entries(installed.packages)) setOwn(next.packages, name, entry);
      const now = new Date().toISOString();
      for (const s of staged) setOwn(next.packages, s.name, { version: s.version, digest: s.digest, installedAt: now });
      const tmp = path.join(stateDir, `installed.json.${randomUUID()}`);
      await writeFile(tmp, `${JSON.stringify(next, null, 2)}\n`);
      await rename(tmp, path.join(stateDir, "installed.json"));
    } catch (error) {
      for (const { live, old } of swapped.reverse()) {
        await rm(live, { recursive: true, force: true }).catch(() => undefined);
        if (old) await rename(old, live).catch(() => undefined);
      }
      throw error;
    }
    emit({ phase: "done" });
    return { root: { name: resolution.root.name, version: resolution.root.version }, packages: actions };
  } finally {
    await rm(work, { recursive: true, force: true }).catch(() => undefined);
    await release();
  }
}

async function exists(p: string): Promise<boolean> {
  try {
    await lstat(p);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code !== "ENOENT";
  }
}
