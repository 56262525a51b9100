// A one-file project that test/setup/global-setup.test.ts runs in a nested vitest with the
// suite's own global setup and reporter, to see what a run without RabbitMQ prints and
// how it exits, in CI and outside it.
import { fileURLToPath } from "node:url";
import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    root: fileURLToPath(new URL("../../..", import.meta.url)),
    include: ["test/setup/skip-project/*.check.ts"],
    globalSetup: ["test/setup/global-setup.ts"],
    reporters: ["default", "./test/setup/services-reporter.ts"],
  },
});
