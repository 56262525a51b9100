/**
 * The single-file agent in a real VM (`npm run test:vm`, not the default run: see
 * docs/decisions/single-file-agent.md). `runner-depot serve` publishes its agent into its
 * depot; `runner-depot job` renders the cloud-init; a Debian VM with no Node boots under
 * QEMU with that as its NoCloud seed, reaches only the host's two ports, fetches the agent
 * with python3, checks it, runs the job and streams its log. On the host every line arrives
 * once, in order, and the result reaches the queue (serve's stdout). A tampered agent is
 * refused on the VM's console and nothing runs. The arm64 agent runs under qemu-user.
 */
import { execFile, spawn, type ChildProcess } from "node:child_process";
import { copyFile, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createDepotClient } from "../../src/depot/client/depot-client.js";
import { renderCloudInit } from "../../src/runner/agent/cloud-init.js";
import { agentUrl } from "../../src/runner/agent/agent-package.js";
import { bundleCli } from "../fixtures/cli-bundle.js";
import { GUEST_HOST, accelerator, bootVm, builtAgents, imageDir } from "./qemu.js";

const run = promisify(execFile);
const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");
const RUNNER_PORT = 50051;
const DEPOT_PORT = 8080;
const LINES = 50;

let cli: Awaited<ReturnType<typeof bundleCli>>;
let data: string;
let serve: ChildProcess;
const results: Array<Record<string, unknown>> = [];
let state: { runnerUrl: string; depotUrl: string; adminToken: string };
/** The runner as it listens on the host (serve.json holds the URL the VMs are given). */
let runnerListening = "";
let image: string;

/** Resolves once serve's stdout (the queue) has a result for the job. */
function resultOf(requestId: string, timeoutMs: number): Promise<Record<string, unknown>> {
  return new Promise((resolve, reject) => {
    const deadline = Date.now() + timeoutMs;
    const poll = () => {
      const found = results.find((r) => r.requestId === requestId);
      if (found) return resolve(found);
      if (Date.now() > deadline) return reject(new Error(`no result for ${requestId} in ${timeoutMs} ms`));
      setTimeout(poll, 200);
    };
    poll();
  });
}

async function createJob(
  command: string[],
): Promise<{ requestId: string; token: string; userData: string; warnings: string[] }> {
  const { stdout } = await run(process.execPath, [cli.file, "job", "--data", data, "--json", "--", ...command]);
  return JSON.parse(stdout) as { requestId: string; token: string; userData: string; warnings: string[] };
}

async function storedLines(requestId: string): Promise<string[]> {
  const response = await fetch(`${state.depotUrl}/-/jobs/${requestId}/log`, {
    headers: { authorization: `Bearer ${state.adminToken}` },
  });
  const text = await response.text();
  return text
    .split("\n")
    .filter((l) => l.startsWith('{"line"'))
    .map((l) => (JSON.parse(l) as { line: string }).line);
}

beforeAll(async () => {
  image = imageDir();
  cli = await bundleCli();
  data = await mkdtemp(path.join(os.tmpdir(), "runner-depot-vm-"));
  const agents = builtAgents(root);
  // The VM is handed GUEST_HOST: guestfwd carries it to the host's 127.0.0.1.
  serve = spawn(
    process.execPath,
    [
      cli.file,
      "serve",
      "--data",
      data,
      "--runner-port",
      "0",
      "--depot-port",
      "0",
      "--public-runner-url",
      `http://${GUEST_HOST}:${RUNNER_PORT}`,
      "--public-depot-url",
      `http://${GUEST_HOST}:${DEPOT_PORT}`,
      "--agent-dir",
      agents.dir,
      // Longer than a TCG boot: the job is registered before the VM starts.
      "--lost-after",
      "900",
      "--log-format",
      "json",
    ],
    { stdio: ["ignore", "pipe", "pipe"] },
  );
  let pending = "";
  serve.stdout!.setEncoding("utf8").on("data", (chunk: string) => {
    pending += chunk;
    const lines = pending.split("\n");
    pending = lines.pop()!;
    for (const line of lines) if (line.startsWith("{")) results.push(JSON.parse(line) as Record<string, unknown>);
  });
  let banner = "";
  serve.stderr!.setEncoding("utf8").on("data", (chunk: string) => {
    banner += chunk;
    runnerListening ||= /runner \(gRPC\): +(\S+)/.exec(banner)?.[1] ?? "";
  });
  // serve.json first, then the banner on stderr: both, or serve did not come up.
  for (let i = 0; i < 1500 && !(state && runnerListening); i++) {
    try {
      state = JSON.parse(await readFile(path.join(data, "serve.json"), "utf8")) as typeof state;
    } catch {
      // Not written yet.
    }
    await new Promise((r) => setTimeout(r, 200));
  }
  expect(state).toBeDefined();
  expect(runnerListening).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
}, 300_000);

afterAll(async () => {
  serve?.kill("SIGTERM");
  await new Promise((r) => serve?.once("exit", r));
  await cli?.remove();
  if (data) await rm(data, { recursive: true, force: true });
});

const port = (url: string) => Number(new URL(url).port);

// The two boots run at once: each is one TCG thread, so on two cores the pair takes about
// the time of one (the CI budget, docs/decisions/single-file-agent.md).
describe.concurrent(`the single-file agent in a Debian VM (QEMU, ${accelerator()})`, () => {
  it("serve published its agent: the job's cloud-init fetches it, and the VM streams every line once", async () => {
    const script = `for i in $(seq 1 ${LINES}); do echo "vm line $i"; done; uname -m >&2; exit 3`;
    const job = await createJob(["/bin/sh", "-c", script]);
    // The endpoint and the agent URL are the guest's view: no loopback warning.
    expect(job.warnings).toEqual([]);
    expect(job.userData).toContain(`http://${GUEST_HOST}:${DEPOT_PORT}/data/runner-depot-agent-linux-x64@`);
    const dir = await mkdtemp(path.join(os.tmpdir(), "runner-depot-vm-run-"));
    const vm = await bootVm({
      image,
      dir,
      userData: job.userData,
      forward: { [RUNNER_PORT]: port(runnerListening), [DEPOT_PORT]: port(state.depotUrl) },
    });
    try {
      const firstLine = new Promise<number>((resolve) => {
        const poll = async () => {
          if ((await storedLines(job.requestId)).length > 0) resolve(performance.now());
          else setTimeout(() => void poll(), 250);
        };
        void poll();
      });
      const result = await resultOf(job.requestId, 600_000);
      const bootToFirstLine = (await firstLine) - vm.startedAt;
      process.stdout.write(`vm: boot to first line on the host ${Math.round(bootToFirstLine)} ms (${accelerator()})\n`);
      // For bench/agent.ts's section of BENCHMARKS.md (a time: noisy on a shared machine).
      await writeFile(
        path.join(builtAgents(root).dir, "vm-figures.json"),
        `${JSON.stringify({ bootToFirstLineMs: Math.round(bootToFirstLine), accel: accelerator(), at: new Date().toISOString() })}\n`,
      );
      expect(result).toMatchObject({ requestId: job.requestId, exitCode: 3 });
      const lines = await storedLines(job.requestId);
      expect(lines).toEqual([...Array.from({ length: LINES }, (_, i) => `vm line ${i + 1}`), "x86_64"]);
      // No Node in the image: what ran is the agent that was fetched.
      expect(vm.console()).not.toMatch(/REFUSED/);
    } catch (error) {
      process.stderr.write(`the VM's console, last 4000 characters:\n${vm.console().slice(-4000)}\n`);
      throw error;
    } finally {
      await vm.stop();
      await rm(dir, { recursive: true, force: true });
    }
  }, 900_000);

  it("refuses a tampered agent on the VM's console and runs nothing", async () => {
    const agents = builtAgents(root);
    const genuine = agents.agents.find((a) => a.platform === "linux-x64")!;
    // The same agent with one byte changed, in the depot under another version.
    const work = await mkdtemp(path.join(os.tmpdir(), "runner-depot-tampered-"));
    const file = path.join(work, "runner-depot-agent");
    await copyFile(path.join(agents.dir, genuine.file), file);
    const bytes = await readFile(file);
    bytes[bytes.length - 100] ^= 0xff;
    await writeFile(file, bytes, { mode: 0o755 });
    const client = createDepotClient({ baseUrl: state.depotUrl, token: state.adminToken });
    await client.publish({
      name: "runner-depot-agent-linux-x64",
      version: `${agents.version}-tampered.1`,
      items: [{ type: "file", path: "runner-depot-agent", mode: 0o755, file }],
    });
    // GET /version answers every version of the package: the genuine one by its version.
    const info = await client.versions(`runner-depot-agent-linux-x64@${agents.version}`);
    const genuineDigest = info.versions.find((v) => v.version === agents.version)!.digest;
    const job = await createJob(["/bin/sh", "-c", "echo must not run"]);
    // The URL now answers the tampered archive; the digest is the genuine one's.
    const tampered = agentUrl(
      `http://${GUEST_HOST}:${DEPOT_PORT}`,
      "runner-depot-agent-linux-x64",
      `${agents.version}-tampered.1`,
      genuineDigest,
    );
    const userData = renderCloudInit({
      endpoint: `http://${GUEST_HOST}:${RUNNER_PORT}`,
      requestId: job.requestId,
      token: job.token,
      command: ["/bin/sh", "-c", "echo must not run"],
      agent: tampered,
    });
    const vm = await bootVm({
      image,
      dir: work,
      userData,
      forward: { [RUNNER_PORT]: port(runnerListening), [DEPOT_PORT]: port(state.depotUrl) },
    });
    try {
      const [line] = await vm.waitForConsole(
        /runner-depot: REFUSED the agent from \S+: its SHA-256 is [0-9a-f]{64}, expected [0-9a-f]{64}; nothing was run/,
        600_000,
      );
      expect(line).toContain(tampered.sha256.replace("sha256:", ""));
      // Nothing ran: the script exits after that line, so no call reaches the runner; the job
      // stays open, without a line, until --lost-after closes it as lost (not waited for here).
      await new Promise((r) => setTimeout(r, 5000));
      expect(await storedLines(job.requestId)).toEqual([]);
      expect(results.find((r) => r.requestId === job.requestId)).toBeUndefined();
      expect(vm.console()).not.toMatch(/must not run/);
    } finally {
      await vm.stop();
      await rm(work, { recursive: true, force: true });
    }
  }, 900_000);
});

describe("the arm64 agent under qemu-user (qemu-aarch64)", () => {
  const arm64 = () => {
    const agents = builtAgents(root);
    return path.join(agents.dir, agents.agents.find((a) => a.platform === "linux-arm64")!.file);
  };
  // Debian's cross libraries (libc6-arm64-cross): the SEA is a dynamically linked Node.
  const qemu = (args: string[]) => ["-L", "/usr/aarch64-linux-gnu", arm64(), ...args];

  it("answers --version for its platform", async () => {
    const { stdout } = await run("qemu-aarch64", qemu(["--version"]));
    expect(stdout).toBe(`runner-depot-agent ${builtAgents(root).version} (linux-arm64)\n`);
  });

  it("runs a job against the host's runner and streams it", async () => {
    const job = await createJob(["/bin/sh", "-c", "echo from arm64; echo two"]);
    const config = path.join(data, `job-${job.requestId}.json`);
    // The job config as cloud-init writes it, but with the host's own runner URL.
    await writeFile(
      config,
      JSON.stringify({
        version: 1,
        endpoint: runnerListening,
        requestId: job.requestId,
        token: job.token,
        repoUrl: "",
        commitSha: "",
        command: "/bin/sh",
        args: ["-c", "echo from arm64; echo two"],
      }),
      { mode: 0o600 },
    );
    const { stdout } = await run("qemu-aarch64", qemu(["--config", config]), { timeout: 120_000 });
    expect(stdout).toBe("from arm64\ntwo\n");
    const result = await resultOf(job.requestId, 60_000);
    expect(result).toMatchObject({ requestId: job.requestId, exitCode: 0 });
    expect(await storedLines(job.requestId)).toEqual(["from arm64", "two"]);
  }, 180_000);
});
