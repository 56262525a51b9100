/** `runner-depot job`: creates a job on a running server and prints the VM's cloud-init user data. */
import { fetchFailureCause } from "../../fetch-failure.js";
import { cliFetch } from "../timed-fetch.js";
import { CliError, serverTarget, type Command } from "../args.js";
import type { CreateJobResponse } from "../serve/control.js";
import type { JobConfig } from "../../runner/agent/job-config.js";

const usage = `Usage: runner-depot job [options] -- <command> [args…]

Creates a job on the server started by 'runner-depot serve' (a fresh request ID, its
token, registered for lost-job detection) and prints the #cloud-config user data to
hand to the VM. The request ID goes to stderr (and with --json, everything to stdout).
With --run, plays the VM locally instead: runs the command here as the agent would.

Options:
  --repo <url>       repository URL (context for the job result)
  --commit <sha>     commit (context for the job result)
  --publish <glob>   a package the job may publish with its own credentials, e.g.
                     'tool' or 'tool-*' (repeatable); its versions get the server's
                     signed provenance (repository, commit, request ID, log digest)
  --secret-env <NAME>  an environment variable of this command whose value is a
                     secret of the job (repeatable): masked in every line by the agent
                     and again by the server (docs/runner-protocol.md §14); given by
                     name so the value never appears in a process list
  --url <url>        server (depot) URL (default: from <data>/serve.json)
  --token <token>    admin token (default: $RUNNER_DEPOT_TOKEN or <data>/serve.json)
  --data <dir>       where 'serve' keeps its data (default ./.runner-depot)
  --platform <p>     the VM's platform, for the single-file agent it fetches from the
                     depot: linux-x64 (default) or linux-arm64
  --json             print {requestId, token, endpoint, userData, agent, warnings, config}
                     as JSON; its config is the job config ('runner-depot agent --config'
                     reads the whole output too)
  --run              play the VM here: create the job, then run it as its agent would
                     (streams the output, exits with the job's exit code)

A warning goes to stderr when the VM would be sent to a loopback address (start serve
with --public-runner-url and --public-depot-url as the VM reaches them).`;

export const jobCommand: Command = {
  usage,
  options: {
    repo: { type: "string" },
    commit: { type: "string" },
    publish: { type: "string", multiple: true },
    "secret-env": { type: "string", multiple: true },
    url: { type: "string" },
    token: { type: "string" },
    data: { type: "string" },
    platform: { type: "string" },
    json: { type: "boolean" },
    run: { type: "boolean" },
  },
  async run(values, positionals) {
    if (positionals.length === 0)
      throw new CliError("give the job's command after --, e.g. 'runner-depot job -- make test'", 2);
    const secrets = secretsFromEnv(values["secret-env"]);
    const { url, token } = await serverTarget(values, "depotUrl");
    const response = await cliFetch(`${url}/-/jobs`, {
      method: "POST",
      headers: { "content-type": "application/json", ...(token ? { authorization: `Bearer ${token}` } : {}) },
      body: JSON.stringify({
        command: positionals,
        repoUrl: values.repo ?? "",
        commitSha: values.commit ?? "",
        ...(values.publish ? { publish: values.publish } : {}),
        ...(secrets.length > 0 ? { secrets } : {}),
        ...(typeof values.platform === "string" ? { platform: values.platform } : {}),
      }),
    }).catch((error: Error) => {
      throw new CliError(`cannot reach ${url}: ${fetchFailureCause(error)}; is 'runner-depot serve' running?`);
    });
    if (!response.ok) {
      const problem = (await response.json().catch(() => ({}))) as { detail?: string };
      throw new CliError(`the server refused the job (${response.status}): ${problem.detail ?? response.statusText}`);
    }
    const job = (await response.json()) as CreateJobResponse;
    // The job config cloud-init writes on the VM, as the agent reads it.
    const config: JobConfig = {
      version: 1,
      endpoint: job.endpoint,
      requestId: job.requestId,
      token: job.token,
      repoUrl: typeof values.repo === "string" ? values.repo : "",
      commitSha: typeof values.commit === "string" ? values.commit : "",
      command: positionals[0]!,
      args: positionals.slice(1),
      ...(secrets.length > 0 ? { secrets } : {}),
    };
    if (values.run) {
      process.stderr.write(`job ${job.requestId} created; running it here as its agent would\n`);
      const { runAgent } = await import("./agent.js");
      return runAgent(config, { given: "the token the server minted", quiet: false });
    }
    if (values.json) {
      process.stdout.write(`${JSON.stringify({ ...job, config })}\n`);
    } else {
      // With --json they are in the answer. A server older than the warnings answers none.
      for (const warning of job.warnings ?? []) process.stderr.write(`runner-depot job: warning: ${warning}\n`);
      process.stdout.write(job.userData.endsWith("\n") ? job.userData : `${job.userData}\n`);
      process.stderr.write(
        `job ${job.requestId} created; follow it with 'runner-depot logs ${job.requestId} --follow'\n`,
      );
    }
    return 0;
  },
};

/** The values of the environment variables `--secret-env` names; a missing or empty one is a usage error. O(names). */
function secretsFromEnv(names: unknown): string[] {
  if (!Array.isArray(names)) return [];
  return names.map((name: string) => {
    const value = process.env[name];
    if (value === undefined || value === "")
      throw new CliError(`--secret-env ${name}: no such environment variable (or it is empty)`, 2);
    return value;
  });
}
