import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    // Integration tests bind real sockets and start real servers. Many files wait on PostgreSQL,
    // RabbitMQ, S3 or a browser, so four workers on two cores (docs/decisions/ci-time.md).
    pool: "forks",
    maxWorkers: 4,
    // Decides what PostgreSQL and RabbitMQ the run uses (README: "Running the tests").
    globalSetup: ["test/setup/global-setup.ts"],
    // The services reporter ends the summary with the skipped tests and their reasons,
    // and fails a CI run that skipped any.
    reporters: ["default", "./test/setup/services-reporter.ts"],
  },
});
