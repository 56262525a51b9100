/** `runner-depot agent`: the VM side — reads the job config (or flags), runs the command, streams it, exits with its exit code. */
import { readFile } from "node:fs/promises";
import { createRunnerClient, isRequestId, readJobConfig, runJob, DEFAULT_JOB_CONFIG_PATH, type JobConfig } from "../runner/index.js";
import { CliError, requireString, type Command } from "./args.js";

const usage = `Usage: runner-depot agent [options] [-- <command> [args…]]

Runs a job and streams every output line, then its end, to the orchestrator. Reads
the job from the config file cloud-init wrote (default ${DEFAULT_JOB_CONFIG_PATH}),
or from flags and the command after --. Exits with the job's exit code (128 + signal
number when a signal killed it); 1 when the orchestrator could not be told.

Options:
  --config <file>      job config written by cloud-init
  --endpoint <url>     runner endpoint (http://host:port or https://…)
  --request-id <uuid>  the job's request ID
  --token <token>      the job's token (default $RUNNER_DEPOT_JOB_TOKEN; none for an open server)
  --repo <url>         repository URL for the job result
  --commit <sha>       commit for the job result
  --cwd <dir>          working directory of the job
  --ca <file>          CA certificate (PEM) to trust for an https endpoint
  --cert <file>        client certificate (PEM) for mutual TLS
  --key <file>         client key (PEM) for mutual TLS`;

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
  },
  async run(values, positionals) {
    const job = await jobFrom(values, positionals);
    // A private CA comes from --ca, else from the job config cloud-init wrote.
    const ca = values.ca ? await readFile(String(values.ca)) : job.ca;
    const tls = ca || values.cert ? {
      ca,
      cert: values.cert ? await readFile(String(values.cert)) : undefined,
      key: values.key ? await readFile(String(values.key)) : undefined,
    } : undefined;
    const client = createRunnerClient({
      endpoint: job.endpoint,
      requestId: job.requestId,
      token: job.token,
      tls,
      onRetry: (error, delayMs) => process.stderr.write(`runner-depot agent: ${error.message}; retrying in ${Math.round(delayMs)} ms\n`),
    });
    const stopped = client.onStop((stop) => {
      process.stderr.write(`runner-depot agent: the orchestrator stopped the job (${stop.reason}${stop.error ? `: ${stop.error.message}` : ""})\n`);
    });
    try {
      const exitCode = await runJob(client, {
        command: job.command,
        args: job.args,
        cwd: job.cwd,
        env: job.env ? { ...process.env, ...job.env } : undefined,
        repoUrl: job.repoUrl,
        commitSha: job.commitSha,
      });
      return exitCode;
    } finally {
      stopped();
      await client.close();
    }
  },
};

async function jobFrom(values: Record<string, unknown>, positionals: string[]): Promise<JobConfig> {
  if (typeof values.config === "string" || (values.endpoint === undefined && positionals.length === 0)) {
    try {
      return await readJobConfig(typeof values.config === "string" ? values.config : undefined);
    } catch (error) {
      throw new CliError(`${(error as Error).message}; pass --config <file>, or --endpoint, --request-id, --token and the command after --`, 2);
    }
  }
  if (positionals.length === 0) throw new CliError("give the job's command after --, e.g. 'runner-depot agent … -- make test'", 2);
  // An open server (no secret) needs no token; the server says UNAUTHENTICATED otherwise.
  const token = (typeof values.token === "string" ? values.token : process.env.RUNNER_DEPOT_JOB_TOKEN) ?? "";
  const requestId = requireString(values, "request-id", "the job's UUID from 'runner-depot job'");
  if (!isRequestId(requestId)) throw new CliError(`--request-id must be a UUID (8-4-4-4-12 hex), got '${requestId}'`, 2);
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
