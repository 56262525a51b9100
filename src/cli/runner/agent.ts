/**
 * `runner-depot agent`: the VM side — reads the job config (or flags), runs the command, streams it, exits with its
 * exit code.
 */
import { readFile } from "node:fs/promises";
// The agent's modules one by one, not the runner barrel: the barrel's service, server and
// telemetry modules run code when loaded, so importing it cost the agent 1.7–3.6 s of
// start-up on a loaded 2-core machine before its credentials check could even begin.
import { runJob } from "../../runner/agent/run-job.js";
import { createRunnerClient } from "../../runner/client/runner-client.js";
import { DEFAULT_JOB_CONFIG_PATH, readJobConfig, type JobConfig } from "../../runner/agent/job-config.js";
import { checkJobCredentials } from "../../runner/client/credentials-probe.js";
import { isRequestId } from "../../runner/protocol/request-id.js";
import { CliError, requireString, type Command } from "../args.js";

/** How long the agent waits for a runner that does not answer at all, before not running the job. */
const DEFAULT_WAIT_SECONDS = 60;

const usage = `Usage: runner-depot agent [options] [-- <command> [args…]]

Runs a job and streams every output line, then its end, to the orchestrator, and
prints the lines here too (--quiet to not). Reads the job from the config file
cloud-init wrote (default ${DEFAULT_JOB_CONFIG_PATH}), or from flags and the command
after --. First checks the job's credentials with the runner in one short call: a
wrong token, an unknown job or a job already over stops the agent before the command
runs. When nothing answers at the runner's address (connection refused, DNS, no
answer), the check is retried for up to --wait seconds; past that the agent exits 1
without running the command. Exits with the job's exit code (128 + signal number when
a signal killed it); 1 when the runner refused the job, could not be reached, or could
not be told.

Options:
  --config <file>      job config written by cloud-init
  --endpoint <url>     runner endpoint (http://host:port or https://…)
  --request-id <uuid>  the job's request ID
  --token <token>      the job's token (default: the config's, else $RUNNER_DEPOT_JOB_TOKEN;
                       none for an open server)
  --repo <url>         repository URL for the job result
  --commit <sha>       commit for the job result
  --cwd <dir>          working directory of the job
  --ca <file>          CA certificate (PEM) to trust for an https endpoint
  --cert <file>        client certificate (PEM) for mutual TLS
  --key <file>         client key (PEM) for mutual TLS
  --wait <seconds>     how long to wait for the runner to answer before giving up
                       without running the command (default ${DEFAULT_WAIT_SECONDS})
  --quiet, -q          do not print the job's output here (it is still streamed)`;

export const agentCommand: Command = {
  usage,
  options: {
    config: { type: "string" },
    endpoint: { type: "string" },
    "request-id": { type: "string" },
    token: { type: "string" },
    repo: { type: "string" },
    commit: { type: "string" },
    cwd: { type: "string" },
    ca: { type: "string" },
    cert: { type: "string" },
    key: { type: "string" },
    quiet: { type: "boolean", short: "q" },
    wait: { type: "string" },
  },
  async run(values, positionals) {
    const job = await jobFrom(values, positionals);
    // --token wins over the config file's (a token re-issued after the VM was set up).
    if (typeof values.token === "string") job.token = values.token;
    // A private CA comes from --ca, else from the job config cloud-init wrote.
    const ca = values.ca ? await readFile(String(values.ca)) : job.ca;
    const tls =
      ca || values.cert
        ? {
            ca,
            cert: values.cert ? await readFile(String(values.cert)) : undefined,
            key: values.key ? await readFile(String(values.key)) : undefined,
          }
        : undefined;
    return runAgent(job, {
      tls,
      given: tokenSource(values, positionals),
      quiet: values.quiet === true,
      waitMs: waitMs(values.wait),
    });
  },
};

/**
 * Runs `job` as the agent does: checks its credentials, runs the command, streams it and
 * returns its exit code. `runner-depot job --run` calls it to play the VM locally.
 *
 * @example
 * const exitCode = await runAgent(config, { given: "the job config", quiet: false });
 */
export async function runAgent(
  job: JobConfig,
  options: {
    tls?: Parameters<typeof checkJobCredentials>[0]["tls"];
    given: string;
    quiet: boolean;
    /** How long to retry a check that nothing answers before not running the job; default 60 s. */
    waitMs?: number;
  },
): Promise<number> {
  const { tls } = options;
  {
    // Before anything runs: a wrong token must not cost the whole command (one short call).
    await checkBeforeRunning(job, tls, options.given, options.waitMs ?? DEFAULT_WAIT_SECONDS * 1000);
    const client = createRunnerClient({
      endpoint: job.endpoint,
      requestId: job.requestId,
      token: job.token,
      tls,
      onRetry: (error, delayMs) =>
        process.stderr.write(`runner-depot agent: ${error.message}; retrying in ${Math.round(delayMs)} ms\n`),
    });
    const stopped = client.onStop((stop) => {
      process.stderr.write(
        `runner-depot agent: the orchestrator stopped the job (${stop.reason}${stop.error ? `: ${stop.error.message}` : ""})\n`,
      );
    });
    try {
      const exitCode = await runJob(client, {
        command: job.command,
        args: job.args,
        cwd: job.cwd,
        env: job.env ? { ...process.env, ...job.env } : undefined,
        repoUrl: job.repoUrl,
        commitSha: job.commitSha,
        secrets: job.secrets,
        // Bytes, a write or so a pipe read where no line needs masking: a write a line cost the agent 3-4x its CPU a
        // line (BENCHMARKS.md, "Runner: per-line time").
        onOutput: options.quiet
          ? undefined
          : (bytes, stderr) => (stderr ? process.stderr : process.stdout).write(bytes),
      });
      return exitCode;
    } finally {
      stopped();
      await client.close();
    }
  }
}

/** Where the token came from, for the message when it is refused. */
function tokenSource(values: Record<string, unknown>, positionals: string[]): string {
  if (typeof values.token === "string") return "--token";
  if (typeof values.config === "string" || (values.endpoint === undefined && positionals.length === 0)) {
    return `the token in ${typeof values.config === "string" ? values.config : DEFAULT_JOB_CONFIG_PATH}`;
  }
  return process.env.RUNNER_DEPOT_JOB_TOKEN !== undefined ? "$RUNNER_DEPOT_JOB_TOKEN" : "no token";
}

/** `--wait <seconds>` in ms: a non-negative number, at most a day. */
function waitMs(value: unknown): number {
  if (value === undefined) return DEFAULT_WAIT_SECONDS * 1000;
  const seconds = Number(value);
  if (typeof value !== "string" || !/^\d+(\.\d+)?$/.test(value) || seconds > 86_400)
    throw new CliError(`--wait must be a number of seconds from 0 to 86400, got '${String(value)}'`, 2);
  return seconds * 1000;
}

/**
 * The credentials check, retried while nothing answers at all, for up to `waitMs` (a VM may
 * boot before its orchestrator listens). Refusals, a job already over and a runner that
 * never answered end the agent here, before spawning. Why the split: docs/decisions/runner-client.md,
 * "Credentials check". A check every ≤ 10 s (≤ 5 s each, then a pause ≤ 5 s) until the wait is over.
 */
async function checkBeforeRunning(
  job: JobConfig,
  tls: Parameters<typeof checkJobCredentials>[0]["tls"],
  given: string,
  waitMs: number,
): Promise<void> {
  const where = `the runner at ${job.endpoint}`;
  const deadline = Date.now() + waitMs;
  let pauseMs = 1000;
  let check: Awaited<ReturnType<typeof checkJobCredentials>>;
  for (;;) {
    const left = deadline - Date.now();
    check = await checkJobCredentials({
      endpoint: job.endpoint,
      requestId: job.requestId,
      token: job.token,
      tls,
      timeoutMs: Math.max(1000, Math.min(5000, left)),
    });
    if (check.status !== "unreachable" || check.answered) break;
    const after = deadline - Date.now();
    if (after <= 0) {
      throw new CliError(
        `cannot reach ${where} (${check.error.message}) within ${Math.round(waitMs / 1000)} s; check --endpoint and that the runner is up (--wait to wait longer); the command was not run`,
      );
    }
    const pause = Math.min(pauseMs, after);
    process.stderr.write(
      `runner-depot agent: cannot reach ${where} (${check.error.message}); trying again in ${Math.round(pause)} ms, for up to ${Math.ceil(after / 1000)} s more\n`,
    );
    await new Promise((r) => setTimeout(r, pause));
    pauseMs = Math.min(pauseMs * 2, 5000);
  }
  if (check.status === "ok") return;
  if (check.status === "unreachable") {
    // Something answered, badly (a broken proxy, INTERNAL, an over-long answer): the runner is
    // there, and the client's retries and spool cover a passing fault, as for any call.
    process.stderr.write(
      `runner-depot agent: cannot check the job's credentials with ${where} (${check.error.message}); running it anyway\n`,
    );
    return;
  }
  if (check.status === "ended") {
    throw new CliError(`job ${job.requestId} is already over on ${where} (${check.reason}); the command was not run`);
  }
  const { code, message } = check.error;
  if (check.error.details.tlsError !== undefined) {
    throw new CliError(`cannot connect to ${where} securely: ${message}; the command was not run`);
  }
  if (code === "UNAUTHENTICATED" || code === "PERMISSION_DENIED") {
    const fix = given === "no token" ? "no token was given" : `${given} was refused`;
    throw new CliError(
      `${where} refused the job's token (${code}: ${message}); ${fix}: pass the token 'runner-depot job' printed for ${job.requestId} with --token or $RUNNER_DEPOT_JOB_TOKEN; the command was not run`,
    );
  }
  if (code === "NOT_FOUND") {
    throw new CliError(
      `${where} does not know job ${job.requestId} (${message}); check --request-id and --endpoint; the command was not run`,
    );
  }
  throw new CliError(`${where} refused the job (${code}: ${message}); the command was not run`);
}

async function jobFrom(values: Record<string, unknown>, positionals: string[]): Promise<JobConfig> {
  if (typeof values.config === "string" || (values.endpoint === undefined && positionals.length === 0)) {
    try {
      return await readJobConfig(typeof values.config === "string" ? values.config : undefined);
    } catch (error) {
      throw new CliError(
        `${(error as Error).message}; pass --config <file>, or --endpoint, --request-id, --token and the command after --`,
        2,
      );
    }
  }
  if (positionals.length === 0)
    throw new CliError("give the job's command after --, e.g. 'runner-depot agent … -- make test'", 2);
  // An open server (no secret) needs no token; the server says UNAUTHENTICATED otherwise.
  const token = (typeof values.token === "string" ? values.token : process.env.RUNNER_DEPOT_JOB_TOKEN) ?? "";
  const requestId = requireString(values, "request-id", "the job's UUID from 'runner-depot job'");
  if (!isRequestId(requestId))
    throw new CliError(`--request-id must be a UUID (8-4-4-4-12 hex), got '${requestId}'`, 2);
  return {
    version: 1,
    endpoint: requireString(values, "endpoint", "the runner URL, e.g. http://127.0.0.1:50051"),
    requestId,
    token,
    repoUrl: typeof values.repo === "string" ? values.repo : "",
    commitSha: typeof values.commit === "string" ? values.commit : "",
    command: positionals[0]!,
    args: positionals.slice(1),
    cwd: typeof values.cwd === "string" ? values.cwd : undefined,
  };
}
