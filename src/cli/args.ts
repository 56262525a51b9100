/**
 * Argument parsing and dispatch shared by the CLI's subcommands (node:util parseArgs),
 * and the local state file that lets `job`, `logs`, `publish` and `install` find a
 * server started by `serve` without flags.
 */
import { readFile } from "node:fs/promises";
import path from "node:path";
import { parseArgs, type ParseArgsConfig } from "node:util";
import { packageVersion } from "./version.js";

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

/**
 * Parses argv, prints help or usage errors, and runs the named subcommand. Commands are
 * loaded on demand: `--version` or `agent` does not load the depot, the server or the
 * backends (seconds of start-up on a busy machine).
 */
export async function runCli(
  argv: string[],
  commands: Record<string, () => Promise<Command>>,
  usage: string,
): Promise<number> {
  const [name, ...rest] = argv;
  if (!name) {
    // No command is a usage error: the text goes where errors go.
    process.stderr.write(`${usage}\n`);
    return 2;
  }
  if (name === "--version" || name === "-V" || name === "version") {
    process.stdout.write(`runner-depot ${packageVersion()}\n`);
    return 0;
  }
  if (name === "--help" || name === "-h" || name === "help") {
    process.stdout.write(`${usage}\n`);
    return 0;
  }
  const load = Object.hasOwn(commands, name) ? commands[name] : undefined;
  if (!load) throw new CliError(`unknown command '${name}'; run 'runner-depot --help' for the list`, 2);
  const command = await load();
  const options = { ...command.options, help: { type: "boolean", short: "h" } } as const;
  // `--token -abc` means the value -abc (one job token in 64 starts with '-').
  const args = bindDashValues(rest, options);
  // Our own messages first: Node's parser speaks of its own API ("place it after '--'").
  checkOptions(name, args, options);
  let parsed;
  try {
    parsed = parseArgs({ args, options, allowPositionals: true, strict: true });
  } catch (error) {
    throw new CliError(`${(error as Error).message.split("\n")[0]}; run 'runner-depot ${name} --help'`, 2);
  }
  if (parsed.values.help) {
    process.stdout.write(`${command.usage}\n`);
    return 0;
  }
  return command.run(parsed.values as Record<string, string | boolean | string[] | undefined>, parsed.positionals);
}

/**
 * Refuses unknown options, missing values and values given to switches with a message
 * naming the command and its options. Stops at `--` (the rest is a job's command).
 */
export function checkOptions(command: string, args: readonly string[], options: Command["options"]): void {
  const names = Object.keys(options);
  const byShort = new Map(Object.entries(options).flatMap(([long, o]) => (o.short ? [[o.short, long] as const] : [])));
  const known = names
    .filter((n) => n !== "help")
    .map((n) => `--${n}`)
    .join(", ");
  const help = `run 'runner-depot ${command} --help'`;
  for (let i = 0; i < args.length; i++) {
    const arg = args[i]!;
    if (arg === "--") return;
    if (!arg.startsWith("-") || arg === "-") continue;
    let long: string | undefined;
    let inline = false;
    if (arg.startsWith("--")) {
      const eq = arg.indexOf("=");
      long = arg.slice(2, eq < 0 ? undefined : eq);
      inline = eq >= 0;
      if (!Object.hasOwn(options, long)) {
        throw new CliError(
          `unknown option '--${long}' for 'runner-depot ${command}'; its options are ${known || "none"} (${help})`,
          2,
        );
      }
    } else {
      // Short options one at a time (-f, -h); no bundling.
      long = byShort.get(arg.slice(1, 2));
      if (!long || arg.length > 2)
        throw new CliError(
          `unknown option '${arg}' for 'runner-depot ${command}'; its options are ${known || "none"} (${help})`,
          2,
        );
    }
    const option = options[long]!;
    if (option.type === "boolean" && inline)
      throw new CliError(`--${long} is a switch and takes no value (${help})`, 2);
    if (option.type === "string" && !inline) {
      const next = args[i + 1];
      if (next === undefined || (next.startsWith("-") && next !== "-"))
        throw new CliError(`--${long} needs a value (${help})`, 2);
      i++;
    }
  }
}

/**
 * Joins a string option and a next argument starting with '-' into `--name=value`, as
 * getopt would read them: node's parseArgs calls `--token -abc` ambiguous, and about one
 * job token in 64 starts with '-'. Not joined (so a forgotten value stays a usage error):
 * `--` (it ends the options) and any of the command's own options (`--token --endpoint …`).
 * O(args).
 */
export function bindDashValues(args: readonly string[], options: Command["options"]): string[] {
  const longOf = new Map<string, string>();
  const optionLike = new Set<string>(["--"]);
  for (const [name, option] of Object.entries(options)) {
    optionLike.add(`--${name}`);
    if (option.short) optionLike.add(`-${option.short}`);
    if (option.type !== "string") continue;
    longOf.set(`--${name}`, name);
    if (option.short) longOf.set(`-${option.short}`, name);
  }
  const isOption = (arg: string) => optionLike.has(arg) || optionLike.has(arg.slice(0, Math.max(arg.indexOf("="), 0)));
  const out: string[] = [];
  for (let i = 0; i < args.length; i++) {
    const arg = args[i]!;
    if (arg === "--") {
      out.push(...args.slice(i));
      break;
    }
    const long = longOf.get(arg);
    const next = args[i + 1];
    if (long !== undefined && next !== undefined && next.startsWith("-") && next !== "-" && !isOption(next)) {
      out.push(`--${long}=${next}`);
      i++;
    } else {
      out.push(arg);
    }
  }
  return out;
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
  if (!Number.isInteger(port) || port < 0 || port > 65535)
    throw new CliError(`--${name} must be a port number (0-65535), got '${String(value)}'`, 2);
  return port;
}

/** Parses a count option (a positive integer), or undefined when it is not given. */
export function countOption(value: unknown, name: string): number | undefined {
  if (value === undefined) return undefined;
  const count = Number(value);
  if (typeof value !== "string" || !/^\d+$/.test(value.trim()) || !Number.isSafeInteger(count) || count < 1)
    throw new CliError(`--${name} takes a positive whole number, got '${String(value)}'`, 2);
  return count;
}

/** The server URL and admin token for the client commands: flags first, then `<data>/serve.json`. */
export async function serverTarget(
  values: Record<string, unknown>,
  which: "depotUrl" | "runnerUrl",
): Promise<{ url: string; token: string | undefined }> {
  // Every command that talks to a server comes here before its first request: a bad
  // $RUNNER_DEPOT_TIMEOUT is a usage error now, not a failed request later.
  answerTimeoutMs();
  const dataDir = typeof values.data === "string" ? values.data : DEFAULT_DATA_DIR;
  const state = await readServeState(dataDir);
  // Inside a job allowed to publish, $RUNNER_DEPOT_URL names the depot (src/cli/control.ts).
  const fromEnv = which === "depotUrl" ? process.env.RUNNER_DEPOT_URL || undefined : undefined;
  const url = (typeof values.url === "string" ? values.url : undefined) ?? fromEnv ?? state?.[which];
  if (!url)
    throw new CliError(
      `no server given: pass --url, or start 'runner-depot serve' here first (it writes ${dataDir}/serve.json)`,
      2,
    );
  const token =
    (typeof values.token === "string" ? values.token : undefined) ??
    process.env.RUNNER_DEPOT_TOKEN ??
    state?.adminToken;
  return { url: url.replace(/\/$/, ""), token };
}

/** Default seconds the command waits for a server's answer to begin (src/cli/timed-fetch.ts). */
const DEFAULT_TIMEOUT_S = 120;

/** `$RUNNER_DEPOT_TIMEOUT` in milliseconds; a usage error (exit 2) when it is not 0.1–3600 seconds. */
export function answerTimeoutMs(env: NodeJS.ProcessEnv = process.env): number {
  const raw = env.RUNNER_DEPOT_TIMEOUT;
  if (raw === undefined || raw === "") return DEFAULT_TIMEOUT_S * 1000;
  const seconds = Number(raw);
  if (!/^\d+(\.\d+)?$/.test(raw.trim()) || !(seconds >= 0.1 && seconds <= 3600)) {
    throw new CliError(
      `$RUNNER_DEPOT_TIMEOUT is seconds to wait for a server's answer, from 0.1 to 3600 (default ${DEFAULT_TIMEOUT_S}), not '${raw}'`,
      2,
    );
  }
  return seconds * 1000;
}

/** Imports an adapter whose backend client is an optional peer dependency, saying how to install it when missing. */
export async function importAdapter<T>(load: () => Promise<T>, peer: string): Promise<T> {
  try {
    return await load();
  } catch (error) {
    if (
      (error as NodeJS.ErrnoException).code === "ERR_MODULE_NOT_FOUND" ||
      (error as NodeJS.ErrnoException).code === "MODULE_NOT_FOUND"
    ) {
      throw new CliError(
        `this backend needs the optional dependency ${peer}: run 'npm install ${peer}' next to runner-depot`,
      );
    }
    throw error;
  }
}

/**
 * How to run this command again, for the lines that suggest one: `runner-depot` when
 * installed, `npx tsx src/cli/main.ts` in a clone (where `npx runner-depot` is "not found").
 */
export function commandName(script: string | undefined = process.argv[1]): string {
  return script !== undefined && /(^|[\\/])src[\\/]cli[\\/]main\.ts$/.test(script)
    ? "npx tsx src/cli/main.ts"
    : "runner-depot";
}
