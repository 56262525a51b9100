/**
 * Cloud-init user data for a runner VM: the orchestrator renders it (endpoint, request
 * ID, per-job token, job command) and the agent inside the VM reads the job config back.
 */
import { isIP } from "node:net";
import { Scalar, stringify } from "yaml";
import { RunnerDepotError } from "../../errors.js";
import { isLoopbackHost } from "../../loopback.js";
import { DEFAULT_JOB_CONFIG_PATH, validateJobConfig, type JobConfig } from "./job-config.js";
import { AGENT_DIR, FETCH_AGENT_SCRIPT } from "./fetch-agent-script.js";

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
  /**
   * The single-file agent to fetch into the VM: the URL of its depot archive
   * (`<depot>/data/runner-depot-agent-<platform>@<version>`) and that archive's SHA-256
   * (hex, or `sha256:<hex>` as `GET /version` answers it). The VM fetches it with curl,
   * wget or python3, checks the digest and runs nothing on a mismatch. {@link agentFromDepot}
   * looks both up. Without it the VM runs `agentCommand`, which must be installed.
   */
  agent?: CloudInitAgent;
  /** How the VM starts the agent (argv); `--config <path>` is appended. Default `["runner-depot", "agent"]`. */
  agentCommand?: readonly string[];
  /** Where the job config goes on the VM. Default /etc/runner-depot/job.json. */
  configPath?: string;
  /**
   * Told of what will not work in a VM (a loopback endpoint or agent URL). Default:
   * `process.emitWarning` with the code `RUNNER_DEPOT_LOOPBACK`.
   */
  onWarning?: (message: string) => void;
}

/** Where the VM fetches the single-file agent, and the SHA-256 it must have. */
export interface CloudInitAgent {
  url: string;
  sha256: string;
}

const SHA256_HEX = /^(?:sha256:)?([0-9a-f]{64})$/;

/**
 * Characters cloud-init's YAML 1.1 parser (PyYAML) reads otherwise than the YAML 1.2 we
 * render: NEL, LS and PS are line breaks there (a raw LS in a block scalar ends it, and what
 * follows becomes cloud-config keys), DEL, C1 and U+FFFE/FFFF are refused. Why:
 * docs/decisions/single-file-agent.md, "User data read by YAML 1.1".
 */
const YAML11_UNSAFE = /[\u007f-\u009f\u2028\u2029\ufeff\ufffe\uffff]/g;

/** The job config as JSON with every {@link YAML11_UNSAFE} character escaped (`\uXXXX`): same value, safe bytes. */
function configJson(config: JobConfig): string {
  return JSON.stringify(config, null, 2).replace(
    YAML11_UNSAFE,
    (ch) => `\\u${ch.charCodeAt(0).toString(16).padStart(4, "0")}`,
  );
}

/**
 * A double-quoted scalar: a plain `yes`, `on`, `1:30`, `0b101`, `1_000`, `2001-12-14` (strings
 * in YAML 1.2) are a bool, numbers and a date to PyYAML, and a plain `=` fails the whole document.
 */
function quoted(value: string): Scalar<string> {
  const scalar = new Scalar(value);
  scalar.type = "QUOTE_DOUBLE";
  return scalar;
}

/** Refuses a path or argv element that cloud-init would read otherwise (control characters included). */
function plainText(value: string, what: string): string {
  if (/[\u0000-\u001f]/.test(value) || new RegExp(YAML11_UNSAFE.source).test(value))
    throw new RunnerDepotError("INVALID_ARGUMENT", `${what} holds a control or line-break character`);
  return value;
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
  const configPath = plainText(job.configPath ?? DEFAULT_JOB_CONFIG_PATH, "configPath");
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
  warnLoopback(job);
  const agent = job.agent
    ? agentFetch(job.agent, configPath)
    : [
        ...(job.agentCommand ?? ["runner-depot", "agent"]).map((a) => plainText(a, "agentCommand")),
        "--config",
        configPath,
      ];
  const doc = {
    write_files: [
      {
        path: quoted(configPath),
        // The file holds the job's token: readable by root only.
        permissions: "0600",
        owner: "root:root",
        content: `${configJson(config)}\n`,
      },
    ],
    // The script stays a readable block; every other element is quoted (see quoted()).
    runcmd: [agent.map((arg) => (arg === FETCH_AGENT_SCRIPT ? arg : quoted(arg)))],
  };
  return `#cloud-config\n${stringify(doc, { lineWidth: 0 })}`;
}

/** `sh -c` with the fetch script and its arguments: checked here, so the VM never gets a bad digest. */
function agentFetch(agent: CloudInitAgent, configPath: string): string[] {
  const digest = SHA256_HEX.exec(agent.sha256.toLowerCase())?.[1];
  if (!digest) throw new RunnerDepotError("INVALID_ARGUMENT", "agent.sha256 must be 64 hex digits (or sha256:<hex>)");
  let url: URL;
  try {
    url = new URL(agent.url);
  } catch {
    throw new RunnerDepotError("INVALID_ARGUMENT", `agent.url is not a URL: ${agent.url}`);
  }
  if (url.protocol !== "http:" && url.protocol !== "https:")
    throw new RunnerDepotError("INVALID_ARGUMENT", `agent.url must be http:// or https://, got ${url.protocol}`);
  return ["/bin/sh", "-c", FETCH_AGENT_SCRIPT, "runner-depot-fetch-agent", url.href, digest, configPath, AGENT_DIR];
}

/**
 * Loopback, and what a VM also reaches itself at: the unspecified address (a server bound
 * to 0.0.0.0 reports it as its URL; Linux connects it to the local host) and `localhost`
 * names (`localhost.`, `*.localhost`, RFC 6761). Not isLoopbackHost: binding 0.0.0.0 is
 * not loopback for the servers' open-router check.
 */
function vmReachesItself(hostname: string): boolean {
  const h = hostname
    .toLowerCase()
    .replace(/^\[(.*)\]$/, "$1")
    .replace(/\.$/, "");
  if (h === "localhost" || h.endsWith(".localhost")) return true;
  if (isIP(h) !== 0 && (h === "0.0.0.0" || /^[0:]+$/.test(h))) return true;
  return isLoopbackHost(h);
}

/** A VM reaching 127.0.0.1 reaches itself: say so once per rendering, rather than let it retry for minutes. */
function warnLoopback(job: CloudInitJob): void {
  const warn = job.onWarning ?? ((message: string) => process.emitWarning(message, { code: "RUNNER_DEPOT_LOOPBACK" }));
  const loopback = (text: string) => {
    try {
      return vmReachesItself(new URL(text).hostname);
    } catch {
      return false;
    }
  };
  if (loopback(job.endpoint))
    warn(
      `the runner endpoint ${job.endpoint} is a loopback address: a VM reaches itself there, not the orchestrator; give the address the VM reaches (serve --public-runner-url)`,
    );
  if (job.agent && loopback(job.agent.url))
    warn(
      `the agent URL ${job.agent.url} is a loopback address: a VM reaches itself there, not the depot; give the address the VM reaches (serve --public-depot-url)`,
    );
}
