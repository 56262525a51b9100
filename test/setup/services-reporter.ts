/**
 * A vitest reporter placed after the default one: it ends the summary with the services
 * the run used and every skipped test with its reason, and fails the run in CI when any
 * test was skipped (see ./skip-summary.ts).
 */
import { relative } from "node:path";
import type { Reporter, TestModule, Vitest } from "vitest/node";
import { describeServices, isCi, skipVerdict, type SkippedTest } from "./skip-summary.js";

export default class ServicesReporter implements Reporter {
  private vitest: Vitest | undefined;

  onInit(vitest: Vitest): void {
    this.vitest = vitest;
  }

  onTestRunEnd(testModules: ReadonlyArray<TestModule>): void {
    const skipped: SkippedTest[] = [];
    for (const module of testModules) {
      for (const test of module.children.allTests()) {
        const result = test.result();
        if (result.state !== "skipped") continue;
        skipped.push({ file: relative(process.cwd(), module.moduleId), name: test.fullName, note: result.note });
      }
    }
    const services = this.vitest?.getRootProject().getProvidedContext().services;
    const lines = services ? describeServices(services) : [];
    const verdict = skipVerdict(skipped, isCi(process.env));
    lines.push(...verdict.lines);
    if (lines.length > 0) process.stdout.write(`${lines.join("\n")}\n`);
    if (verdict.fail) process.exitCode = 1;
  }
}
