// Run with `npx vitest run --root examples/host-unit-test` (the project's own
// `vitest run` only collects test/**/*.test.ts, so it never runs these twice).
import { fileURLToPath } from "node:url";
import { defineConfig } from "vitest/config";

export default defineConfig({
  // Keep vite's cache in the repository's node_modules, not a new one under examples/.
  cacheDir: fileURLToPath(new URL("../../node_modules/.vite/host-unit-test", import.meta.url)),
  test: { include: ["**/*.test.ts"], testTimeout: 30_000 },
});
