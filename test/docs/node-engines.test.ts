/**
 * Node versions (issue 10 item 9): the package supports Node 22 and 24, `engines` says
 * exactly that, CI runs the suite on both, and no package `npm ci` installs (the lock
 * file's every entry, dev dependencies included) asks for a Node that `engines` allows
 * but the package's own range excludes, so `npm ci` on any supported Node prints no
 * EBADENGINE warning. (.ci/run also fails on an EBADENGINE line from a real `npm ci`.)
 */
import { readFile } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import semver from "semver";
import { describe, expect, it } from "vitest";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");
const json = async <T>(file: string) => JSON.parse(await readFile(path.join(root, file), "utf8")) as T;

interface Lock {
  packages: Record<string, { engines?: { node?: string } | string[] }>;
}

describe("Node versions", () => {
  it("engines names Node 22 and 24 and nothing older; the root of the lock file says the same", async () => {
    const range = (await json<{ engines: { node: string } }>("package.json")).engines.node;
    for (const v of ["22.15.0", "22.23.3", "24.0.0", "24.21.0"])
      expect(semver.satisfies(v, range), `${v} in ${range}`).toBe(true);
    for (const v of ["20.19.5", "22.14.0", "21.7.3", "23.11.1"])
      expect(semver.satisfies(v, range), `${v} in ${range}`).toBe(false);
    expect(((await json<Lock>("package-lock.json")).packages[""]!.engines as { node: string }).node).toBe(range);
  });

  it("every installed package accepts every Node version engines allows (no EBADENGINE from npm ci)", async () => {
    const range = (await json<{ engines: { node: string } }>("package.json")).engines.node;
    // The lowest of each supported major, the versions CI used last, and the one running this test.
    const versions = ["22.15.0", "22.23.3", "24.0.0", "24.21.0", process.versions.node].filter((v) =>
      semver.satisfies(v, range),
    );
    const lock = await json<Lock>("package-lock.json");
    const refused: string[] = [];
    for (const [name, entry] of Object.entries(lock.packages)) {
      const wanted = Array.isArray(entry.engines) ? undefined : entry.engines?.node;
      if (!name || !wanted) continue;
      for (const v of versions)
        if (!semver.satisfies(v, wanted, { includePrerelease: true }))
          refused.push(`${name} wants node ${wanted}, not ${v}`);
    }
    expect(refused).toEqual([]);
  });

  it("CI runs the whole suite on each supported major", async () => {
    const ci = await readFile(path.join(root, ".ci/run"), "utf8");
    const majors = /^for major in ([\d ]+); do$/m.exec(ci)?.[1]?.trim().split(/\s+/);
    expect(majors).toEqual(["22", "24"]);
    // With CI=true, so a skipped test fails the run whoever starts the script.
    expect(ci).toContain('CI=true bash -c "$test_cmd"');
    expect(ci).toMatch(/grep EBADENGINE/);
  });
});
