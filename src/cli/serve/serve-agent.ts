/**
 * `serve` publishes the single-file agent of its own version into its depot, so a job's
 * cloud-init can fetch it (docs/decisions/single-file-agent.md).
 */
import { existsSync } from "node:fs";
import path from "node:path";
import { createDepotClient } from "../../depot/index.js";
import { publishAgent, type CloudInitAgent } from "../../runner/index.js";
import { agentUrl } from "../../runner/agent/agent-package.js";
import type { Logger } from "../../telemetry.js";
import { CliError } from "../args.js";
import { packageDir, packageVersion } from "../version.js";

/**
 * Publishes the agents in `dir` (default: this package's build/agent) and answers each
 * platform's URL (as the VM reaches the depot) and digest. No built agent in the default
 * folder is not an error: VMs then need runner-depot installed, as before, and the log says so.
 */
export async function publishServeAgents(options: {
  depotUrl: string;
  vmDepotUrl: string;
  adminToken: string;
  dir: string | undefined;
  logger: Logger;
}): Promise<Map<string, CloudInitAgent>> {
  const dir = options.dir ?? path.join(packageDir() ?? process.cwd(), "build", "agent");
  const agents = new Map<string, CloudInitAgent>();
  if (!existsSync(path.join(dir, "agents.json"))) {
    if (options.dir !== undefined)
      throw new CliError(`--agent-dir ${dir} holds no agents.json ('npm run build:agent')`, 2);
    options.logger.info(
      { agentDir: dir },
      "no single-file agent built ('npm run build:agent'): VMs need 'runner-depot agent' installed",
    );
    return agents;
  }
  const client = createDepotClient({ baseUrl: options.depotUrl, token: options.adminToken });
  const version = packageVersion();
  for (const agent of await publishAgent({ client, dir })) {
    // Only the agent of serve's own version: another one may speak an older protocol.
    if (agent.version !== version) {
      options.logger.warn(
        { agentDir: dir, agentVersion: agent.version, version },
        "the built agent is not of this version: rebuild it with 'npm run build:agent'; not used",
      );
      continue;
    }
    agents.set(agent.platform, agentUrl(options.vmDepotUrl, agent.name, agent.version, agent.digest));
    options.logger.info(
      {
        platform: agent.platform,
        package: `${agent.name}@${agent.version}`,
        digest: agent.digest,
        published: agent.published,
      },
      "single-file agent in the depot",
    );
  }
  return agents;
}
