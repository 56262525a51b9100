/**
 * Cloud-init user data for a runner VM: the orchestrator renders it (endpoint, request
 * ID, per-job token, job command) and the agent inside the VM reads the job config back.
 */
import { stringify } from "yaml";
import { RunnerDepotError } from "../../errors.js";
import { DEFAULT_JOB_CONFIG_PATH, validateJobConfig, type JobConfig } from "./job-config.js";

// The agent's side lives in runner/agent/job-config.ts, so reading the config never loads yaml.
export { DEFAULT_JOB_CONFIG_PATH, readJobConfig, type JobConfig } from "./job-config.js";

/** What {@link renderCloudInit} needs. */
export interface CloudInitJob {
  endpoint: string;
  requestId: string;
  token: string;
  repoUrl?: string;
  commitSha?: string;
  /**
   * The job: an argv array (run as is), or a string run by `/bin/sh -c` when `args` is
   * not given.
   */
  command: string | readonly string[];
  /** Arguments when `command` is a program name. */
  args?: readonly string[];
  cwd?: string;
  env?: Record<string, string>;
  /** CA certificate (PEM) the agent trusts for an `https://` endpoint. */
  ca?: string;
  /**
   * Secret values the agent masks in every line before it leaves the VM (pass the same ones to
   * `expectJob`, so the service masks them again); each at least 4 bytes, else INVALID_ARGUMENT.
   */
  secrets?: readonly string[];
  /** How the VM starts the agent (argv); `--config <path>` is appended. Default `["runner-depot", "agent"]`. */
  agentCommand?: readonly string[];
  /** Where the job config goes on the VM. Default /etc/runner-depot/job.json. */
  configPath?: string;
}

/**
 * Renders `#cloud-config` user data that writes the job config (mode 0600) and starts the agent.
 *
 * @example
 * const userData = renderCloudInit({
 *   endpoint: "https://orchestrator.internal:50051", requestId, token: mintJobToken(secret, requestId),
 *   repoUrl, commitSha, command: ["make", "test"],
 * });
 */
export function renderCloudInit(job: CloudInitJob): string {
  const configPath = job.configPath ?? DEFAULT_JOB_CONFIG_PATH;
  let command: string;
  let args: string[];
  if (typeof job.command === "string") {
    if (job.command.trim() === "") throw new RunnerDepotError("INVALID_ARGUMENT", "command is empty");
    if (job.args !== undefined) {
      command = job.command;
      args = [...job.args];
    } else {
      command = "/bin/sh";
      args = ["-c", job.command];
    }
  } else {
    if (job.command.length === 0) throw new RunnerDepotError("INVALID_ARGUMENT", "command: the argv array is empty");
    command = job.command[0]!;
    args = [...job.command.slice(1), ...(job.args ?? [])];
  }
  const config: JobConfig = {
    version: 1,
    endpoint: job.endpoint,
    requestId: job.requestId.toLowerCase(),
    token: job.token,
    repoUrl: job.repoUrl ?? "",
    commitSha: job.commitSha ?? "",
    command,
    args,
    ...(job.cwd !== undefined ? { cwd: job.cwd } : {}),
    ...(job.env !== undefined ? { env: { ...job.env } } : {}),
    ...(job.ca !== undefined ? { ca: job.ca } : {}),
    ...(job.secrets !== undefined && job.secrets.length > 0 ? { secrets: [...job.secrets] } : {}),
  };
  // Validate what we hand to a VM now, not when the VM fails to start the job.
  validateJobConfig(config, "renderCloudInit");
  const agent = [...(job.agentCommand ?? ["runner-depot", "agent"]), "--config", configPath];
  const doc = {
    write_files: [
      {
        path: configPath,
        // The file holds the job's token: readable by root only.
        permissions: "0600",
        owner: "root:root",
        content: `${JSON.stringify(config, null, 2)}\n`,
      },
    ],
    runcmd: [agent],
  };
  return `#cloud-config\n${stringify(doc, { lineWidth: 0 })}`;
}
