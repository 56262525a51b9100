/**
 * Cloud-init user data for a runner VM: the orchestrator renders it (endpoint, request
 * ID, per-job token, job command) and the agent inside the VM reads the job config back.
 */
import { readFile } from "node:fs/promises";
import { stringify } from "yaml";
import { RunnerDepotError } from "../errors.js";
import { isRequestId } from "./uuid.js";

/** Where the job config is written on the VM, unless told otherwise. */
export const DEFAULT_JOB_CONFIG_PATH = "/etc/runner-depot/job.json";

/** The job config the agent reads on the VM (JSON, mode 0600: it holds the token). */
export interface JobConfig {
  /** Format version of this file. */
  version: 1;
  /** The orchestrator's gRPC endpoint, `http://host:port` or `https://host:port`. */
  endpoint: string;
  /** The job's UUID, lower-case. */
  requestId: string;
  /** Per-job token (`mintJobToken`); empty for an open server. */
  token: string;
  repoUrl: string;
  commitSha: string;
  /** Program to run. */
  command: string;
  /** Its arguments. */
  args: string[];
  /** Working directory; default the agent's. */
  cwd?: string;
  /** Extra environment variables for the job. */
  env?: Record<string, string>;
  /** CA certificate (PEM) to trust for an `https://` endpoint signed by a private CA. */
  ca?: string;
}

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

/**
 * Reads and validates the job config on the VM.
 *
 * @example
 * const job = await readJobConfig();
 * const client = createRunnerClient({ endpoint: job.endpoint, requestId: job.requestId, token: job.token });
 */
export async function readJobConfig(path: string = DEFAULT_JOB_CONFIG_PATH): Promise<JobConfig> {
  let text: string;
  try {
    text = await readFile(path, "utf8");
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    throw new RunnerDepotError(code === "ENOENT" ? "NOT_FOUND" : "INVALID_ARGUMENT", `job config ${path}: cannot read it (${code ?? String(e)})`, { cause: e });
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (e) {
    throw new RunnerDepotError("INVALID_ARGUMENT", `job config ${path}: not valid JSON`, { cause: e });
  }
  return validateJobConfig(value, `job config ${path}`);
}

function validateJobConfig(value: unknown, where: string): JobConfig {
  const bad = (message: string) => new RunnerDepotError("INVALID_ARGUMENT", `${where}: ${message}`);
  if (typeof value !== "object" || value === null || Array.isArray(value)) throw bad("expected a JSON object");
  const v = value as Record<string, unknown>;
  if (v.version !== 1) throw bad(`unsupported version ${JSON.stringify(v.version)} (expected 1)`);
  const str = (name: string, required: boolean) => {
    const x = v[name];
    if (x === undefined && !required) return;
    if (typeof x !== "string") throw bad(`${name} must be a string`);
  };
  str("endpoint", true);
  let url: URL;
  try {
    url = new URL(v.endpoint as string);
  } catch {
    throw bad(`endpoint is not a URL: ${JSON.stringify(v.endpoint)}`);
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") throw bad(`endpoint must be http:// or https://, got ${url.protocol}`);
  str("requestId", true);
  if (!isRequestId(v.requestId as string)) throw bad(`requestId is not a UUID: ${JSON.stringify(v.requestId)}`);
  str("token", true);
  str("repoUrl", true);
  str("commitSha", true);
  str("command", true);
  if ((v.command as string).length === 0) throw bad("command is empty");
  if (!Array.isArray(v.args) || !v.args.every((a) => typeof a === "string")) throw bad("args must be an array of strings");
  str("cwd", false);
  str("ca", false);
  if (v.env !== undefined) {
    if (typeof v.env !== "object" || v.env === null || Array.isArray(v.env)) throw bad("env must be an object of strings");
    for (const [k, x] of Object.entries(v.env)) if (typeof x !== "string") throw bad(`env.${k} must be a string`);
  }
  return { ...(v as unknown as JobConfig), requestId: (v.requestId as string).toLowerCase() };
}
