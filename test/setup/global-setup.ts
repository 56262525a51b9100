/**
 * vitest global setup: decides once per run what the tests use for PostgreSQL and
 * RabbitMQ (rules in ./services.ts), prints the decision, hands it to the test files
 * (inject("services"), read through test/fixtures/backends.ts) and stops whatever it
 * started when the run ends.
 */
import type { TestProject } from "vitest/node";
import { realWays } from "./service-ways.js";
import { decideServices, type TestServices } from "./services.js";
import { describeServices } from "./skip-summary.js";

declare module "vitest" {
  export interface ProvidedContext {
    services: TestServices;
  }
}

export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  const decision = await decideServices(process.env, realWays);
  project.provide("services", decision.services);
  process.stdout.write(`\n${describeServices(decision.services).join("\n")}\n\n`);
  return () => decision.stop();
}
