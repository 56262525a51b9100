// Run with `npx vitest run --root examples/host-unit-test` (the project's own
// `vitest run` only collects test/**/*.test.ts, so it never runs these twice).
import { defineConfig } from "vitest/config";

export default defineConfig({
  test: { include: ["**/*.test.ts"], testTimeout: 30_000 },
});
