// Run with `npx vitest run --root examples/host-unit-test` (the project's own
// `vitest run` only collects test/**/*.test.ts, so it never runs these twice).
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { defineConfig } from "vitest/config";

// In a clone, `runner-depot/*` is this repository's source (as tsconfig.json's paths say);
// in an installed package, the package itself.
const src = fileURLToPath(new URL("../../src", import.meta.url));
const alias = existsSync(`${src}/index.ts`)
  ? [
      { find: /^runner-depot$/, replacement: `${src}/index.ts` },
      { find: /^runner-depot\/(.+)$/, replacement: `${src}/$1/index.ts` },
    ]
  : [];

export default defineConfig({
  resolve: { alias },
  // Keep vite's cache in the repository's node_modules, not a new one under examples/.
  cacheDir: fileURLToPath(new URL("../../node_modules/.vite/host-unit-test", import.meta.url)),
  test: { include: ["**/*.test.ts"], testTimeout: 30_000 },
});
