/** `runner-depot console-url`: mints a new one-time login URL for the console of a running `serve`. */
import { fetchFailureCause } from "../../fetch-failure.js";
import { cliFetch } from "../timed-fetch.js";
import { CliError, serverTarget, type Command } from "../args.js";

const usage = `Usage: runner-depot console-url [options]

Prints a new one-time login URL for the web console of the server started by
'runner-depot serve' (the one printed at startup works once). Opening it shows a
"Sign in" button; the session starts when it is pressed, so a link preview does not
use the URL up.

Options:
  --url <url>        server (depot) URL (default: from <data>/serve.json)
  --token <token>    admin token (default: $RUNNER_DEPOT_TOKEN or <data>/serve.json)
  --data <dir>       where 'serve' keeps its data (default ./.runner-depot)`;

export const consoleUrlCommand: Command = {
  usage,
  options: {
    url: { type: "string" },
    token: { type: "string" },
    data: { type: "string" },
  },
  async run(values) {
    const { url, token } = await serverTarget(values, "depotUrl");
    const response = await cliFetch(`${url}/-/console-url`, {
      method: "POST",
      headers: token ? { authorization: `Bearer ${token}` } : {},
    }).catch((error: Error) => {
      throw new CliError(`cannot reach ${url}: ${fetchFailureCause(error)}; is 'runner-depot serve' running?`);
    });
    if (!response.ok) {
      const problem = (await response.json().catch(() => ({}))) as { detail?: string };
      throw new CliError(`the server refused (${response.status}): ${problem.detail ?? response.statusText}`);
    }
    const answer = (await response.json()) as { url: string };
    process.stdout.write(`${answer.url}\n`);
    return 0;
  },
};
