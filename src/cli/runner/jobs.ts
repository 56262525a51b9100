/** `runner-depot jobs` and `runner-depot cancel <requestId>`: list and cancel the jobs of a running `serve`. */
import type { JobPage, JobSummary } from "../../runner/index.js";
import { CliError, type Command } from "../args.js";
import { controlOptions, controlRequest, controlUsage } from "./control-client.js";
import type { CancelJobResponse } from "../serve/control-jobs.js";

const STATES = ["open", "finished", "cancelled", "lost"] as const;

const jobsUsage = `Usage: runner-depot jobs [options]

Lists the jobs of the server started by 'runner-depot serve', newest first: request
ID, state (open, finished, cancelled, lost), outcome (success, failed, cancelled,
lost; - while open), exit code, age and duration. One page at a time; the command
for the next page is printed at the end.

Options:
  --state <states>   only these states, comma-separated, e.g. --state open,lost
  --limit <n>        jobs per page, 1-500 (default 20)
  --cursor <c>       the page after the one that printed this cursor
  --json             print the page as JSON ({jobs, next})
${controlUsage}`;

const cancelUsage = `Usage: runner-depot cancel <requestId> [options]

Cancels an open job of the server started by 'runner-depot serve': its result is
published at once with outcome 'cancelled', and its agent stops the command on its
next call. Exits 1 when the job is unknown or already over (saying how it ended).

Options:
${controlUsage}`;

/** The outcome column: what happened, in one word. */
function outcomeOf(job: JobSummary): string {
  if (job.status === "open") return "-";
  if (job.outcome === "finished") return job.success ? "success" : "failed";
  return job.outcome ?? job.status;
}

/** "12s", "5m", "3h", "2d". */
function shortDuration(ms: number): string {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 90) return `${s}s`;
  if (s < 90 * 60) return `${Math.round(s / 60)}m`;
  if (s < 36 * 3600) return `${Math.round(s / 3600)}h`;
  return `${Math.round(s / 86400)}d`;
}

/** The table: 79 columns wide at most (36 for the ID, the rest fixed). */
function formatJobTable(jobs: readonly JobSummary[], now = Date.now()): string {
  const row = (cells: string[]) =>
    `${cells[0]!.padEnd(36)} ${cells[1]!.padEnd(9)} ${cells[2]!.padEnd(9)} ${cells[3]!.padStart(4)} ${cells[4]!.padStart(7)} ${cells[5]!.padStart(8)}`.trimEnd();
  const lines = [row(["REQUEST ID", "STATE", "OUTCOME", "EXIT", "AGE", "DURATION"])];
  for (const job of jobs) {
    lines.push(
      row([
        job.requestId,
        job.status,
        outcomeOf(job),
        job.exitCode === null ? "-" : String(job.exitCode),
        shortDuration(now - Date.parse(job.createdAt)),
        job.durationMs === null
          ? "-"
          : job.durationMs < 10_000
            ? `${(job.durationMs / 1000).toFixed(1)}s`
            : shortDuration(job.durationMs),
      ]),
    );
  }
  return lines.join("\n");
}

export const jobsCommand: Command = {
  usage: jobsUsage,
  options: {
    ...controlOptions,
    state: { type: "string" },
    limit: { type: "string" },
    cursor: { type: "string" },
    json: { type: "boolean" },
  },
  async run(values, positionals) {
    if (positionals.length > 0)
      throw new CliError(
        `'runner-depot jobs' takes no arguments, got '${positionals[0]}'; see 'runner-depot jobs --help'`,
        2,
      );
    const query = new URLSearchParams();
    if (typeof values.state === "string") {
      const states = values.state.split(",").map((s) => s.trim());
      const bad = states.find((s) => !(STATES as readonly string[]).includes(s));
      if (bad !== undefined)
        throw new CliError(`--state '${bad}' is not a state: use ${STATES.join(", ")} (comma-separated)`, 2);
      query.set("status", states.join(","));
    }
    const limit = values.limit === undefined ? 20 : Number(values.limit);
    if (!Number.isInteger(limit) || limit < 1 || limit > 500)
      throw new CliError(`--limit must be a whole number from 1 to 500, got '${String(values.limit)}'`, 2);
    query.set("limit", String(limit));
    if (typeof values.cursor === "string") query.set("cursor", values.cursor);
    const response = await controlRequest(
      values,
      "GET",
      `/-/jobs?${query}`,
      undefined,
      "the server refused to list jobs",
    );
    const page = (await response.json()) as JobPage;
    if (values.json) {
      process.stdout.write(`${JSON.stringify(page)}\n`);
      return 0;
    }
    if (page.jobs.length === 0) {
      process.stderr.write(
        typeof values.cursor === "string"
          ? "no more jobs\n"
          : "no jobs yet; create one with 'runner-depot job -- <command>'\n",
      );
      return 0;
    }
    process.stdout.write(`${formatJobTable(page.jobs)}\n`);
    if (page.next) {
      const state = typeof values.state === "string" ? ` --state ${values.state}` : "";
      process.stderr.write(`more: runner-depot jobs${state} --limit ${limit} --cursor ${page.next}\n`);
    }
    return 0;
  },
};

export const cancelCommand: Command = {
  usage: cancelUsage,
  options: { ...controlOptions },
  async run(values, positionals) {
    const [requestId] = positionals;
    if (!requestId || positionals.length > 1)
      throw new CliError("give exactly one request ID: 'runner-depot cancel <requestId>' (see 'runner-depot jobs')", 2);
    const response = await controlRequest(
      values,
      "POST",
      `/-/jobs/${encodeURIComponent(requestId)}/cancel`,
      undefined,
      "cannot cancel",
    );
    const answer = (await response.json()) as CancelJobResponse;
    process.stderr.write(
      `cancelled job ${answer.requestId}; its result was published with outcome '${answer.result.outcome}'\n`,
    );
    return 0;
  },
};
