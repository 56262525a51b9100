/**
 * Dependency resolution for the installer: one version per package name (a flat
 * install), the newest version that satisfies every range in the whole graph,
 * found by a depth-first search that backtracks to older versions when a newer one
 * leads to a conflict. Conflicts, cycles and unknown packages are reported with the
 * path of requirements that led to them.
 *
 * Cost, against a depot that says anything: O(candidate versions tried + requirements
 * examined), both bounded (`maxSteps`, `maxRequirements`), plus the window scans of
 * candidates.ts. The search and the install order walk explicit stacks (no recursion,
 * so any depth), the names still to choose sit in an array indexed by a Set, and a
 * requirer chain is a linked list shared with its requirer's (O(1) to extend, spelled
 * out only for an error or a `path` read). Before, one answer of 80,000 requirements
 * took 5–9 s in array scans, and a chain of 9,000 packages overflowed the call stack.
 */
import semver from "semver";
import { RunnerDepotError } from "../../errors.js";
import { candidates, indexVersions, type VersionIndex } from "./candidates.js";

/** One `requires` entry of a package version. */
export interface Requirement {
  name: string;
  range: string;
}

/** Where the resolver learns versions and requirements (the depot client, or a fixture in tests). */
export interface DependencySource {
  /** Every committed version of `name`, or null when the depot does not hold it. */
  versions(name: string): Promise<string[] | null>;
  /** The requirements of one version. */
  requires(name: string, version: string): Promise<Requirement[]>;
}

/** A package the resolver chose. */
export interface ResolvedPackage {
  name: string;
  version: string;
  requires: Requirement[];
  /** The chain from the root that first required it, e.g. `["app@1.0.0", "lib@2.1.0"]`. */
  path: string[];
}

/** How much work resolving an install's dependencies may take (`InstallOptions.resolveLimits`). */
export interface ResolveOptions {
  /** Gives up (DEPENDENCY_CONFLICT) after this many candidate versions tried. Default 10,000. */
  maxSteps?: number;
  /**
   * Gives up (DEPENDENCY_CONFLICT) after this many requirements examined in all: each
   * package opened counts the ranges it must satisfy, each candidate version tried the
   * requirements it lists plus the ranges it was checked against. It bounds the work of
   * the depot's answers as `maxSteps` bounds the tries: one 32 MiB `/depend` answer can
   * list a million requirements, each range parsed (10–30 µs when they all differ). An
   * answer listing more is refused before it is checked. Default 200,000: 10,000 packages
   * (`maxSteps`) of 9 requirements each fit; refusing a hostile answer takes seconds.
   */
  maxRequirements?: number;
}

/** The outcome: the root and every package to install, dependencies before dependents. */
interface Resolution {
  root: ResolvedPackage;
  packages: ResolvedPackage[];
}

/** A requirer chain, last link first: each shares its requirer's chain, so extending one is O(1). */
interface Trail {
  readonly label: string;
  readonly up: Trail | null;
}

interface Constraint {
  range: string;
  /** The requirer chain, ending with the package that holds this range; null for the root spec. */
  by: Trail | null;
}

/** One package being chosen: the search's explicit stack holds one per name of `order` chosen so far. */
interface Frame {
  name: string;
  /** Its constraints when opened, for the error when no version satisfies them. */
  constraints: Constraint[];
  /** The chain of its first requirer. */
  trail: Trail | null;
  versions: Iterator<string>;
  /** How many distinct ranges each candidate is checked against. */
  ranges: number;
  tried: number;
  /** The version chosen now: its requirements, and how many names it appended to `order`. */
  choice: { requires: Requirement[]; added: number } | null;
}

/** Splits `name`, `name@version` or `name@range` into a name and a range (`*` when absent). */
export function parsePackageSpec(spec: string): { name: string; range: string; exact: boolean } {
  const text = spec.trim();
  const at = text.indexOf("@", 1);
  const name = (at < 0 ? text : text.slice(0, at)).toLowerCase();
  const rest = at < 0 ? "" : text.slice(at + 1).trim();
  if (!NAME_RE.test(name)) {
    throw new RunnerDepotError("NAME_INVALID", `not a package name: ${JSON.stringify(spec)}`);
  }
  if (rest === "" || rest === "latest") return { name, range: "*", exact: false };
  if (semver.valid(rest)) return { name, range: rest, exact: true };
  if (semver.validRange(rest) === null) {
    throw new RunnerDepotError("RANGE_INVALID", `not a version or SemVer range: ${JSON.stringify(rest)} in ${spec}`);
  }
  return { name, range: rest, exact: false };
}

/**
 * The versions satisfying every range, newest first. Prereleases take part only when
 * no release satisfies (the depot's "newest" rule); build metadata never separates.
 */
export function satisfyingVersions(versions: readonly string[], ranges: readonly string[]): string[] {
  const valid = [...new Set(versions.filter((v) => semver.valid(v) !== null))];
  const pick = (includePrerelease: boolean) =>
    semver.rsort(valid.filter((v) => ranges.every((r) => semver.satisfies(v, r, { includePrerelease }))));
  const releases = pick(false);
  return releases.length > 0 ? releases : pick(true);
}

const NAME_RE = /^[a-z0-9][a-z0-9._-]{0,63}$/;
const at = (name: string, version: string) => `${name}@${version}`;
/** The labels of a chain, root first: O(its length). */
const spell = (trail: Trail | null): string[] => {
  const out: string[] = [];
  for (let t = trail; t !== null; t = t.up) out.push(t.label);
  return out.reverse();
};
const chain = (by: Trail | null) => spell(by).join(" → ");
const describe = (c: Constraint) => `${c.range} (required by ${chain(c.by)})`;
const paths = (cs: Constraint[]) => cs.map((c) => ({ range: c.range, path: spell(c.by) }));

/**
 * Resolves `spec` (`name`, `name@version` or `name@range`) against `source`.
 * Throws DEPENDENCY_UNRESOLVED, DEPENDENCY_CONFLICT or DEPENDENCY_CYCLE with the
 * requirement paths in the message and in `details`.
 *
 * @example
 * const { packages } = await resolveDependencies(source, "app@^1.0.0");
 * for (const p of packages) console.log(p.name, p.version);
 */
export async function resolveDependencies(
  source: DependencySource,
  spec: string,
  options: ResolveOptions = {},
): Promise<Resolution> {
  const root = parsePackageSpec(spec);
  const search = new Search(source, spec, root, options);
  if (!(await search.run())) {
    throw search.firstFailure ?? new RunnerDepotError("DEPENDENCY_CONFLICT", `cannot resolve ${spec}`);
  }
  return { root: search.chosen.get(root.name)!, packages: installOrder(search.chosen, root.name) };
}

/**
 * Checks the limits of {@link ResolveOptions} (INVALID_ARGUMENT unless each given one is a positive integer), so an
 * install refuses them before it takes its lock. O(1).
 *
 * @example
 * checkResolveOptions({ maxSteps: 50_000 });
 */
export function checkResolveOptions(options: ResolveOptions): void {
  limitOf("maxSteps", options.maxSteps, 1);
  limitOf("maxRequirements", options.maxRequirements, 1);
}

/** A limit of {@link ResolveOptions}: a positive safe integer (NaN would never stop the search), else `fallback`. */
function limitOf(name: string, value: number | undefined, fallback: number): number {
  if (value === undefined) return fallback;
  if (!Number.isSafeInteger(value) || value < 1)
    throw new RunnerDepotError("INVALID_ARGUMENT", `${name} must be a positive integer, got ${String(value)}`);
  return value;
}

/** The backtracking search: its state, and the steps that change it. */
class Search {
  readonly chosen = new Map<string, ResolvedPackage>();
  /** Only the first failure is reported: later ones are not built (each lists every version). */
  firstFailure: RunnerDepotError | null = null;
  private readonly constraints = new Map<string, Constraint[]>();
  /** Names to choose, in the order first required: the first `frames.length` are the chosen ones. */
  private readonly order: string[];
  private readonly inOrder: Set<string>;
  private readonly versionCache = new Map<string, Promise<string[] | null>>();
  private readonly indexCache = new Map<string, VersionIndex>();
  private readonly answers = new Map<string, Promise<Requirement[]>>();
  private readonly checked = new Map<string, Requirement[]>();
  private readonly maxSteps: number;
  private readonly maxRequirements: number;
  private steps = 0;
  private examined = 0;

  constructor(
    private readonly source: DependencySource,
    private readonly spec: string,
    root: { name: string; range: string },
    options: ResolveOptions,
  ) {
    this.maxSteps = limitOf("maxSteps", options.maxSteps, 10_000);
    this.maxRequirements = limitOf("maxRequirements", options.maxRequirements, 200_000);
    this.constraints.set(root.name, [{ range: root.range, by: null }]);
    this.order = [root.name];
    this.inOrder = new Set(this.order);
  }

  /**
   * True when every name required is chosen. Depth-first with an explicit stack: open the next
   * name to choose, choose the top frame's next candidate, and pop a frame out of candidates so
   * that the one below undoes its choice and tries its next. Finding the next name is O(1).
   */
  async run(): Promise<boolean> {
    const frames: Frame[] = [];
    for (;;) {
      if (frames.length === this.order.length) return true;
      const opened = await this.open(this.order[frames.length]!);
      if (opened) frames.push(opened);
      for (;;) {
        const top = frames.at(-1);
        if (top === undefined) return false;
        this.undo(top);
        if (await this.advance(top)) break;
        frames.pop();
      }
    }
  }

  /** A frame for `name`, or null (the failure recorded) when the depot holds no version of it. O(its constraints). */
  private async open(name: string): Promise<Frame | null> {
    const cs = this.constraints.get(name)!;
    const all = await this.versionsOf(name);
    if (all === null || all.length === 0) {
      await this.fail(() => notInDepot(name, cs));
      return null;
    }
    // Sorted once per package; each step then costs O(log versions), not O(versions).
    let index = this.indexCache.get(name);
    if (!index) this.indexCache.set(name, (index = indexVersions(all)));
    this.spend(cs.length); // the copy below, and the Set
    // Duplicate ranges change nothing but the time each candidate's check takes.
    const ranges = [...new Set(cs.map((c) => c.range))];
    const versions = candidates(index, ranges);
    return { name, constraints: [...cs], trail: cs[0]!.by, versions, ranges: ranges.length, tried: 0, choice: null };
  }

  /** Chooses the frame's next candidate that no chosen version rejects; false when none is left. */
  private async advance(frame: Frame): Promise<boolean> {
    const { name } = frame;
    for (let next = frame.versions.next(); next.done !== true; next = frame.versions.next()) {
      const version = next.value;
      frame.tried++;
      if (++this.steps > this.maxSteps) throw this.giveUp(`${this.maxSteps} candidate versions`, "maxSteps");
      const requires = await this.requiresOf(name, version, frame.ranges);
      const here: Trail = { label: at(name, version), up: frame.trail };
      if (await this.rejects(name, version, requires, here)) continue;
      this.choose(frame, version, requires, here);
      return true;
    }
    if (frame.tried === 0) await this.fail(() => this.unsatisfied(name, frame.constraints));
    return false;
  }

  /** Whether a requirement of name@version rejects a version chosen (the first such failure recorded). O(requirements). */
  private async rejects(name: string, version: string, requires: Requirement[], here: Trail): Promise<boolean> {
    for (const r of requires) {
      const other = this.chosen.get(r.name) ?? (r.name === name ? { version } : undefined);
      if (other && !satisfyingVersions([other.version], [r.range]).length) {
        const withThis = () => [...(this.constraints.get(r.name) ?? []), { range: r.range, by: here }];
        await this.fail(() => this.unsatisfied(r.name, withThis()));
        return true;
      }
    }
    return false;
  }

  /** Records the choice: its constraints pushed, names new to `order` appended. O(requirements). */
  private choose(frame: Frame, version: string, requires: Requirement[], here: Trail): void {
    this.chosen.set(frame.name, resolvedPackage(frame.name, version, requires, here));
    let added = 0;
    for (const r of requires) {
      let cs = this.constraints.get(r.name);
      if (!cs) this.constraints.set(r.name, (cs = []));
      cs.push({ range: r.range, by: here });
      if (!this.inOrder.has(r.name)) {
        this.inOrder.add(r.name);
        this.order.push(r.name);
        added++;
      }
    }
    frame.choice = { requires, added };
  }

  /** Undoes the frame's choice, if any. O(its requirements). */
  private undo(frame: Frame): void {
    const choice = frame.choice;
    if (choice === null) return;
    frame.choice = null;
    this.chosen.delete(frame.name);
    for (const r of choice.requires) this.constraints.get(r.name)!.pop();
    // The names it added end `order`: the frames above it are gone, their own additions undone.
    for (const n of this.order.splice(this.order.length - choice.added)) {
      this.inOrder.delete(n);
      if (this.constraints.get(n)!.length === 0) this.constraints.delete(n);
    }
  }

  private versionsOf(name: string): Promise<string[] | null> {
    let p = this.versionCache.get(name);
    if (!p) this.versionCache.set(name, (p = this.source.versions(name)));
    return p;
  }

  /** The requirements of name@version, counted (with the `ranges` it was checked against) before they are checked once. */
  private async requiresOf(name: string, version: string, ranges: number): Promise<Requirement[]> {
    const key = at(name, version);
    let answer = this.answers.get(key);
    if (!answer) this.answers.set(key, (answer = this.source.requires(name, version)));
    const listed = await answer;
    this.spend(listed.length + ranges);
    let requires = this.checked.get(key);
    if (!requires) this.checked.set(key, (requires = checkRequirements(key, listed)));
    return requires;
  }

  /** Counts `n` requirements examined; past `maxRequirements` the search gives up. */
  private spend(n: number): void {
    this.examined += n;
    if (this.examined > this.maxRequirements)
      throw this.giveUp(`examining ${this.maxRequirements} requirements`, "maxRequirements");
  }

  /** The first real failure met, else a give-up naming the limit reached (`details.limit`, a ResolveOptions key). */
  private giveUp(after: string, limit: keyof ResolveOptions): RunnerDepotError {
    return (
      this.firstFailure ??
      new RunnerDepotError("DEPENDENCY_CONFLICT", `gave up resolving ${this.spec} after ${after}`, {
        details: { limit },
      })
    );
  }

  private async fail(error: () => RunnerDepotError | Promise<RunnerDepotError>): Promise<void> {
    this.firstFailure ??= await error();
  }

  private async unsatisfied(name: string, cs: Constraint[]): Promise<RunnerDepotError> {
    return unsatisfiedError(name, cs, (await this.versionsOf(name)) ?? []);
  }
}

/** The depot's requirements, lower-cased and checked: the answer is not trusted, a name becomes a directory. */
function checkRequirements(key: string, listed: Requirement[]): Requirement[] {
  return listed.map((r) => {
    const range = r.range === "" ? "*" : r.range;
    if (semver.validRange(range) === null) {
      throw new RunnerDepotError(
        "RANGE_INVALID",
        `${key} requires ${r.name} with an invalid range ${JSON.stringify(range)}`,
      );
    }
    if (typeof r.name !== "string" || !NAME_RE.test(r.name.toLowerCase())) {
      throw new RunnerDepotError(
        "NAME_INVALID",
        `${key} requires an invalid package name ${JSON.stringify(String(r.name).slice(0, 80))}`,
      );
    }
    return { name: r.name.toLowerCase(), range };
  });
}

/** A chosen package whose `path` is spelled on first read (O(depth)), not for each one up front (O(depth²) on a chain). */
function resolvedPackage(name: string, version: string, requires: Requirement[], trail: Trail): ResolvedPackage {
  let path: string[] | undefined;
  return Object.defineProperty({ name, version, requires } as ResolvedPackage, "path", {
    enumerable: true,
    configurable: true,
    get: () => (path ??= spell(trail)),
    set: (value: string[]) => (path = value),
  });
}

function notInDepot(name: string, cs: Constraint[]): RunnerDepotError {
  const c = cs[0]!;
  if (c.by === null) return new RunnerDepotError("PACKAGE_NOT_FOUND", `package ${name} is not in the depot`);
  return new RunnerDepotError(
    "DEPENDENCY_UNRESOLVED",
    `package ${name} is not in the depot (required as ${c.range} by ${chain(c.by)})`,
    { details: { package: name, constraints: paths(cs) } },
  );
}

function unsatisfiedError(name: string, cs: Constraint[], available: string[]): RunnerDepotError {
  const details = { package: name, constraints: paths(cs), available };
  const list = available.length > 0 ? semver.sort([...available]).join(", ") : "none";
  if (cs.length === 1) {
    const c = cs[0]!;
    if (c.by === null) {
      return new RunnerDepotError("VERSION_NOT_FOUND", `no version of ${name} matches ${c.range}; available: ${list}`, {
        details,
      });
    }
    return new RunnerDepotError(
      "DEPENDENCY_UNRESOLVED",
      `no version of ${name} satisfies ${c.range} (required by ${chain(c.by)}); available: ${list}`,
      { details },
    );
  }
  // Ranges that each have a match but not a common one are a conflict.
  return new RunnerDepotError(
    "DEPENDENCY_CONFLICT",
    `no single version of ${name} satisfies ${cs.map(describe).join(" and ")}; available: ${list}`,
    { details },
  );
}

/**
 * The chosen packages, dependencies before dependents: a depth-first post-order from the
 * root in requirement order, refusing a cycle (there is no order to install it in). An
 * explicit stack, so any depth: O(packages + their requirements); the stack is the trail,
 * and `state` tells a package on it (a cycle) from one done.
 */
function installOrder(chosen: Map<string, ResolvedPackage>, rootName: string): ResolvedPackage[] {
  const packages: ResolvedPackage[] = [];
  const state = new Map<string, "visiting" | "done">();
  const stack: Array<{ pkg: ResolvedPackage; next: number }> = [];
  const enter = (name: string) => {
    const pkg = chosen.get(name)!;
    const mark = state.get(name);
    if (mark === "done") return;
    if (mark === "visiting")
      throw cycleError(
        stack.map((f) => f.pkg),
        pkg,
      );
    state.set(name, "visiting");
    stack.push({ pkg, next: 0 });
  };
  enter(rootName);
  while (stack.length > 0) {
    const top = stack.at(-1)!;
    if (top.next < top.pkg.requires.length) {
      enter(top.pkg.requires[top.next++]!.name);
      continue;
    }
    state.set(top.pkg.name, "done");
    packages.push(top.pkg);
    stack.pop();
  }
  return packages;
}

/** The cycle closed by requiring `pkg` again, from where it is on `trail`. */
function cycleError(trail: ResolvedPackage[], pkg: ResolvedPackage): RunnerDepotError {
  const labels = trail.slice(trail.indexOf(pkg)).map((p) => at(p.name, p.version));
  const cycle = [...labels, at(pkg.name, pkg.version)];
  return new RunnerDepotError("DEPENDENCY_CYCLE", `dependency cycle: ${cycle.join(" → ")}`, {
    details: { cycle },
  });
}
