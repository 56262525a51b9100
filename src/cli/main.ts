#!/usr/bin/env node
/**
 * The `runner-depot` command: `serve`, `job`, `agent`, `logs`, `jobs`, `cancel`,
 * `publish`, `install`, `migrate`, `keys`, `verify`, and `--version`.
 * Exit codes: 0 success, 1 failure, 2 usage. Errors are one line saying what to do.
 */
// First: refuses an unsupported Node before anything else loads.
import "./node-gate.js";
import { CliError, runCli } from "./args.js";
import { loadServe } from "./serve/serve-packages.js";

// Loaded on demand, so each command pulls in only what it uses.
const commands = {
  // serve alone needs the optional peers (pino, the OpenTelemetry SDK): named when missing.
  serve: async () => (await loadServe(() => import("./serve/serve.js"))).serveCommand,
  job: async () => (await import("./runner/job.js")).jobCommand,
  agent: async () => (await import("./runner/agent.js")).agentCommand,
  logs: async () => (await import("./runner/logs.js")).logsCommand,
  jobs: async () => (await import("./runner/jobs.js")).jobsCommand,
  cancel: async () => (await import("./runner/jobs.js")).cancelCommand,
  publish: async () => (await import("./depot/depot.js")).publishCommand,
  install: async () => (await import("./depot/depot.js")).installCommand,
  migrate: async () => (await import("./serve/migrate.js")).migrateCommand,
  "console-url": async () => (await import("./runner/console-url.js")).consoleUrlCommand,
  keys: async () => (await import("./depot/signing.js")).keysCommand,
  verify: async () => (await import("./depot/signing.js")).verifyCommand,
  mirror: async () => (await import("./depot/mirror.js")).mirrorCommand,
  retention: async () => (await import("./depot/retention.js")).retentionCommand,
};

const USAGE = `runner-depot — runner log streaming (gRPC) and a package depot (REST)

Usage: runner-depot <command> [options]

Commands:
  serve                      run the orchestrator side: runner service + depot (embedded defaults)
  job                        create a job on a running server and print its cloud-init user data
  agent                      run a job inside the VM and stream its output (exits with its exit code)
  logs <requestId>           print a job's stored log (--follow to tail it until the job ends)
  jobs                       list jobs, newest first, with state, outcome and exit code
  cancel <requestId>         cancel an open job (its agent stops the command)
  publish <dir> <name>@<ver> publish a directory as a package version
  install <name>[@range] <dir>  install a package and its dependencies into a directory
  migrate <data>             upgrade a depot store written by an older runner-depot, in place
  console-url                print a new one-time login URL for the running server's console
  keys generate              make an Ed25519 signing key and print its trusted-keys entry
  verify <name>@<version>    check a version's signatures and provenance; print who signed what
  mirror <upstream-url>      copy another depot's versions and yanks into this one (--follow to keep on)
  retention                  remove old, prerelease or unused versions from the running server's depot

Run 'runner-depot <command> --help' for a command's options, 'runner-depot --version'
for the version.`;

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
