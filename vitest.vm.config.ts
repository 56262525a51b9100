import { defineConfig } from "vitest/config";

// `npm run test:vm` (test/vm/run.sh): the agent in a real VM, minutes under TCG, so out of
// the default run; CI runs it once, not per Node version (docs/decisions/single-file-agent.md).
export default defineConfig({
  test: {
    include: ["test/vm/**/*.vm.ts"],
    testTimeout: 900_000,
    hookTimeout: 600_000,
    pool: "forks",
    maxWorkers: 1,
    fileParallelism: false,
  },
});
