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
import { RunnerDepotError, isRunnerDepotError } from "../../errors.js";
import type { DepotClient, VersionEntry } from "../client/types.js";
import { digestToHex } from "../client/http.js";
import { extractPackage } from "./extract.js";
import { verifyPackageTree } from "./verify-tree.js";
import { isPackageName } from "../package/names.js";
import { emptyRecord, own, setOwn } from "../store/records.js";
import { checkResolveOptions, parsePackageSpec, resolveDependencies, type DependencySource } from "./resolve.js";
import {
  carryOver,
  findUserEntries,
  planPreserve,
  preserveConflict,
  readInstallRecord,
  recordItems,
  writeInstallRecord,
  type PreserveMode,
  type PreservePlan,
  type RecordItem,
  type UserEntry,
} from "./preserve.js";
import type { InstallAction, InstallOptions, InstallResult } from "./types.js";
import { loadPolicy, verifyVersion, type LoadedPolicy } from "../signing/verify.js";

export type { InstallAction, InstallOptions, InstallProgress, InstallResult } from "./types.js";

/** The installer's bookkeeping directory inside the target. */
const STATE_DIR = ".runner-depot";

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

/**
 * Reads `installed.json` under `targetDir` (empty when nothing is installed).
 *
 * @example
 * const { packages } = await readInstalled("./vendor");
 * console.log(packages["toolchain"]?.version);
 */
export async function readInstalled(targetDir: string): Promise<InstalledState> {
  try {
    const parsed = JSON.parse(
      await readFile(path.join(targetDir, STATE_DIR, "installed.json"), "utf8"),
    ) as InstalledState;
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
  /** What extraction wrote: becomes the package's install record. */
  items: RecordItem[];
  /** The live folder's entries the previous record does not vouch for. */
  userEntries: UserEntry[];
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
  if (options.resolveLimits) checkResolveOptions(options.resolveLimits);
  const target = path.resolve(targetDir);
  const stateDir = path.join(target, STATE_DIR);
  await mkdir(stateDir, { recursive: true });
  const release = await acquireLock(stateDir);
  const work = path.join(stateDir, `staging-${randomUUID()}`);
  await mkdir(work);
  const emit = options.onProgress ?? (() => undefined);
  let keepWork = false;
  // Parsed before anything is downloaded: a bad key file fails the install at once.
  const policy = options.signatures ? loadPolicy(options.signatures) : null;
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
    // Yanked versions take no part in resolution, except the one the root spec names exactly.
    const asked = parsePackageSpec(spec);
    const source: DependencySource = {
      versions: async (name) => {
        const map = await versionInfo(name);
        if (!map) return null;
        return [...map.values()]
          .filter((v) => !v.yanked || (asked.exact && asked.name === name && asked.range === v.version))
          .map((v) => v.version);
      },
      requires: async (name, version) => (await client.depends(`${name}@${version}`)).requires ?? [],
    };
    const resolution = await resolveDependencies(source, spec, options.resolveLimits);
    emit({ phase: "resolved", packages: resolution.packages.map(({ name, version }) => ({ name, version })) });

    const installed = await readInstalled(target);
    const staged: Staged[] = [];
    const actions: InstallAction[] = [];
    for (const pkg of resolution.packages) {
      const entry = (await versionInfo(pkg.name))?.get(pkg.version);
      const expectedHex = entry?.digest ? digestToHex(entry.digest) : null;
      // The name becomes a directory under the target: never trust the depot with it.
      if (!isPackageName(pkg.name))
        throw new RunnerDepotError(
          "NAME_INVALID",
          `the depot named an invalid package ${JSON.stringify(pkg.name.slice(0, 80))}`,
        );
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
        action: !current
          ? "installed"
          : same
            ? "reinstalled"
            : semver.gt(pkg.version, current.version)
              ? "upgraded"
              : "downgraded",
        ...(current && !same ? { from: current.version } : {}),
        bytes: 0,
      };
      // What the last install wrote here; an install by an older runner-depot kept no
      // record, so the installed version's manifest stands in for it.
      const record = await readInstallRecord(stateDir, pkg.name);
      let vouched = record?.items ?? null;
      if (!record && current) {
        vouched = await client.manifest(`${pkg.name}@${current.version}`).then(
          (m) => recordItems(m.items),
          () => null,
        );
      }
      const userEntries = await findUserEntries(live, vouched);
      let digest = "";
      let items: RecordItem[] = [];
      let viaDelta = false;
      if (current && !same && options.delta !== false) {
        try {
          await cp(live, stageDir, {
            recursive: true,
            verbatimSymlinks: true,
            preserveTimestamps: true,
            errorOnExist: true,
            force: false,
          });
          // The delta applies to what the install wrote; the user's entries are carried over later.
          for (const entry of userEntries) await rm(path.join(stageDir, entry.path), { recursive: true, force: true });
          const file = path.join(work, `${pkg.name}.delta.tar`);
          const got = await client.download(`${pkg.name}@${pkg.version}`, {
            from: current.version,
            to: file,
            // Nothing announces a delta's size: it holds at most the new version's bytes and its removals.
            ...(typeof entry?.size === "number" ? { maxBytes: entry.size + 64 * 2 ** 20 } : {}),
            onProgress: (p) =>
              emit({
                phase: "download",
                name: pkg.name,
                version: pkg.version,
                from: current.version,
                received: p.received,
                total: p.total,
              }),
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
            throw new RunnerDepotError(
              "ARCHIVE_INVALID",
              `the manifest of ${pkg.name}@${pkg.version} lists ${full.items.length} items, /version says ${entry.itemCount}`,
            );
          }
          await verifyPackageTree(stageDir, full.items, { prune: true });
          items = recordItems(full.items);
          digest = entry?.digest ?? "";
          viaDelta = true;
        } catch (error) {
          // Local edits or a bad delta: fall back to the whole archive.
          emit({
            phase: "fallback",
            name: pkg.name,
            version: pkg.version,
            from: current.version,
            reason: (error as Error).message,
          });
          await rm(stageDir, { recursive: true, force: true });
        }
      }
      if (!viaDelta) {
        const file = path.join(work, `${pkg.name}.tar`);
        const got = await client.download(`${pkg.name}@${pkg.version}`, {
          to: file,
          // /version announced the size: not a byte past it is written.
          ...(typeof entry?.size === "number" ? { expectedSize: entry.size } : {}),
          onProgress: (p) =>
            emit({ phase: "download", name: pkg.name, version: pkg.version, received: p.received, total: p.total }),
        });
        action.bytes += got.size;
        if (expectedHex && digestToHex(got.digest) !== expectedHex) {
          throw new RunnerDepotError(
            "DIGEST_MISMATCH",
            `${pkg.name}@${pkg.version}: the archive is ${got.digest}, /version says ${entry!.digest}`,
          );
        }
        const manifest = await extractPackage(createReadStream(file), stageDir, {
          expect: { name: pkg.name, version: pkg.version },
        });
        await rm(file, { force: true });
        items = recordItems(manifest.items);
        digest = got.digest;
      }
      action.via = viaDelta ? "delta" : "full";
      if (policy && policy.policy !== "ignore") await checkSignatures(client, policy, pkg, digest, items, action);
      emit({ phase: "staged", name: pkg.name, version: pkg.version, via: action.via });
      staged.push({ name: pkg.name, version: pkg.version, digest, dir: stageDir, action, items, userEntries });
      actions.push(action);
    }

    const plans = await planAll(target, staged, options.preserve ?? "refuse");
    await swapIn(target, stateDir, work, installed, staged, plans);
    emit({ phase: "done" });
    return { root: { name: resolution.root.name, version: resolution.root.version }, packages: actions };
  } catch (error) {
    keepWork = isRunnerDepotError(error) && typeof error.details.keep === "string";
    throw error;
  } finally {
    if (!keepWork) await rm(work, { recursive: true, force: true }).catch(() => undefined);
    await release();
  }
}

/**
 * Checks a staged package's attestations under the install's policy: the staged files'
 * digests (checked against the manifest as they were written) and the archive's digest
 * against what was signed. Throws the refusal; records what held on `action`. O(items).
 */
async function checkSignatures(
  client: DepotClient,
  policy: LoadedPolicy,
  pkg: { name: string; version: string },
  digest: string,
  items: readonly RecordItem[],
  action: InstallAction,
): Promise<void> {
  const content = {
    name: pkg.name,
    version: pkg.version,
    digest,
    files: items.flatMap((item) =>
      item.type === "file" && item.sha256 ? [{ path: item.path, digest: `sha256:${item.sha256}` }] : [],
    ),
  };
  const list = await client.attestations(`${pkg.name}@${pkg.version}`);
  const held = verifyVersion(
    content,
    list.attestations.map((a) => a.bundle),
    policy,
  );
  action.verified = held.map((a) => ({
    keyId: a.keyId,
    ...(a.keyName !== undefined ? { keyName: a.keyName } : {}),
    predicateType: a.predicateType,
    ...(a.builderId !== undefined ? { builderId: a.builderId } : {}),
  }));
}

/** Decides where every user entry goes, for all packages, before anything moves; refuses on conflicts. */
async function planAll(
  target: string,
  staged: readonly Staged[],
  mode: PreserveMode,
): Promise<Map<Staged, PreservePlan>> {
  const plans = new Map<Staged, PreservePlan>();
  const conflicts: Array<UserEntry & { pkg: string }> = [];
  for (const s of staged) {
    const plan = await planPreserve(path.join(target, s.name), s.dir, s.userEntries, mode);
    plans.set(s, plan);
    conflicts.push(...plan.conflicts.map((c) => ({ ...c, pkg: s.name })));
    s.action.kept = plan.moves.map((m) => `${s.name}/${path.relative(s.dir, m.to).split(path.sep).join("/")}`);
  }
  if (conflicts.length > 0) throw preserveConflict(target, conflicts);
  return plans;
}

/**
 * Carries the user's entries into the staged folders, swaps every staged package in,
 * then writes the records and installed.json. On a failure everything moves back —
 * the user's entries to where they were — before the staging area is deleted.
 */
async function swapIn(
  target: string,
  stateDir: string,
  work: string,
  installed: InstalledState,
  staged: readonly Staged[],
  plans: Map<Staged, PreservePlan>,
): Promise<void> {
  const undos: Array<() => Promise<void>> = [];
  const swapped: Array<{ live: string; old: string | null; dir: string }> = [];
  try {
    for (const s of staged) undos.push(await carryOver(plans.get(s)!.moves));
    for (const s of staged) {
      const live = path.join(target, s.name);
      const old = (await exists(live)) ? path.join(work, `${s.name}.old`) : null;
      if (old) await rename(live, old);
      await rename(s.dir, live);
      swapped.push({ live, old, dir: s.dir });
    }
    for (const s of staged) await writeInstallRecord(stateDir, { name: s.name, version: s.version, items: s.items });
    const next: InstalledState = { packages: emptyRecord() };
    for (const [name, entry] of Object.entries(installed.packages)) setOwn(next.packages, name, entry);
    const now = new Date().toISOString();
    for (const s of staged) setOwn(next.packages, s.name, { version: s.version, digest: s.digest, installedAt: now });
    const tmp = path.join(stateDir, `installed.json.${randomUUID()}`);
    await writeFile(tmp, `${JSON.stringify(next, null, 2)}\n`);
    await rename(tmp, path.join(stateDir, "installed.json"));
  } catch (error) {
    try {
      for (const { live, old, dir } of swapped.reverse()) {
        await rename(live, dir);
        if (old) await rename(old, live);
      }
      for (const undo of undos.reverse()) await undo();
    } catch (rollback) {
      // The user's entries may sit in the staging area: keep it rather than delete them.
      throw new RunnerDepotError(
        "INTERNAL",
        `the install failed (${(error as Error).message}) and so did putting things back (${(rollback as Error).message}); nothing was deleted: see ${work}`,
        {
          cause: error,
          details: { keep: work },
        },
      );
    }
    throw error;
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
