/**
 * The single-file agent's entry (`runner-depot-agent`): `runner-depot agent` with the
 * same flags and behaviour, plus `--version`. Bundled and made one executable by
 * `npm run build:agent` (scripts/build-agent.ts); see docs/decisions/single-file-agent.md.
 */
import { CliError, runCli } from "./args.js";
import { packageVersion } from "./version.js";

// Set by the bundler (esbuild's define): the bundle has no package.json beside it.
declare const __RUNNER_DEPOT_VERSION__: string | undefined;

/** The agent's version: the one baked in at build time, else the package's (under tsx). */
export function agentVersion(): string {
  return typeof __RUNNER_DEPOT_VERSION__ === "string" ? __RUNNER_DEPOT_VERSION__ : packageVersion();
}

async function main(argv: string[]): Promise<number> {
  if (argv[0] === "--version" || argv[0] === "-V") {
    process.stdout.write(`runner-depot-agent ${agentVersion()} (${process.platform}-${process.arch})\n`);
    return 0;
  }
  const { agentCommand } = await import("./runner/agent.js");
  const usage = agentCommand.usage.replace("runner-depot agent", "runner-depot-agent");
  return runCli(["agent", ...argv], { agent: async () => ({ ...agentCommand, usage }) }, usage);
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (error: unknown) => {
    const message = error instanceof Error ? error.message : String(error);
    process.stderr.write(`runner-depot-agent: ${message.split("\n")[0]}\n`);
    process.exitCode = error instanceof CliError ? error.exitCode : 1;
  },
);
