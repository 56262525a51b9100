/**
 * The agent fetch renderCloudInit puts in runcmd, run as cloud-init runs it (the argv from
 * the parsed YAML) against a real depot the agent was published into with publishAgent:
 * with only curl, only wget, only python3 on PATH, and with a digest that does not match.
 * The "agent" is a shell script that records its arguments, so what ran is visible.
 */
import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import { chmod, mkdir, readFile, symlink, writeFile } from "node:fs/promises";
import path from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parse } from "yaml";
import { createFsStore } from "../../../src/adapters/fs/store.js";
import { bearerTokens } from "../../../src/depot/server/auth.js";
import { createDepotClient } from "../../../src/depot/client/depot-client.js";
import { renderCloudInit } from "../../../src/runner/agent/cloud-init.js";
import { agentFromDepot, publishAgent } from "../../../src/runner/agent/agent-package.js";
import { AGENT_DIR } from "../../../src/runner/agent/fetch-agent-script.js";
import { startDepot, tempDir, type LiveDepot } from "../../fixtures/depot.js";

const run = promisify(execFile);
let depot: LiveDepot;
let work: { dir: string; cleanup: () => Promise<void> };
const TOKEN = "admin-token";

// The tools the script uses besides the fetchers; each case adds the fetchers it allows.
const BASE_TOOLS = ["sh", "mkdir", "chmod", "rm", "cut", "sleep", "tar", "cat", "echo"];

beforeAll(async () => {
  work = await tempDir("fetch-agent-");
  depot = await startDepot(createFsStore(path.join(work.dir, "store")), {
    authorize: bearerTokens({ [TOKEN]: ["*"] }, { publicRead: true }),
  });
  const built = path.join(work.dir, "built");
  await mkdir(built);
  // Records its argv and the job config it was given, then exits 0.
  const agent = `#!/bin/sh\necho "$@" > "\${0%/*}/ran"\n`;
  await writeFile(path.join(built, "runner-depot-agent-linux-x64"), agent, { mode: 0o755 });
  const sha256 = createHash("sha256").update(agent).digest("hex");
  await writeFile(
    path.join(built, "agents.json"),
    JSON.stringify({
      version: "9.9.9",
      node: "22",
      agents: [{ platform: "linux-x64", file: "runner-depot-agent-linux-x64", size: agent.length, sha256 }],
    }),
  );
  const client = createDepotClient({ baseUrl: depot.url, token: TOKEN });
  const first = await publishAgent({ client, dir: built });
  expect(first.map((a) => [a.name, a.version, a.published])).toEqual([["runner-depot-agent-linux-x64", "9.9.9", true]]);
  // A second serve start finds the version there: nothing is published again, same digest.
  const again = await publishAgent({ client, dir: built });
  expect(again).toEqual([{ ...first[0], published: false }]);
});
afterAll(async () => {
  await depot?.close();
  await work?.cleanup();
});

/** A PATH holding only the named tools (symlinks to the host's). */
async function pathWith(name: string, tools: string[]): Promise<string> {
  const bin = path.join(work.dir, `bin-${name}`);
  await mkdir(bin, { recursive: true });
  for (const tool of tools) {
    // Debian's own, as a VM has it (not a version manager's shim, which needs bash).
    const { stdout } = await run("sh", ["-c", `PATH=/usr/bin:/bin; command -v ${tool}`]);
    await symlink(stdout.trim(), path.join(bin, tool)).catch(() => undefined);
  }
  return bin;
}

/** The runcmd argv renderCloudInit rendered, with the agent folder moved under the test's temp dir. */
async function fetchCommand(name: string, sha256?: string): Promise<{ argv: string[]; dir: string }> {
  const client = createDepotClient({ baseUrl: depot.url });
  const agent = await agentFromDepot({ client, version: "9.9.9" });
  const text = renderCloudInit({
    endpoint: "https://runner.internal:50051",
    requestId: "0b5f0c8e-7d3a-4c1e-9f2a-1b2c3d4e5f60",
    token: "t",
    command: ["make"],
    agent: sha256 ? { ...agent, sha256 } : agent,
    onWarning: () => undefined,
  });
  const doc = parse(text) as { runcmd: string[][] };
  expect(doc.runcmd).toHaveLength(1);
  const argv = doc.runcmd[0]!;
  expect(argv.at(-1)).toBe(AGENT_DIR);
  const dir = path.join(work.dir, `agent-${name}`);
  return { argv: [...argv.slice(0, -1), dir], dir };
}

async function runFetch(argv: string[], PATH: string) {
  return run(argv[0]!, argv.slice(1), { env: { PATH } }).then(
    (r) => ({ code: 0, ...r }),
    (e: { code: number; stdout: string; stderr: string }) => ({ code: e.code, stdout: e.stdout, stderr: e.stderr }),
  );
}

describe("the agent fetch in renderCloudInit's user data", () => {
  for (const fetcher of ["curl", "wget", "python3"] as const) {
    it(`fetches with ${fetcher} alone, checks the digest and runs the agent with the job config`, async () => {
      // python3 alone also stands in for sha256sum.
      const tools = fetcher === "python3" ? [...BASE_TOOLS, "python3"] : [...BASE_TOOLS, fetcher, "sha256sum"];
      const PATH = await pathWith(fetcher, tools);
      const { argv, dir } = await fetchCommand(fetcher);
      const result = await runFetch(argv, PATH);
      expect(result.stderr).toBe("");
      expect(result.code).toBe(0);
      expect(await readFile(path.join(dir, "ran"), "utf8")).toBe("--config /etc/runner-depot/job.json\n");
      // The download is gone once unpacked; the folder is root's (0700).
      expect(existsSync(path.join(dir, "agent.download"))).toBe(false);
    });
  }

  it("refuses an agent whose SHA-256 differs: one line, nothing run, nothing left", async () => {
    const PATH = await pathWith("tampered", [...BASE_TOOLS, "curl", "sha256sum"]);
    const { argv, dir } = await fetchCommand("tampered", "0".repeat(64));
    const result = await runFetch(argv, PATH);
    expect(result.code).toBe(1);
    const lines = result.stderr.trimEnd().split("\n");
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatch(
      /^runner-depot: REFUSED the agent from http:\/\/127\.0\.0\.1:\d+\/data\/runner-depot-agent-linux-x64@9\.9\.9: its SHA-256 is [0-9a-f]{64}, expected 0{64}; nothing was run$/,
    );
    expect(existsSync(path.join(dir, "ran"))).toBe(false);
    expect(existsSync(path.join(dir, "runner-depot-agent"))).toBe(false);
    expect(existsSync(path.join(dir, "agent.download"))).toBe(false);
  });

  it("says there is nothing to fetch with when a VM has none of curl, wget and python3", async () => {
    const PATH = await pathWith("none", BASE_TOOLS);
    const { argv, dir } = await fetchCommand("none");
    const result = await runFetch(argv, PATH);
    expect(result.code).toBe(1);
    expect(result.stderr).toBe("runner-depot: no curl, wget or python3 to fetch the agent with; nothing was run\n");
    expect(existsSync(path.join(dir, "ran"))).toBe(false);
  });
});

describe("renderCloudInit and the agent", () => {
  const base = { requestId: "0b5f0c8e-7d3a-4c1e-9f2a-1b2c3d4e5f60", token: "t", command: ["make"] };
  const agent = { url: "http://depot.internal:8080/data/runner-depot-agent-linux-x64@1.0.0", sha256: "a".repeat(64) };

  it("warns once per loopback address a VM is given, and not for addresses it reaches", () => {
    const warnings: string[] = [];
    const onWarning = (m: string) => warnings.push(m);
    renderCloudInit({ ...base, endpoint: "http://10.0.2.100:50051", agent, onWarning });
    expect(warnings).toEqual([]);
    renderCloudInit({
      ...base,
      endpoint: "http://127.0.0.1:50051",
      agent: { ...agent, url: "http://[::1]:8080/data/x@1.0.0" },
      onWarning,
    });
    expect(warnings).toHaveLength(2);
    expect(warnings[0]).toMatch(/^the runner endpoint http:\/\/127\.0\.0\.1:50051 is a loopback address/);
    expect(warnings[1]).toMatch(/^the agent URL http:\/\/\[::1\]:8080\/data\/x@1\.0\.0 is a loopback address/);
  });

  it("takes sha256:<hex> as GET /version answers it, and refuses a digest or URL the VM could not use", () => {
    const text = renderCloudInit({
      ...base,
      endpoint: "http://10.0.2.100:1",
      agent: { ...agent, sha256: `sha256:${"b".repeat(64)}` },
    });
    const argv = (parse(text) as { runcmd: string[][] }).runcmd[0]!;
    expect(argv.slice(4)).toEqual([agent.url, "b".repeat(64), "/etc/runner-depot/job.json", AGENT_DIR]);
    for (const bad of [
      { sha256: "a".repeat(63) },
      { sha256: "z".repeat(64) },
      { url: "file:///etc/passwd" },
      { url: "not a url" },
    ]) {
      expect(() => renderCloudInit({ ...base, endpoint: "http://10.0.2.100:1", agent: { ...agent, ...bad } })).toThrow(
        /agent\.(sha256|url)/,
      );
    }
  });
});
