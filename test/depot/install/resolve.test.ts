import { describe, expect, it } from "vitest";
import {
  parsePackageSpec,
  resolveDependencies,
  satisfyingVersions,
  type DependencySource,
} from "../../../src/depot/install/resolve.js";
import { failure } from "../../fixtures/errors.js";

/** A depot described as `{ name: { version: { dep: range } } }`; counts lookups. */
function fixture(graph: Record<string, Record<string, Record<string, string>>>) {
  const calls: string[] = [];
  const source: DependencySource = {
    async versions(name) {
      calls.push(`versions ${name}`);
      return graph[name] ? Object.keys(graph[name]!) : null;
    },
    async requires(name, version) {
      calls.push(`requires ${name}@${version}`);
      return Object.entries(graph[name]![version]!).map(([n, range]) => ({ name: n, range }));
    },
  };
  return { source, calls };
}

const pick = (r: { packages: Array<{ name: string; version: string }> }) =>
  Object.fromEntries(r.packages.map((p) => [p.name, p.version]));

describe("resolveDependencies", () => {
  it("chooses the newest version that satisfies every range in the graph, dependencies first", async () => {
    const { source } = fixture({
      app: { "1.0.0": { a: "^1.0.0", b: "^1.0.0" }, "2.0.0-rc.1": { a: "^9" } },
      a: { "1.0.0": {}, "1.2.0": { c: "^1.0.0" }, "2.0.0": {} },
      b: { "1.0.0": { c: "~1.1.0" } },
      c: { "1.0.0": {}, "1.1.0": {}, "1.1.5": {}, "1.3.0": {} },
    });
    const r = await resolveDependencies(source, "app");
    expect(pick(r)).toEqual({ app: "1.0.0", a: "1.2.0", b: "1.0.0", c: "1.1.5" });
    const order = r.packages.map((p) => p.name);
    expect(order.indexOf("c")).toBeLessThan(order.indexOf("a"));
    expect(order.indexOf("c")).toBeLessThan(order.indexOf("b"));
    expect(order.at(-1)).toBe("app");
    expect(r.root).toMatchObject({ name: "app", version: "1.0.0" });
    expect(r.packages.find((p) => p.name === "c")!.path).toEqual(["app@1.0.0", "a@1.2.0", "c@1.1.5"]);
  });

  it("backtracks to an older version when the newest one conflicts", async () => {
    const { source } = fixture({
      app: { "1.0.0": { a: "*", b: "^1.0.0" } },
      a: { "1.0.0": { c: "^1.0.0" }, "2.0.0": { c: "^2.0.0" } },
      b: { "1.0.0": { c: "^1.0.0" } },
      c: { "1.0.0": {}, "2.0.0": {} },
    });
    expect(pick(await resolveDependencies(source, "app"))).toEqual({
      app: "1.0.0",
      a: "1.0.0",
      b: "1.0.0",
      c: "1.0.0",
    });
  });

  it("honours an exact root version and a root range", async () => {
    const { source } = fixture({ app: { "1.0.0": {}, "1.5.0": {}, "2.0.0": {} } });
    expect(pick(await resolveDependencies(source, "app@1.0.0"))).toEqual({ app: "1.0.0" });
    expect(pick(await resolveDependencies(source, "app@^1"))).toEqual({ app: "1.5.0" });
    expect(pick(await resolveDependencies(source, "APP"))).toEqual({ app: "2.0.0" });
  });

  it("reports a conflict with both requirement paths", async () => {
    const { source } = fixture({
      app: { "1.0.0": { a: "^1.0.0", b: "^1.0.0" } },
      a: { "1.0.0": { c: "^1.0.0" } },
      b: { "1.0.0": { c: "^2.0.0" } },
      c: { "1.0.0": {}, "2.0.0": {} },
    });
    const error = await failure(resolveDependencies(source, "app"));
    expect(error.code).toBe("DEPENDENCY_CONFLICT");
    expect(error.message).toContain("^1.0.0 (required by app@1.0.0 → a@1.0.0)");
    expect(error.message).toContain("^2.0.0 (required by app@1.0.0 → b@1.0.0)");
    expect(error.message).toContain("available: 1.0.0, 2.0.0");
    expect(error.details.package).toBe("c");
    expect(error.status).toBe(422);
  });

  it("reports a conflict between a chosen version and a later range", async () => {
    const { source } = fixture({
      app: { "1.0.0": { c: "1.0.0", b: "*" } },
      b: { "1.0.0": { c: ">=2.0.0" } },
      c: { "1.0.0": {}, "2.0.0": {} },
    });
    const error = await failure(resolveDependencies(source, "app"));
    expect(error.code).toBe("DEPENDENCY_CONFLICT");
    expect(error.message).toMatch(
      /no single version of c satisfies 1\.0\.0 \(required by app@1\.0\.0\) and >=2\.0\.0 \(required by app@1\.0\.0 → b@1\.0\.0\)/,
    );
  });

  it("reports a cycle with its path", async () => {
    const { source } = fixture({
      app: { "1.0.0": { a: "^1" } },
      a: { "1.0.0": { b: "^1" } },
      b: { "1.0.0": { c: "^1" } },
      c: { "1.0.0": { a: "^1" } },
    });
    const error = await failure(resolveDependencies(source, "app"));
    expect(error.code).toBe("DEPENDENCY_CYCLE");
    expect(error.message).toBe("dependency cycle: a@1.0.0 → b@1.0.0 → c@1.0.0 → a@1.0.0");
    expect(error.details.cycle).toEqual(["a@1.0.0", "b@1.0.0", "c@1.0.0", "a@1.0.0"]);
  });

  it("reports an unknown dependency and an unsatisfiable range as unresolved, with the path", async () => {
    const missing = fixture({ app: { "1.0.0": { lib: "^1" } }, lib: { "1.0.0": { ghost: "^3.0.0" } } });
    const e1 = await failure(resolveDependencies(missing.source, "app"));
    expect(e1.code).toBe("DEPENDENCY_UNRESOLVED");
    expect(e1.message).toBe("package ghost is not in the depot (required as ^3.0.0 by app@1.0.0 → lib@1.0.0)");

    const tooNew = fixture({ app: { "1.0.0": { lib: "^2" } }, lib: { "1.0.0": {}, "1.4.0": {} } });
    const e2 = await failure(resolveDependencies(tooNew.source, "app"));
    expect(e2.code).toBe("DEPENDENCY_UNRESOLVED");
    expect(e2.message).toBe("no version of lib satisfies ^2 (required by app@1.0.0); available: 1.0.0, 1.4.0");
  });

  it("reports an unknown root package or version with the not-found codes", async () => {
    const { source } = fixture({ app: { "1.0.0": {} } });
    expect((await failure(resolveDependencies(source, "nope"))).code).toBe("PACKAGE_NOT_FOUND");
    const e = await failure(resolveDependencies(source, "app@3.0.0"));
    expect(e.code).toBe("VERSION_NOT_FOUND");
    expect(e.message).toContain("available: 1.0.0");
  });

  it("asks the source once per name and per version", async () => {
    const { source, calls } = fixture({
      app: { "1.0.0": { a: "*", b: "*" } },
      a: { "1.0.0": { c: "*" } },
      b: { "1.0.0": { c: "*" } },
      c: { "1.0.0": {} },
    });
    await resolveDependencies(source, "app");
    expect(calls.filter((c) => c === "versions c")).toHaveLength(1);
    expect(new Set(calls).size).toBe(calls.length);
  });

  it("gives up after maxSteps candidates", async () => {
    // Every version of a needs a c that b forbids: a search through all of them.
    const versions = Object.fromEntries(Array.from({ length: 50 }, (_, i) => [`1.${i}.0`, { c: "^2" }]));
    const { source } = fixture({
      app: { "1.0.0": { b: "*", a: "*" } },
      a: versions,
      b: { "1.0.0": { c: "^1" } },
      c: { "1.0.0": {}, "2.0.0": {} },
    });
    const error = await failure(resolveDependencies(source, "app", { maxSteps: 10 }));
    expect(error.code).toBe("DEPENDENCY_CONFLICT");
  });
});

describe("specs and version choice", () => {
  it("parses name, name@version and name@range", () => {
    expect(parsePackageSpec("Tool")).toEqual({ name: "tool", range: "*", exact: false });
    expect(parsePackageSpec("tool@1.2.3")).toEqual({ name: "tool", range: "1.2.3", exact: true });
    expect(parsePackageSpec("tool@^1.2")).toEqual({ name: "tool", range: "^1.2", exact: false });
    expect(() => parsePackageSpec("../x")).toThrow(/not a package name/);
    expect(() => parsePackageSpec("tool@not a range!")).toThrow(/not a version or SemVer range/);
  });

  it("counts prereleases only when no release satisfies, and ignores build metadata", () => {
    expect(satisfyingVersions(["1.0.0", "2.0.0-rc.1"], ["*"])).toEqual(["1.0.0"]);
    expect(satisfyingVersions(["2.0.0-rc.1", "2.0.0-rc.2"], ["*"])).toEqual(["2.0.0-rc.2", "2.0.0-rc.1"]);
    expect(satisfyingVersions(["1.0.0+a"], ["1.0.0"])).toEqual(["1.0.0+a"]);
  });
});
