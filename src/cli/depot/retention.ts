/**
 * `runner-depot retention`: one retention pass on a running `serve` (its control API, `POST /-/retention`, admin
 * token): prints each version removed (or, with --dry-run, that would be) as a JSON line, and the totals on stderr.
 */
import { CliError, type Command } from "../args.js";
import { controlOptions, controlRequest, controlUsage } from "../runner/control-client.js";
import type { RetentionReport } from "../../depot/store/retention.js";

const usage = `Usage: runner-depot retention [--keep-last N] [--prerelease-days D] [--unused-days D] [--dry-run]

Removes published versions from the running server's depot: those past the newest N of
each package, prereleases published more than D days ago, versions neither downloaded nor
published in the last D days (a version goes when any rule given says so). Never removes a
package's latest version, nor a version a kept version requires. Each removal is an entry of
the change feed (mirrors remove it too); garbage collection then reclaims the bytes.

Options:
  --keep-last <N>        keep the newest N versions of each package (N >= 1)
  --prerelease-days <D>  remove prereleases older than D days
  --unused-days <D>      remove versions not downloaded for D days
  --dry-run              list what would go and the bytes GC would reclaim; change nothing
${controlUsage}`;

export const retentionCommand: Command = {
  usage,
  options: {
    ...controlOptions,
    "keep-last": { type: "string" },
    "prerelease-days": { type: "string" },
    "unused-days": { type: "string" },
    "dry-run": { type: "boolean" },
  },
  async run(values, positionals) {
    if (positionals.length > 0) throw new CliError("retention takes no arguments", 2);
    const number = (name: string) => {
      const raw = values[name];
      if (raw === undefined) return undefined;
      const value = Number(raw);
      if (typeof raw !== "string" || raw.trim() === "" || !Number.isFinite(value) || value < 0)
        throw new CliError(`--${name} takes a number, got '${String(raw)}'`, 2);
      return value;
    };
    const policy = {
      keepLast: number("keep-last"),
      prereleaseDays: number("prerelease-days"),
      unusedDays: number("unused-days"),
    };
    if (Object.values(policy).every((v) => v === undefined))
      throw new CliError("give --keep-last, --prerelease-days or --unused-days", 2);
    const dryRun = values["dry-run"] === true;
    const response = await controlRequest(values, "POST", "/-/retention", { ...policy, dryRun }, "retention refused");
    const report = (await response.json()) as RetentionReport;
    for (const o of report.removed) process.stdout.write(`${JSON.stringify(o)}\n`);
    process.stderr.write(
      `${dryRun ? "would remove" : "removed"} ${report.removed.length} versions (${report.bytes} bytes for garbage collection) of ${report.packages} packages; ${report.required} kept as required\n`,
    );
    return 0;
  },
};
