#!/usr/bin/env node
/**
 * The `runner-depot` command: `serve`, `job`, `agent`, `logs`, `publish`, `install`.
 * Exit codes: 0 success, 1 failure, 2 usage. Errors are one line saying what to do.
 */
import { CliError, runCli } from "./args.js";
import { agentCommand } from "./agent.js";
import { installCommand, publishCommand } from "./depot.js";
import { jobCommand } from "./job.js";
import { logsCommand } from "./logs.js";
import { serveCommand } from "./serve.js";

const commands = {
  serve: serveCommand,
  job: jobCommand,
  agent: agentCommand,
  logs: logsCommand,
  publish: publishCommand,
  install: installCommand,
};

const USAGE = `runner-depot — runner log streaming (gRPC) and a package depot (REST)

Usage: runner-depot <command> [options]

Commands:
  serve                      run the orchestrator side: runner service + depot (embedded defaults)
  job                        create a job on a running server and print its cloud-init user data
  agent                      run a job inside the VM and stream its output (exits with its exit code)
  logs <requestId>           print a job's stored log (--follow to tail it until the job ends)
  publish <dir> <name>@<ver> publish a directory as a package version
  install <name>[@range] <dir>  install a package and its dependencies into a directory

Run 'runner-depot <command> --help' for a command's options.`;

runCli(process.argv.slice(2), commands, USAGE).then(
  (code) => {
    process.exitCode = code;
  },
  (error: unknown) => {
    const message = error instanceof CliError ? error.message : error instanceof Error ? error.message : String(error);
    process.stderr.write(`runner-depot: ${message.split("\n")[0]}\n`);
    process.exitCode = error instanceof CliError ? error.exitCode : 1;
  },
);
