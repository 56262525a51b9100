/**
 * The package's own version for `runner-depot --version`, read from its package.json:
 * one folder up from the built `dist/cli.js`, two up from `src/cli/main.ts` under tsx.
 */
import { readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

/**
 * The runner-depot version, or "unknown" when no package.json of runner-depot is found.
 *
 * @example
 * process.stdout.write(`runner-depot ${packageVersion()}\n`);
 */
export function packageVersion(from: string = path.dirname(fileURLToPath(import.meta.url))): string {
  let dir = from;
  for (let up = 0; up < 4; up++) {
    try {
      const pkg = JSON.parse(readFileSync(path.join(dir, "package.json"), "utf8")) as {
        name?: string;
        version?: string;
      };
      if (pkg.name === "runner-depot" && typeof pkg.version === "string") return pkg.version;
    } catch {
      // Not here: one folder up.
    }
    dir = path.dirname(dir);
  }
  return "unknown";
}

/**
 * The folder of runner-depot's own package.json (the checkout or the installed package),
 * or undefined; serve looks for the built single-file agent under its build/agent.
 *
 * @example
 * const agentDir = path.join(packageDir() ?? ".", "build", "agent");
 */
export function packageDir(from: string = path.dirname(fileURLToPath(import.meta.url))): string | undefined {
  let dir = from;
  for (let up = 0; up < 4; up++) {
    try {
      const pkg = JSON.parse(readFileSync(path.join(dir, "package.json"), "utf8")) as { name?: string };
      if (pkg.name === "runner-depot") return dir;
    } catch {
      // Not here: one folder up.
    }
    dir = path.dirname(dir);
  }
  return undefined;
}
