/**
 * The API reference has one page per import path: every subpath package.json exports is a
 * TypeDoc entry point, named after its import path (`@module`), and opens with a module
 * comment that has an overview and an example. (`npm run docs`, which CI runs, fails on
 * any TypeDoc warning; this test keeps the structure from drifting when a subpath is added.)
 */
import { readFile } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");
const json = async <T>(file: string) => JSON.parse(await readFile(path.join(root, file), "utf8")) as T;

describe("API reference", () => {
  it("every exported subpath is an entry point with its own module page, overview and example", async () => {
    const pkg = await json<{ exports: Record<string, unknown> }>("package.json");
    const typedoc = await json<{ entryPoints: string[]; readme: string; treatWarningsAsErrors: boolean }>(
      "typedoc.json",
    );
    const subpaths = Object.keys(pkg.exports).filter((s) => s !== "./package.json");
    const entryOf = (subpath: string) => (subpath === "." ? "src/index.ts" : `src/${subpath.slice(2)}/index.ts`);
    expect([...typedoc.entryPoints].sort()).toEqual(subpaths.map(entryOf).sort());
    expect(typedoc.treatWarningsAsErrors).toBe(true);

    for (const subpath of subpaths) {
      const source = await readFile(path.join(root, entryOf(subpath)), "utf8");
      const comment = /^\/\*\*([\s\S]*?)\*\//.exec(source)?.[1] ?? "";
      const name = subpath === "." ? "runner-depot" : `runner-depot/${subpath.slice(2)}`;
      expect(comment, entryOf(subpath)).toMatch(new RegExp(`@module ${name.replace(/\//g, "\\/")}\\s*$`));
      expect(comment, entryOf(subpath)).toContain("@example");
      // The example imports from the package by name, as a user's code would.
      expect(comment, entryOf(subpath)).toContain(`from "${name}"`);
      // An overview before the example: at least a few lines of prose.
      const overview = comment
        .slice(0, comment.indexOf("@example"))
        .replace(/^\s*\*\s?/gm, "")
        .trim();
      expect(overview.length, entryOf(subpath)).toBeGreaterThan(150);
    }
  });

  it("the index page is an overview of the modules, not the README", async () => {
    const typedoc = await json<{ readme: string }>("typedoc.json");
    expect(typedoc.readme).not.toMatch(/README/i);
    const index = await readFile(path.join(root, typedoc.readme), "utf8");
    const pkg = await json<{ exports: Record<string, unknown> }>("package.json");
    for (const subpath of Object.keys(pkg.exports).filter((s) => s !== "./package.json")) {
      expect(index).toContain(`\`${subpath === "." ? "runner-depot" : `runner-depot/${subpath.slice(2)}`}\``);
    }
    expect(index).not.toContain("npm ci && npm start");
  });
});
