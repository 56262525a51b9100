/**
 * The end of `npm test`'s summary: which services the run used, which tests were
 * skipped and why, and the verdict that in CI (`CI=true`, where every service is there)
 * any skipped test fails the run.
 */
import type { TestServices } from "./services.js";

/** One skipped test, as the reporter saw it. */
export interface SkippedTest {
  file: string;
  name: string;
  /** The note given to `ctx.skip(note)`, e.g. why RabbitMQ could not be had. */
  note: string | undefined;
}

/** Lines that say what each service is for this run. */
export function describeServices(services: TestServices): string[] {
  return [
    `services: PostgreSQL: ${label(services.postgres.how)}: ${services.postgres.reason}`,
    `services: RabbitMQ: ${label(services.rabbitmq.how)}: ${services.rabbitmq.reason}`,
  ];
}

function label(how: string): string {
  return how === "unavailable" ? "SKIPPED" : how;
}

/**
 * The summary lines for the skipped tests, grouped by reason, and whether they fail
 * the run (always in CI, never elsewhere).
 */
export function skipVerdict(skipped: SkippedTest[], ci: boolean): { lines: string[]; fail: boolean } {
  if (skipped.length === 0) return { lines: [], fail: false };
  const byReason = new Map<string, Map<string, number>>();
  for (const test of skipped) {
    const reason = test.note ?? "skipped in the code (it.skip / describe.skip / .todo)";
    const files = byReason.get(reason) ?? new Map<string, number>();
    files.set(test.file, (files.get(test.file) ?? 0) + 1);
    byReason.set(reason, files);
  }
  const lines = [`skipped: ${skipped.length} test${skipped.length === 1 ? "" : "s"}`];
  for (const [reason, files] of byReason) {
    const where = [...files].map(([file, n]) => `${file} (${n})`).join(", ");
    lines.push(`  - ${reason}: ${where}`);
  }
  if (ci) lines.push("CI=true: CI has every service, so a skipped test fails the run.");
  return { lines, fail: ci };
}

/** CI is on when the CI variable is set to anything but false/0/empty. */
export function isCi(env: NodeJS.ProcessEnv): boolean {
  const value = env.CI?.trim().toLowerCase();
  return value !== undefined && value !== "" && value !== "false" && value !== "0";
}
