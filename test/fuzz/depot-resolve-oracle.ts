/**
 * The installer's resolver as it was before it was made linear (commit 89dff3b,
 * src/depot/install/resolve.ts, verbatim but for the imports, this header, and the spec parser and version filter,
 * which the rewrite kept and this file imports): the oracle
 * of test/fuzz/depot-resolve.test.ts. Recursive and quadratic, so only for small graphs.
 */
import semver from "semver";
import { RunnerDepotError } from "../../src/errors.js";
import { candidates, indexVersions, type VersionIndex } from "../../src/depot/install/candidates.js";
// Unchanged by the rewrite: shared, not copied.
import {
  parsePackageSpec,
  satisfyingVersions,
  type DependencySource,
  type Requirement,
  type ResolvedPackage,
} from "../../src/depot/install/resolve.js";

/** Options of {@link resolveDependencies}. */
interface ResolveOptions {
  /** Gives up (DEPENDENCY_CONFLICT) after this many candidate versions tried. Default 10,000. */
  maxSteps?: number;
}

/** The outcome: the root and every package to install, dependencies before dependents. */
interface Resolution {
  root: ResolvedPackage;
  packages: ResolvedPackage[];
}

interface Constraint {
  range: string;
  /** The requirer chain, root first, ending with the package that holds this range. */
  by: string[];
}

const NAME_RE = /^[a-z0-9][a-z0-9._-]{0,63}$/;
const at = (name: string, version: string) => `${name}@${version}`;
const chain = (by: string[]) => by.join(" → ");
const describe = (c: Constraint) => `${c.range} (required by ${chain(c.by)})`;

/**
 * Resolves `spec` (`name`, `name@version` or `name@range`) against `source`.
 * Throws DEPENDENCY_UNRESOLVED, DEPENDENCY_CONFLICT or DEPENDENCY_CYCLE with the
 * requirement paths in the message and in `details`.
 *
 * @example
 * const { packages } = await resolveDependencies(source, "app@^1.0.0");
 * for (const p of packages) console.log(p.name, p.version);
 */
export async function oldResolveDependencies(
  source: DependencySource,
  spec: string,
  options: ResolveOptions = {},
): Promise<Resolution> {
  const root = parsePackageSpec(spec);
  const maxSteps = options.maxSteps ?? 10_000;
  const versionCache = new Map<string, Promise<string[] | null>>();
  const indexCache = new Map<string, VersionIndex>();
  const requireCache = new Map<string, Promise<Requirement[]>>();
  const versionsOf = (name: string) => {
    let p = versionCache.get(name);
    if (!p) versionCache.set(name, (p = source.versions(name)));
    return p;
  };
  const requiresOf = (name: string, version: string) => {
    const key = at(name, version);
    let p = requireCache.get(key);
    if (!p) {
      p = source.requires(name, version).then((reqs) =>
        reqs.map((r) => {
          const range = r.range === "" ? "*" : r.range;
          if (semver.validRange(range) === null) {
            throw new RunnerDepotError(
              "RANGE_INVALID",
              `${key} requires ${r.name} with an invalid range ${JSON.stringify(range)}`,
            );
          }
          // The depot's answer is not trusted: a name becomes a directory of the install.
          if (typeof r.name !== "string" || !NAME_RE.test(r.name.toLowerCase())) {
            throw new RunnerDepotError(
              "NAME_INVALID",
              `${key} requires an invalid package name ${JSON.stringify(String(r.name).slice(0, 80))}`,
            );
          }
          return { name: r.name.toLowerCase(), range };
        }),
      );
      requireCache.set(key, p);
    }
    return p;
  };

  const chosen = new Map<string, ResolvedPackage>();
  const constraints = new Map<string, Constraint[]>([[root.name, [{ range: root.range, by: [] }]]]);
  const order: string[] = [root.name];
  let firstFailure: RunnerDepotError | null = null;
  let steps = 0;
  // Only the first failure is reported: later ones are not built (each lists every version).
  const fail = async (error: () => RunnerDepotError | Promise<RunnerDepotError>) => {
    firstFailure ??= await error();
    return false;
  };

  const unsatisfied = async (name: string, cs: Constraint[]): Promise<RunnerDepotError> => {
    const available = (await versionsOf(name)) ?? [];
    const details = { package: name, constraints: cs.map((c) => ({ range: c.range, path: c.by })), available };
    const list = available.length > 0 ? semver.sort([...available]).join(", ") : "none";
    if (cs.length === 1) {
      const c = cs[0]!;
      if (c.by.length === 0) {
        return new RunnerDepotError(
          "VERSION_NOT_FOUND",
          `no version of ${name} matches ${c.range}; available: ${list}`,
          {
            details,
          },
        );
      }
      const who = c.by.length > 0 ? ` (required by ${chain(c.by)})` : "";
      return new RunnerDepotError(
        "DEPENDENCY_UNRESOLVED",
        `no version of ${name} satisfies ${c.range}${who}; available: ${list}`,
        { details },
      );
    }
    // Ranges that each have a match but not a common one are a conflict.
    return new RunnerDepotError(
      "DEPENDENCY_CONFLICT",
      `no single version of ${name} satisfies ${cs.map(describe).join(" and ")}; available: ${list}`,
      { details },
    );
  };

  const solve = async (): Promise<boolean> => {
    const name = order.find((n) => !chosen.has(n) && (constraints.get(n)?.length ?? 0) > 0);
    if (name === undefined) return true;
    const cs = constraints.get(name)!;
    const all = await versionsOf(name);
    if (all === null || all.length === 0) {
      const c = cs[0]!;
      if (c.by.length === 0) {
        return fail(() => new RunnerDepotError("PACKAGE_NOT_FOUND", `package ${name} is not in the depot`));
      }
      const who = c.by.length > 0 ? ` (required as ${c.range} by ${chain(c.by)})` : "";
      return fail(
        () =>
          new RunnerDepotError("DEPENDENCY_UNRESOLVED", `package ${name} is not in the depot${who}`, {
            details: { package: name, constraints: cs.map((x) => ({ range: x.range, path: x.by })) },
          }),
      );
    }
    // Sorted once per package; each step then costs O(log versions), not O(versions).
    let index = indexCache.get(name);
    if (!index) indexCache.set(name, (index = indexVersions(all)));
    const ranges = cs.map((c) => c.range);
    const constraintsHere = [...cs];
    const pathTo = cs[0]!.by;
    let tried = 0;
    for (const version of candidates(index, ranges)) {
      tried++;
      if (++steps > maxSteps) {
        throw (
          firstFailure ??
          // The limit named as the resolver names it since 2026-12-02 (details.limit); otherwise as it was.
          new RunnerDepotError(
            "DEPENDENCY_CONFLICT",
            `gave up resolving ${spec} after ${maxSteps} candidate versions`,
            {
              details: { limit: "maxSteps" },
            },
          )
        );
      }
      const requires = await requiresOf(name, version);
      const here = [...pathTo, at(name, version)];
      let ok = true;
      for (const r of requires) {
        const other = chosen.get(r.name) ?? (r.name === name ? { version } : undefined);
        if (other && !satisfyingVersions([other.version], [r.range]).length) {
          const existing = [...(constraints.get(r.name) ?? [])];
          await fail(() => unsatisfied(r.name, [...existing, { range: r.range, by: here }]));
          ok = false;
          break;
        }
      }
      if (!ok) continue;
      chosen.set(name, { name, version, requires, path: here });
      const added: string[] = [];
      for (const r of requires) {
        if (!constraints.has(r.name)) constraints.set(r.name, []);
        constraints.get(r.name)!.push({ range: r.range, by: here });
        if (!order.includes(r.name)) {
          order.push(r.name);
          added.push(r.name);
        }
      }
      if (await solve()) return true;
      // Undo this choice and try the next older version.
      chosen.delete(name);
      for (const r of requires) constraints.get(r.name)!.pop();
      for (const n of added) {
        order.splice(order.indexOf(n), 1);
        if (constraints.get(n)!.length === 0) constraints.delete(n);
      }
    }
    if (tried === 0) return fail(() => unsatisfied(name, constraintsHere));
    return false;
  };

  if (!(await solve())) {
    throw firstFailure ?? new RunnerDepotError("DEPENDENCY_CONFLICT", `cannot resolve ${spec}`);
  }

  // A cycle in the chosen graph is refused: there is no order to install it in.
  const packages: ResolvedPackage[] = [];
  const state = new Map<string, "visiting" | "done">();
  const visit = (name: string, trail: string[]) => {
    const pkg = chosen.get(name)!;
    const mark = state.get(name);
    if (mark === "done") return;
    const label = at(pkg.name, pkg.version);
    if (mark === "visiting") {
      const start = trail.indexOf(label);
      const cycle = [...trail.slice(start), label];
      throw new RunnerDepotError("DEPENDENCY_CYCLE", `dependency cycle: ${cycle.join(" → ")}`, {
        details: { cycle },
      });
    }
    state.set(name, "visiting");
    for (const r of pkg.requires) visit(r.name, [...trail, label]);
    state.set(name, "done");
    packages.push(pkg);
  };
  visit(root.name, []);
  return { root: chosen.get(root.name)!, packages };
}
