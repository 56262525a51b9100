import { defineConfig } from "tsup";

// One entry per subpath export in package.json; the CLI is built alongside.
export default defineConfig({
  entry: {
    index: "src/index.ts",
    runner: "src/runner/index.ts",
    depot: "src/depot/index.ts",
    "adapters/memory": "src/adapters/memory/index.ts",
    "adapters/fs": "src/adapters/fs/index.ts",
    "adapters/rabbitmq": "src/adapters/rabbitmq/index.ts",
    "adapters/s3": "src/adapters/s3/index.ts",
    "adapters/postgres": "src/adapters/postgres/index.ts",
    testing: "src/testing/index.ts",
    console: "src/console/index.ts",
    cli: "src/cli/main.ts",
  },
  format: ["esm", "cjs"],
  dts: true,
  // No source maps: dist/ is not minified, so stack traces already point at readable code,
  // and the maps were 3.5 MB of the 6.5 MB package (issue 29; docs/decisions/public-surface.md).
  sourcemap: false,
  clean: true,
  target: "node20",
  splitting: true,
  // Backend clients are optional peers and vitest is the host's: never bundle them.
  external: ["amqplib", "pg", "@aws-sdk/client-s3", "@aws-sdk/lib-storage", "@aws-sdk/s3-request-presigner", "vitest"],
});
