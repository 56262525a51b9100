/**
 * `runner-depot logs <requestId> [--follow] [--timestamps] [--section <name>]`: prints a job's stored log (or one
 * section of it), stdout lines to stdout and stderr lines to stderr, each after its time in RFC 3339 with --timestamps.
 */
import type { JobResult, StoredLine } from "../../runner/ports.js";
import { fetchFailureCause } from "../../fetch-failure.js";
import { cliFetch } from "../timed-fetch.js";
import { CliError, serverTarget, type Command } from "../args.js";
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
  --url <url>        server (depot) URL (default: from <data>/serve.json)
  --token <token>    admin token (default: $RUNNER_DEPOT_TOKEN or <data>/serve.json)
  --data <dir>       where 'serve' keeps its data (default ./.runner-depot)`;

export const logsCommand: Command = {
  usage,
  options: {
    follow: { type: "boolean", short: "f" },
    timestamps: { type: "boolean", short: "t" },
    section: { type: "string" },
    url: { type: "string" },
    token: { type: "string" },
    data: { type: "string" },
  },
  async run(values, positionals) {
    const [requestId] = positionals;
    if (!requestId || positionals.length > 1)
      throw new CliError("give exactly one request ID: 'runner-depot logs <requestId>'", 2);
    const { url, token } = await serverTarget(values, "depotUrl");
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
