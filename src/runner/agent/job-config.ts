/**
 * The job config the agent reads on the VM (runner/agent/cloud-init.ts writes it): apart from the
 * renderer, so the agent's start-up loads no YAML library (loading yaml cost 0.2–0.7 s
 * of the agent's start on the loaded 2-core machine, before its credentials check).
 */
import { readFile } from "node:fs/promises";
import { RunnerDepotError } from "../../errors.js";
import { isRequestId } from "../protocol/request-id.js";
import { checkSecret } from "../masking/secret-masker.js";

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
  /** Secret values the agent masks in every line (docs/runner-protocol.md §14); each at least 4 bytes. */
  secrets?: string[];
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
    throw new RunnerDepotError(
      code === "ENOENT" ? "NOT_FOUND" : "INVALID_ARGUMENT",
      `job config ${path}: cannot read it (${code ?? String(e)})`,
      { cause: e },
    );
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (e) {
    throw new RunnerDepotError("INVALID_ARGUMENT", `job config ${path}: not valid JSON`, { cause: e });
  }
  return validateJobConfig(jobConfigOf(value, path), `job config ${path}`);
}

/**
 * The job config in what was read: the file itself, or the `config` of `runner-depot job
 * --json` output saved to a file (`{requestId, token, endpoint, userData, config}`).
 */
function jobConfigOf(value: unknown, path: string): unknown {
  if (typeof value !== "object" || value === null || !("userData" in value) || "version" in value) return value;
  if ("config" in value) return value.config;
  throw new RunnerDepotError(
    "INVALID_ARGUMENT",
    `job config ${path}: this is 'runner-depot job --json' output without its "config" field (an older server?); take the job config from its userData's write_files, or run the job here with 'runner-depot job --run -- <command>'`,
  );
}

/** Checks a job config's fields (runner/agent/cloud-init.ts checks what it renders the same way). */
export function validateJobConfig(value: unknown, where: string): JobConfig {
  const bad = (message: string) => new RunnerDepotError("INVALID_ARGUMENT", `${where}: ${message}`);
  if (typeof value !== "object" || value === null || Array.isArray(value)) throw bad("expected a JSON object");
  const v = value as Record<string, unknown>;
  if (v.version === undefined)
    throw bad(
      `no "version" field: not a job config (expected {"version": 1, "endpoint", "requestId", "token", "command", …} as cloud-init writes it)`,
    );
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
  if (url.protocol !== "http:" && url.protocol !== "https:")
    throw bad(`endpoint must be http:// or https://, got ${url.protocol}`);
  str("requestId", true);
  if (!isRequestId(v.requestId as string)) throw bad(`requestId is not a UUID: ${JSON.stringify(v.requestId)}`);
  str("token", true);
  str("repoUrl", true);
  str("commitSha", true);
  str("command", true);
  if ((v.command as string).length === 0) throw bad("command is empty");
  if (!Array.isArray(v.args) || !v.args.every((a) => typeof a === "string"))
    throw bad("args must be an array of strings");
  str("cwd", false);
  str("ca", false);
  if (v.env !== undefined) {
    if (typeof v.env !== "object" || v.env === null || Array.isArray(v.env))
      throw bad("env must be an object of strings");
    for (const [k, x] of Object.entries(v.env)) if (typeof x !== "string") throw bad(`env.${k} must be a string`);
  }
  if (v.secrets !== undefined) {
    if (!Array.isArray(v.secrets) || !v.secrets.every((x) => typeof x === "string"))
      throw bad("secrets must be an array of strings");
    v.secrets.forEach((x: string, i) => {
      try {
        checkSecret(x);
      } catch (e) {
        // The message names the secret by position and size only, never by value.
        throw bad(`secrets[${i}]: ${(e as Error).message}`);
      }
    });
  }
  return { ...(v as unknown as JobConfig), requestId: (v.requestId as string).toLowerCase() };
}
