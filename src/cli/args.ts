/**
 * Argument parsing and dispatch shared by the CLI's subcommands (node:util parseArgs),
 * and the local state file that lets `job`, `logs`, `publish` and `install` find a
 * server started by `serve` without flags.
 */
import { readFile } from "node:fs/promises";
import path from "node:path";
import { parseArgs, type ParseArgsConfig } from "node:util";

/** An error the CLI reports on one line; exit code 2 for usage, 1 otherwise. */
export class CliError extends Error {
  constructor(
    message: string,
    readonly exitCode: 1 | 2 = 1,
  ) {
    super(message);
  }
}

/** One subcommand: its help text, its options, and what it does. */
export interface Command {
  usage: string;
  options: NonNullable<ParseArgsConfig["options"]>;
  run(values: Record<string, string | boolean | string[] | undefined>, positionals: string[]): Promise<number>;
}

/** Parses argv, prints help or usage errors, and runs the named subcommand. */
export async function runCli(argv: string[], commands: Record<string, Command>, usage: string): Promise<number> {
  const [name, ...rest] = argv;
  if (!name) {
    // No command is a usage error: the text goes where errors go.
    process.stderr.write(`${usage}\n`);
    return 2;
  }
  if (name === "--help" || name === "-h" || name === "help") {
    process.stdout.write(`${usage}\n`);
    return 0;
  }
  const command = commands[name];
  if (!command) throw new CliError(`unknown command '${name}'; run 'runner-depot --help' for the list`, 2);
  let parsed;
  try {
    parsed = parseArgs({
      args: rest,
      options: { ...command.options, help: { type: "boolean", short: "h" } },
      allowPositionals: true,
      strict: true,
    });
  } catch (error) {
    throw new CliError(`${(error as Error).message.split("\n")[0]}; run 'runner-depot ${name} --help'`, 2);
  }
  if (parsed.values.help) {
    process.stdout.write(`${command.usage}\n`);
    return 0;
  }
  return command.run(parsed.values as Record<string, string | boolean | string[] | undefined>, parsed.positionals);
}

/** Default data directory of `serve` (and where the other commands look for it). */
export const DEFAULT_DATA_DIR = ".runner-depot";

/** What `serve` writes to `<data>/serve.json` for the other commands on the same machine. */
export interface ServeState {
  runnerUrl: string;
  depotUrl: string;
  /** Bearer token for publishing and for the job/log control endpoints. */
  adminToken: string;
  pid: number;
}

/** Reads `<data>/serve.json`, or null when no server wrote one. */
export async function readServeState(dataDir: string): Promise<ServeState | null> {
  try {
    return JSON.parse(await readFile(path.join(dataDir, "serve.json"), "utf8")) as ServeState;
  } catch {
    return null;
  }
}

/** A string option, or throws a usage error naming it. */
export function requireString(values: Record<string, unknown>, name: string, hint: string): string {
  const value = values[name];
  if (typeof value !== "string" || value === "") throw new CliError(`--${name} is required: ${hint}`, 2);
  return value;
}

/** Parses a port option (0–65535). */
export function portOption(value: unknown, name: string, fallback: number): number {
  if (value === undefined) return fallback;
  const port = Number(value);
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw new CliError(`--${name} must be a port number (0-65535), got '${String(value)}'`, 2);
  return port;
}

/** The server URL and admin token for the client commands: flags first, then `<data>/serve.json`. */
export async function serverTarget(
  values: Record<string, unknown>,
  which: "depotUrl" | "runnerUrl",
): Promise<{ url: string; token: string | undefined }> {
  const dataDir = typeof values.data === "string" ? values.data : DEFAULT_DATA_DIR;
  const state = await readServeState(dataDir);
  const url = (typeof values.url === "string" ? values.url : undefined) ?? state?.[which];
  if (!url) throw new CliError(`no server given: pass --url, or start 'runner-depot serve' here first (it writes ${dataDir}/serve.json)`, 2);
  const token = (typeof values.token === "string" ? values.token : undefined) ?? process.env.RUNNER_DEPOT_TOKEN ?? state?.adminToken;
  return { url: url.replace(/\/$/, ""), token };
}

/** Imports an adapter whose backend client is an optional peer dependency, saying how to install it when missing. */
export async function importAdapter<T>(load: () => Promise<T>, peer: string): Promise<T> {
  try {
    return await load();
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ERR_MODULE_NOT_FOUND" || (error as NodeJS.ErrnoException).code === "MODULE_NOT_FOUND") {
      throw new CliError(`this backend needs the optional dependency ${peer}: run 'npm install ${peer}' next to runner-depot`);
    }
    throw error;
  }
}
