/**
 * `runner-depot logs <requestId> [--follow] [--timestamps] [--section <name>]`: prints a job's stored log (or one
 * section of it), stdout lines to stdout and stderr lines to stderr, each after its time in RFC 3339 with --timestamps.
 * With `--grep <pattern> [--regex] [--ignore-case]` it prints only the matching lines, searched on the server a page
 * at a time.
 */
import type { JobResult, StoredLine } from "../../runner/ports.js";
import { fetchFailureCause } from "../../fetch-failure.js";
import { cliFetch } from "../timed-fetch.js";
import { CliError, serverTarget, type Command } from "../args.js";
import type { LogSearchPage } from "../../runner/service/log-search.js";
import { rfc3339Micro } from "../../runner/protocol/line-time.js";

const usage = `Usage: runner-depot logs <requestId> [options]

Prints the job's stored log: its stdout lines on stdout, its stderr lines on stderr.
With --follow it keeps printing new lines until the job ends, then prints the job
result as one JSON line on stderr and exits with the job's exit code.

Options:
  --follow, -f       tail the log until the job ends
  --timestamps, -t   start each line with its time (RFC 3339, UTC, to the µs) and a space;
                     lines stored before times existed have none
  --section <name>   only the lines of the job's first section of that name (GitLab's
                     section_start / GitHub's ::group::), its marker lines included
  --grep <pattern>   print only the lines holding <pattern> (searched on the server), each
                     after its line number (from 1) and a colon; exits 1 when none matches
  --regex, -E        <pattern> is an RE2 regular expression
  --ignore-case, -i  upper and lower case match each other
  --url <url>        server (depot) URL (default: from <data>/serve.json)
  --token <token>    admin token (default: $RUNNER_DEPOT_TOKEN or <data>/serve.json)
  --data <dir>       where 'serve' keeps its data (default ./.runner-depot)`;

export const logsCommand: Command = {
  usage,
  options: {
    follow: { type: "boolean", short: "f" },
    timestamps: { type: "boolean", short: "t" },
    section: { type: "string" },
    grep: { type: "string" },
    regex: { type: "boolean", short: "E" },
    "ignore-case": { type: "boolean", short: "i" },
    url: { type: "string" },
    token: { type: "string" },
    data: { type: "string" },
  },
  async run(values, positionals) {
    const [requestId] = positionals;
    if (!requestId || positionals.length > 1)
      throw new CliError("give exactly one request ID: 'runner-depot logs <requestId>'", 2);
    const { url, token } = await serverTarget(values, "depotUrl");
    if (typeof values.grep === "string")
      return grepLog(url, token, requestId, values.grep, Boolean(values.regex), Boolean(values["ignore-case"]));
    if (values.follow && values.section !== undefined)
      throw new CliError("--section reads a stored section; not with --follow", 2);
    const query = values.follow
      ? "?follow"
      : values.section !== undefined
        ? `?section=${encodeURIComponent(String(values.section))}`
        : "";
    const response = await cliFetch(`${url}/-/jobs/${encodeURIComponent(requestId)}/log${query}`, {
      headers: token ? { authorization: `Bearer ${token}` } : {},
    }).catch((error: Error) => {
      throw new CliError(`cannot reach ${url}: ${fetchFailureCause(error)}; is 'runner-depot serve' running?`);
    });
    if (!response.ok || !response.body) {
      const problem = (await response.json().catch(() => ({}))) as { detail?: string };
      throw new CliError(`cannot read the log (${response.status}): ${problem.detail ?? response.statusText}`);
    }
    let result: JobResult | undefined;
    let pending = "";
    const decoder = new TextDecoder();
    const handle = (text: string) => {
      if (!text) return;
      const record = JSON.parse(text) as StoredLine | { result: JobResult };
      if ("result" in record) result = record.result;
      else {
        const prefix = values.timestamps && record.time ? `${rfc3339Micro(record.time)} ` : "";
        (record.stderr ? process.stderr : process.stdout).write(`${prefix}${record.line}\n`);
      }
    };
    for await (const chunk of response.body as unknown as AsyncIterable<Uint8Array>) {
      pending += decoder.decode(chunk, { stream: true });
      const lines = pending.split("\n");
      pending = lines.pop()!;
      lines.forEach(handle);
    }
    handle(pending + decoder.decode());
    if (result) process.stderr.write(`${JSON.stringify(result)}\n`);
    if (values.follow && result) return result.exitCode >= 0 && result.exitCode <= 255 ? result.exitCode : 1;
    return 0;
  },
};

/** Prints the lines of the job's log that match, page by page through `GET /-/jobs/<id>/search`; 0 when any did. */
async function grepLog(
  url: string,
  token: string | undefined,
  requestId: string,
  pattern: string,
  regex: boolean,
  ignoreCase: boolean,
): Promise<number> {
  let found = 0;
  for (let from = 0; ;) {
    const query = new URLSearchParams({ q: pattern, regex: regex ? "1" : "0", case: ignoreCase ? "0" : "1" });
    query.set("from", String(from));
    query.set("limit", "1000");
    const response = await cliFetch(`${url}/-/jobs/${encodeURIComponent(requestId)}/search?${query}`, {
      headers: token ? { authorization: `Bearer ${token}` } : {},
    }).catch((error: Error) => {
      throw new CliError(`cannot reach ${url}: ${fetchFailureCause(error)}; is 'runner-depot serve' running?`);
    });
    if (!response.ok) {
      const problem = (await response.json().catch(() => ({}))) as { detail?: string };
      throw new CliError(`cannot search the log (${response.status}): ${problem.detail ?? response.statusText}`, 2);
    }
    const page = (await response.json()) as LogSearchPage;
    let text = "";
    for (const match of page.matches) text += `${match.position + 1}:${match.line}\n`;
    if (text) process.stdout.write(text);
    found += page.matches.length;
    if (page.end) return found > 0 ? 0 : 1;
    from = page.next;
  }
}
