/**
 * Property test of the installer's resolver (src/depot/install/resolve.ts) against its
 * recursive, quadratic predecessor (./depot-resolve-oracle.ts): on random small graphs
 * (cycles, self-requirements, missing packages, conflicting ranges, prereleases, build
 * metadata, a small `maxSteps`), both ask the source the same questions in the same order
 * and end the same way: the same packages in the same order with the same paths, or the
 * same error (code, message, details).
 */
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { resolveDependencies, type DependencySource } from "../../src/depot/install/resolve.js";
import { isRunnerDepotError } from "../../src/errors.js";
import { oldResolveDependencies } from "./depot-resolve-oracle.js";
import { fuzzParams, fuzzTimeout } from "./settings.js";

type Graph = Record<string, Record<string, Array<{ name: string; range: string }>>>;

const NAMES = ["app", "a", "b", "c", "d", "e"];
const VERSIONS = ["0.1.0", "1.0.0", "1.0.0+b", "1.1.0", "1.2.0-rc.1", "2.0.0", "2.0.0-rc.1", "3.0.0"];
const RANGES = [
  "*",
  "*",
  "*",
  "*",
  "",
  "^1",
  "^1",
  "^2",
  "~1.1.0",
  ">=1.1.0",
  "<2",
  "1.0.0",
  ">=2.0.0-rc.0",
  "^1 || ^3",
  "0.x",
];
const SPECS = ["app", "app", "app", "APP", "app@^1", "app@1.0.0", "app@2.0.0-rc.1", "a", "app@>=9"];

/** Requirements mostly of a later name (a DAG, deep enough), sometimes of any (cycles, self), rarely of "ghost". */
const requirement = (from: number) =>
  fc.record({
    name: fc.oneof(
      { weight: 8, arbitrary: fc.constantFrom(...(from + 1 < NAMES.length ? NAMES.slice(from + 1) : NAMES)) },
      { weight: 2, arbitrary: fc.constantFrom(...NAMES) },
      { weight: 1, arbitrary: fc.constant("ghost") },
    ),
    range: fc.constantFrom(...RANGES),
  });
const versionsOf = (from: number, minKeys: number) =>
  fc.dictionary(fc.constantFrom(...VERSIONS), fc.array(requirement(from), { maxLength: 3, size: "max" }), {
    minKeys,
    maxKeys: 4,
  });
/** `app` holds a version; each other name holds up to four, or (rarely) none or is absent. */
const graph: fc.Arbitrary<Graph> = fc
  .tuple(
    ...NAMES.map((_, i) =>
      i === 0
        ? versionsOf(i, 1)
        : fc.oneof({ weight: 8, arbitrary: versionsOf(i, 1) }, { weight: 1, arbitrary: fc.constantFrom(null, {}) }),
    ),
  )
  .map((lists) => Object.fromEntries(NAMES.flatMap((name, i) => (lists[i] ? [[name, lists[i]]] : []))));

/** The source over `graph`, writing every question to `calls`. */
function sourceOf(g: Graph, calls: string[]): DependencySource {
  return {
    async versions(name) {
      calls.push(`versions ${name}`);
      return Object.hasOwn(g, name) ? Object.keys(g[name]!) : null;
    },
    async requires(name, version) {
      calls.push(`requires ${name}@${version}`);
      return g[name]![version]!.map((r) => ({ ...r }));
    },
  };
}

/** How a resolution ended, as plain data, with the questions it asked. */
async function outcome(resolve: typeof resolveDependencies, g: Graph, spec: string, maxSteps?: number) {
  const calls: string[] = [];
  try {
    const r = await resolve(sourceOf(g, calls), spec, maxSteps === undefined ? {} : { maxSteps });
    const plain = (p: (typeof r.packages)[number]) => ({ ...p, path: [...p.path] });
    return { calls, root: plain(r.root), packages: r.packages.map(plain) };
  } catch (error) {
    if (!isRunnerDepotError(error)) throw error;
    return { calls, code: error.code, message: error.message, details: error.details, status: error.status };
  }
}

describe("resolveDependencies against its predecessor", () => {
  it(
    "resolves every random small graph as the recursive resolver did",
    async () => {
      const property = fc.asyncProperty(
        graph,
        fc.constantFrom(...SPECS),
        fc.option(fc.integer({ min: 1, max: 12 }), { nil: undefined }),
        async (g, spec, maxSteps) => {
          const before = await outcome(oldResolveDependencies, g, spec, maxSteps);
          const after = await outcome(resolveDependencies, g, spec, maxSteps);
          expect(after).toEqual(before);
        },
      );
      for (const params of fuzzParams("resolver vs oracle")) await fc.assert(property, params);
    },
    fuzzTimeout(180_000),
  );
});
