/**
 * What an embedder installs (issue 29 item 9): every package the library's modules import
 * is a dependency (or an adapter's optional peer), every dependency is imported by them,
 * and what only `serve` imports (its logger, the OpenTelemetry SDK) is an optional peer
 * that serve-packages.ts names when missing. scripts/check-pack.sh measures the result:
 * a host's node_modules after installing the tarball.
 */
import { readdir, readFile } from "node:fs/promises";
import { builtinModules } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { SERVE_PACKAGES, missingServePackage } from "../../src/cli/serve/serve-packages.js";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");
const src = path.join(root, "src");

interface Manifest {
  dependencies: Record<string, string>;
  devDependencies: Record<string, string>;
  peerDependencies: Record<string, string>;
  peerDependenciesMeta: Record<string, { optional?: boolean }>;
}
const pkg = JSON.parse(await readFile(path.join(root, "package.json"), "utf8")) as Manifest;

/** The package a bare specifier names (`@scope/name/sub` → `@scope/name`). */
const packageOf = (spec: string) =>
  spec
    .split("/")
    .slice(0, spec.startsWith("@") ? 2 : 1)
    .join("/");

/** Bare package specifiers imported (statically, dynamically or for effect) by each file under src/. */
async function importsByFile(): Promise<Map<string, Set<string>>> {
  const files = (await readdir(src, { recursive: true, withFileTypes: true }))
    .filter((e) => e.isFile() && e.name.endsWith(".ts"))
    .map((e) => path.join(e.parentPath, e.name));
  const out = new Map<string, Set<string>>();
  for (const file of files) {
    const text = await readFile(file, "utf8");
    const specs = [
      ...text.matchAll(/^\s*(?:import|export)\b[^;]*?\bfrom\s+"([^"]+)"/gm),
      ...text.matchAll(/^\s*import\s+"([^"]+)"/gm),
      ...text.matchAll(/\bimport\(\s*"([^"]+)"\s*\)/g),
    ].map((m) => m[1]!);
    const bare = specs.filter(
      (s) => !s.startsWith(".") && !s.startsWith("node:") && !builtinModules.includes(s) && !s.startsWith("#"),
    );
    out.set(path.relative(src, file), new Set(bare.map(packageOf)));
  }
  return out;
}

const serveNames = SERVE_PACKAGES.map((spec) => spec.slice(0, spec.lastIndexOf("@")));

describe("dependencies", () => {
  it("the library's modules import only dependencies and optional peers; every dependency is imported", async () => {
    const byFile = await importsByFile();
    const library = new Set<string>();
    const cli = new Set<string>();
    for (const [file, specs] of byFile) for (const s of specs) (file.startsWith("cli/") ? cli : library).add(s);
    const optionalPeers = Object.keys(pkg.peerDependencies).filter((n) => pkg.peerDependenciesMeta[n]?.optional);
    const adapterPeers = optionalPeers.filter((n) => !serveNames.includes(n));
    expect([...library].filter((n) => !(n in pkg.dependencies) && !adapterPeers.includes(n)).sort()).toEqual([]);
    // The command may use the dependencies, the adapters' peers and serve's packages, nothing else.
    expect(
      [...cli].filter((n) => !(n in pkg.dependencies) && !adapterPeers.includes(n) && !serveNames.includes(n)).sort(),
    ).toEqual([]);
    const used = new Set([...library, ...cli]);
    expect(Object.keys(pkg.dependencies).filter((n) => !used.has(n))).toEqual([]);
    // What only the command loads is not something a library install pulls in.
    expect([...cli].filter((n) => !library.has(n) && n in pkg.dependencies).sort()).toEqual([]);
  });

  it("serve's packages are optional peers at the versions CI tests (devDependencies), and imported only by serve's modules", async () => {
    const byFile = await importsByFile();
    for (const spec of SERVE_PACKAGES) {
      const at = spec.lastIndexOf("@");
      const [name, range] = [spec.slice(0, at), spec.slice(at + 1)];
      expect(pkg.peerDependencies[name], name).toBe(range);
      expect(pkg.peerDependenciesMeta[name]?.optional, name).toBe(true);
      expect(`^${pkg.devDependencies[name]}`, name).toBe(range);
      expect(pkg.dependencies[name], name).toBeUndefined();
      const importers = [...byFile].filter(([, specs]) => specs.has(name)).map(([file]) => file);
      expect(importers.length, name).toBeGreaterThan(0);
      for (const file of importers) expect(file, name).toMatch(/^cli\/serve\//);
    }
  });

  it("a missing serve package is recognised from Node's error, and nothing else is", () => {
    const notFound = (name: string) =>
      Object.assign(new Error(`Cannot find package '${name}' imported from /app/node_modules/runner-depot/dist/x.js`), {
        code: "ERR_MODULE_NOT_FOUND",
      });
    expect(missingServePackage(notFound("pino"))).toBe("pino");
    expect(missingServePackage(notFound("@opentelemetry/sdk-metrics"))).toBe("@opentelemetry/sdk-metrics");
    expect(missingServePackage(notFound("pino-pretty"))).toBeUndefined();
    expect(missingServePackage(notFound("yaml"))).toBeUndefined();
    expect(missingServePackage(new Error("Cannot find package 'pino'"))).toBeUndefined();
  });
});
