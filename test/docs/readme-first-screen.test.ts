/**
 * The README's first screen (everything before its first `---`, at most 24 lines) gives
 * exactly two commands, in one shell block: the main job on embedded defaults
 * (`npm ci && npm start`) and the tests (`npm test`), and says how long the tests take.
 * .ci/run takes both commands from this block and runs them as written.
 */
import { readFile } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");

describe("README first screen", () => {
  it("has exactly the two commands and says how long the suite takes", async () => {
    const readme = await readFile(path.join(root, "README.md"), "utf8");
    const screen = readme.slice(0, readme.indexOf("\n---\n"));
    expect(screen.split("\n").length).toBeLessThanOrEqual(24);
    const blocks = [...screen.matchAll(/^```(\w*)\n([\s\S]*?)^```$/gm)];
    expect(blocks).toHaveLength(1);
    expect(blocks[0]![1]).toBe("sh");
    const commands = blocks[0]![2]!
      .trim()
      .split("\n")
      .map((line) => line.replace(/\s+#.*$/, ""));
    expect(commands).toEqual(["npm ci && npm start", "npm test"]);
    expect(blocks[0]![2]).toMatch(/^npm ci && npm start +# main job: .*embedded defaults$/m);
    expect(screen).toMatch(/`npm test` takes (about \d+|\d+ to \d+) minutes/);
    // The exact patterns .ci/run extracts them with.
    const ci = await readFile(path.join(root, ".ci/run"), "utf8");
    expect(ci).toContain("grep -m1 -E '^npm ci && npm start +#' README.md");
    expect(ci).toContain("grep -m1 -E '^npm test +#' README.md");
  });
});
