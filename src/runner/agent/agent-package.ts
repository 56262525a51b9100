/**
 * The single-file agent as a depot package: `runner-depot-agent-<platform>@<version>`, one
 * package per platform (a VM downloads only its own, about 125 MB), holding one executable
 * item `runner-depot-agent`. `publishAgent` puts the built agents (`npm run build:agent`)
 * into a depot; `agentFromDepot` finds the URL and digest `renderCloudInit` needs.
 */
import { readFile } from "node:fs/promises";
import path from "node:path";
import { RunnerDepotError } from "../../errors.js";
import type { DepotClient } from "../../depot/client/types.js";
import type { CloudInitAgent } from "./cloud-init.js";
import { AGENT_ITEM } from "./fetch-agent-script.js";

/** The platforms the agent is built for. */
export type AgentPlatform = "linux-x64" | "linux-arm64";

/** What `npm run build:agent` writes beside the agents: `agents.json`. */
interface AgentsManifest {
  version: string;
  node: string;
  agents: { platform: AgentPlatform; file: string; size: number; sha256: string }[];
}

/** One agent in a depot. */
export interface PublishedAgent {
  platform: AgentPlatform;
  name: string;
  version: string;
  /** `sha256:<hex>` of the package archive the VM downloads. */
  digest: string;
  /** False when that version was in the depot already (a version never changes). */
  published: boolean;
}

/** The names of the agent packages: a job's own credentials never publish one (cli/job-publishing.ts). */
export const AGENT_PACKAGE_PREFIX = "runner-depot-agent-";

/** The depot package of a platform's agent. */
export function agentPackageName(platform: AgentPlatform): string {
  return `${AGENT_PACKAGE_PREFIX}${platform}`;
}

/**
 * Publishes every agent in `dir` (the output of `npm run build:agent`, with its
 * agents.json) into a depot, each as `runner-depot-agent-<platform>@<version>`. A version
 * already there is left as it is and reported with its digest. O(agents) depot calls; the
 * files are streamed, by reference first.
 *
 * @example
 * const client = createDepotClient({ baseUrl: "http://127.0.0.1:8080", token: adminToken });
 * const agents = await publishAgent({ client, dir: "node_modules/runner-depot/build/agent" });
 */
export async function publishAgent(options: { client: DepotClient; dir: string }): Promise<PublishedAgent[]> {
  const manifestPath = path.join(options.dir, "agents.json");
  let manifest: AgentsManifest;
  try {
    manifest = JSON.parse(await readFile(manifestPath, "utf8")) as AgentsManifest;
  } catch (error) {
    throw new RunnerDepotError(
      "NOT_FOUND",
      `no single-file agent in ${options.dir} (${(error as Error).message}); build it with 'npm run build:agent'`,
    );
  }
  const out: PublishedAgent[] = [];
  for (const agent of manifest.agents) {
    const name = agentPackageName(agent.platform);
    const existing = await existingDigest(options.client, name, manifest.version);
    if (existing !== undefined) {
      await checkExistingAgent(options.client, name, manifest.version, agent.sha256);
      out.push({ platform: agent.platform, name, version: manifest.version, digest: existing, published: false });
      continue;
    }
    const result = await options.client.publish({
      name,
      version: manifest.version,
      items: [{ type: "file", path: AGENT_ITEM, mode: 0o755, file: path.join(options.dir, agent.file) }],
      attributes: {
        description: `runner-depot's single-file agent for ${agent.platform} (Node ${manifest.node} SEA)`,
        platform: agent.platform,
        sha256: agent.sha256,
      },
    });
    out.push({ platform: agent.platform, name, version: manifest.version, digest: result.digest, published: true });
  }
  return out;
}

/**
 * Refuses a version already in the depot whose agent is not the file built here: whoever
 * published that name first (a packager token, a job allowed `*`) would otherwise choose
 * what every VM runs as root. One ranged read of the archive's manifest; the depot computed
 * its item digests from the bytes it took.
 */
async function checkExistingAgent(client: DepotClient, name: string, version: string, sha256: string): Promise<void> {
  const items = (await client.manifest(`${name}@${version}`)).items;
  const [item] = items;
  if (items.length !== 1 || item?.type !== "file" || item.path !== AGENT_ITEM || item.digest !== `sha256:${sha256}`)
    throw new RunnerDepotError(
      "CONFLICT",
      `the depot's ${name}@${version} is not the agent built here (its ${AGENT_ITEM} is ${item?.digest ?? "missing"}, expected sha256:${sha256}): it was published by someone else; VMs must not run it`,
    );
}

async function existingDigest(client: DepotClient, name: string, version: string): Promise<string | undefined> {
  try {
    const info = await client.versions(`${name}@${version}`);
    return info.versions.find((v) => v.version === version)?.digest;
  } catch (error) {
    const code = (error as { code?: string }).code;
    if (code === "PACKAGE_NOT_FOUND" || code === "VERSION_NOT_FOUND" || code === "NOT_FOUND") return undefined;
    throw error;
  }
}

/**
 * The agent's URL and digest for {@link renderCloudInit}, looked up in a depot:
 * `GET /version/runner-depot-agent-<platform>@<version>` (one call, its body bounded by
 * the client). `vmDepotUrl` is the depot as the VM reaches it, when that differs.
 *
 * @example
 * const agent = await agentFromDepot({ client, version: "0.1.0", vmDepotUrl: "http://10.0.2.100:8080" });
 * const userData = renderCloudInit({ endpoint, requestId, token, command: ["make"], agent });
 */
export async function agentFromDepot(options: {
  client: DepotClient;
  version: string;
  platform?: AgentPlatform;
  vmDepotUrl?: string;
}): Promise<CloudInitAgent> {
  const name = agentPackageName(options.platform ?? "linux-x64");
  const digest = await existingDigest(options.client, name, options.version);
  if (digest === undefined)
    throw new RunnerDepotError(
      "NOT_FOUND",
      `the depot has no ${name}@${options.version}; 'runner-depot serve' publishes it, or call publishAgent`,
    );
  return agentUrl(options.vmDepotUrl ?? options.client.baseUrl, name, options.version, digest);
}

/** The archive URL of an agent package and its digest. */
export function agentUrl(depotUrl: string, name: string, version: string, digest: string): CloudInitAgent {
  return { url: `${depotUrl.replace(/\/+$/, "")}/data/${name}@${version}`, sha256: digest };
}
