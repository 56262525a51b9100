/**
 * How the client commands (`job`, `logs`, `jobs`, `cancel`) reach the control API of a
 * running `serve`: its URL and admin token from flags or `<data>/serve.json`, and one
 * line saying what to do when the server cannot be reached or refuses.
 */
import { fetchFailureCause } from "../../fetch-failure.js";
import { cliFetch } from "../timed-fetch.js";
import { CliError, serverTarget } from "../args.js";

/** Options every control command takes. */
export const controlOptions = {
  url: { type: "string" },
  token: { type: "string" },
  data: { type: "string" },
} as const;

/** Help lines for {@link controlOptions}. */
export const controlUsage = `  --url <url>        server (depot) URL (default: from <data>/serve.json)
  --token <token>    admin token (default: $RUNNER_DEPOT_TOKEN or <data>/serve.json)
  --data <dir>       where 'serve' keeps its data (default ./.runner-depot)`;

/**
 * Sends one control request; returns the response when it is 2xx, else throws a CliError
 * starting with `refused` and carrying the server's problem detail.
 *
 * @example
 * const response = await controlRequest(values, "GET", "/-/jobs?limit=20", undefined, "cannot list jobs");
 */
export async function controlRequest(
  values: Record<string, unknown>,
  method: "GET" | "POST",
  pathAndQuery: string,
  body: unknown,
  refused: string,
): Promise<Response> {
  const { url, token } = await serverTarget(values, "depotUrl");
  const response = await cliFetch(`${url}${pathAndQuery}`, {
    method,
    headers: {
      ...(body === undefined ? {} : { "content-type": "application/json" }),
      ...(token ? { authorization: `Bearer ${token}` } : {}),
    },
    body: body === undefined ? undefined : JSON.stringify(body),
  }).catch((error: Error) => {
    throw new CliError(`cannot reach ${url}: ${fetchFailureCause(error)}; is 'runner-depot serve' running?`);
  });
  if (!response.ok) {
    const problem = (await response.json().catch(() => ({}))) as { detail?: string };
    throw new CliError(`${refused} (${response.status}): ${problem.detail ?? response.statusText}`);
  }
  return response;
}
