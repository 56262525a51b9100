/**
 * The examples a reader copies type-check against the package's real types: the example of
 * every module page (the first ```ts block of each entry point's module comment), the
 * README's tour program and the API reference's first program (docs/api-index.md),
 * compiled with `tsc --strict` as files of a user's project in which `runner-depot/*`
 * resolves to this checkout's source. The one example that imports a
 * module of the reader's own (`./my-store.js`, the adapter the conformance kit tests) gets
 * a minimal one.
 */
import { execFile } from "node:child_process";
import { mkdir, readFile, rm, writeFile } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import { tourProgram } from "../../scripts/readme-tour.js";
import { writeSourceTsconfig } from "../fixtures/source-tsconfig.js";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");

/** The first ```ts block of a source file's leading doc comment, without the comment's `*` margin. */
export function moduleExample(source: string): string | null {
  const comment = /^\/\*\*([\s\S]*?)\*\//.exec(source)?.[1] ?? "";
  const block = /```ts\n([\s\S]*?)```/.exec(
    comment
      .split("\n")
      .map((line) => line.replace(/^\s*\* ?/, ""))
      .join("\n"),
  );
  return block ? block[1]! : null;
}

describe("examples in the documentation", () => {
  const dir = path.join(root, ".tmp", `api-examples-${process.pid}-${Date.now()}`);
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it("every module page's example and the README tour compile under tsc --strict", async () => {
    const typedoc = JSON.parse(await readFile(path.join(root, "typedoc.json"), "utf8")) as { entryPoints: string[] };
    await mkdir(dir, { recursive: true });
    const files: string[] = [];
    for (const [i, entry] of typedoc.entryPoints.entries()) {
      const example = moduleExample(await readFile(path.join(root, entry), "utf8"));
      expect(example, `${entry} has no \`\`\`ts example`).not.toBeNull();
      const file = `example-${i}-${entry.replace(/[/.]/g, "_")}.mts`;
      // Each example is its own module (top-level await, its own imports).
      await writeFile(path.join(dir, file), `export {};\n${example}`);
      files.push(file);
    }
    await writeFile(path.join(dir, "tour.mts"), tourProgram(await readFile(path.join(root, "README.md"), "utf8")));
    files.push("tour.mts");
    // The API reference's front page has a first program too.
    const index = /```ts\n([\s\S]*?)```/.exec(await readFile(path.join(root, "docs/api-index.md"), "utf8"));
    expect(index, "docs/api-index.md has a ```ts program").not.toBeNull();
    await writeFile(path.join(dir, "api-index.mts"), `export {};\n${index![1]}`);
    files.push("api-index.mts");
    // The reader's own adapter that the conformance-kit example imports.
    await writeFile(
      path.join(dir, "my-store.ts"),
      'import { createMemoryStore } from "runner-depot/adapters/memory";\nexport function createMyStore(_options: { fresh: boolean }) { return createMemoryStore(); }\n',
    );
    await writeSourceTsconfig(
      dir,
      root,
      {
        lib: ["ES2023", "DOM"],
        strict: true,
        noEmit: true,
        skipLibCheck: true,
        types: ["node"],
        typeRoots: [path.join(root, "node_modules/@types")],
      },
      { files },
    );
    const output = await new Promise<string>((resolve) => {
      execFile(
        path.join(root, "node_modules/.bin/tsc"),
        ["-p", dir],
        { cwd: dir, maxBuffer: 8 * 1024 * 1024 },
        (error, stdout, stderr) => {
          resolve(error ? `${stdout}${stderr}` || String(error) : "");
        },
      );
    });
    expect(output).toBe("");
    expect(files.length).toBeGreaterThanOrEqual(12);
    // About 10 s of CPU (tsc checks the package's source the examples import); a busy
    // machine stretches the wall-clock time, hence the generous timeout.
  }, 240_000);

  it("the example extractor finds the block inside a doc comment", () => {
    const source =
      "/**\n * Overview.\n *\n * @example\n * ```ts\n * const a = 1;\n *   indented();\n * ```\n */\nexport {};\n";
    expect(moduleExample(source)).toBe("const a = 1;\n  indented();\n");
    expect(moduleExample("export {};\n")).toBeNull();
  });
});
