/**
 * `serve --agent-dir` publishes the single-file agent into its own depot, and `job` then
 * renders a cloud-init that fetches it (URL as the VM reaches the depot, the archive's
 * digest); `job` warns on stderr about a loopback endpoint, `job --json` answers the
 * warnings instead. The "agent" here is a small stand-in file with an agents.json, as
 * `npm run build:agent` writes them; the real one runs in test/vm.
 */
import { execFile, spawn, type ChildProcess } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parse } from "yaml";
import { bundleCli } from "../../fixtures/cli-bundle.js";

const run = promisify(execFile);
let cli: Awaited<ReturnType<typeof bundleCli>>;
let work: string;
let serve: ChildProcess;
let depotUrl = "";
const VERSION = JSON.parse(await readFile(new URL("../../../package.json", import.meta.url), "utf8")).version as string;

beforeAll(async () => {
  cli = await bundleCli();
  work = await mkdtemp(path.join(os.tmpdir(), "runner-depot-serve-agent-"));
  const agents = path.join(work, "agents");
  await mkdir(agents);
  const body = "#!/bin/sh\necho stand-in agent\n";
  await writeFile(path.join(agents, "a-x64"), body, { mode: 0o755 });
  await writeFile(path.join(agents, "a-arm64"), `${body}# arm64\n`, { mode: 0o755 });
  const sha = (text: string) => createHash("sha256").update(text).digest("hex");
  await writeFile(
    path.join(agents, "agents.json"),
    JSON.stringify({
      version: VERSION,
      node: "22",
      agents: [
        { platform: "linux-x64", file: "a-x64", size: body.length, sha256: sha(body) },
        { platform: "linux-arm64", file: "a-arm64", size: body.length + 8, sha256: sha(`${body}# arm64\n`) },
      ],
    }),
  );
  serve = spawn(
    process.execPath,
    [
      cli.file,
      "serve",
      "--data",
      path.join(work, "data"),
      "--runner-port",
      "0",
      "--depot-port",
      "0",
      "--public-depot-url",
      "http://10.0.2.100:8080",
      "--agent-dir",
      agents,
    ],
    { stdio: ["ignore", "ignore", "pipe"] },
  );
  let err = "";
  serve.stderr!.setEncoding("utf8").on("data", (chunk: string) => (err += chunk));
  for (let i = 0; i < 600 && !depotUrl; i++) {
    depotUrl = /depot \(HTTP\): +(\S+)/.exec(err)?.[1] ?? "";
    await new Promise((r) => setTimeout(r, 100));
  }
  expect(depotUrl, err).not.toBe("");
});

afterAll(async () => {
  serve?.kill("SIGTERM");
  await new Promise((r) => serve?.once("exit", r));
  await cli?.remove();
  if (work) await rm(work, { recursive: true, force: true });
});

const job = (args: string[]) =>
  run(process.execPath, [cli.file, "job", "--data", path.join(work, "data"), ...args]).then(
    (r) => ({ code: 0, ...r }),
    (e: { code: number; stdout: string; stderr: string }) => e,
  );

describe("serve publishes its agent and job's cloud-init fetches it", () => {
  it("the depot holds runner-depot-agent-<platform>@<version>, and the cloud-init fetches that archive with its digest", async () => {
    const versions = (await (await fetch(`${depotUrl}/version/runner-depot-agent-linux-x64@${VERSION}`)).json()) as {
      versions: { digest: string }[];
    };
    const digest = versions.versions[0]!.digest.replace("sha256:", "");
    const answer = await job(["--", "make", "test"]);
    expect(answer.code, answer.stderr).toBe(0);
    const argv = (parse(answer.stdout) as { runcmd: string[][] }).runcmd[0]!;
    expect(argv.slice(0, 2)).toEqual(["/bin/sh", "-c"]);
    expect(argv.slice(4)).toEqual([
      `http://10.0.2.100:8080/data/runner-depot-agent-linux-x64@${VERSION}`,
      digest,
      "/etc/runner-depot/job.json",
      "/var/lib/runner-depot",
    ]);
    // The runner URL is serve's loopback one: the VM would reach itself there.
    expect(answer.stderr).toMatch(
      /^runner-depot job: warning: the runner endpoint http:\/\/127\.0\.0\.1:\d+ is a loopback address/m,
    );
    // The archive the VM downloads hashes to that digest.
    const archive = Buffer.from(
      await (await fetch(`${depotUrl}/data/runner-depot-agent-linux-x64@${VERSION}`)).arrayBuffer(),
    );
    expect(createHash("sha256").update(archive).digest("hex")).toBe(digest);
  });

  it("--platform linux-arm64 picks the other package; an unknown platform is refused; --json carries the warnings", async () => {
    const arm = await job(["--json", "--platform", "linux-arm64", "--", "true"]);
    expect(arm.code, arm.stderr).toBe(0);
    expect(arm.stderr).toBe("");
    const answer = JSON.parse(arm.stdout) as { agent: { url: string; sha256: string }; warnings: string[] };
    expect(answer.agent.url).toBe(`http://10.0.2.100:8080/data/runner-depot-agent-linux-arm64@${VERSION}`);
    expect(answer.agent.sha256).toMatch(/^sha256:[0-9a-f]{64}$/);
    expect(answer.warnings).toHaveLength(1);
    expect(answer.warnings[0]).toMatch(/the runner endpoint http:\/\/127\.0\.0\.1:\d+ is a loopback address/);
    const bad = await job(["--platform", "windows-x64", "--", "true"]);
    expect(bad.code).toBe(1);
    expect(bad.stderr).toMatch(/no agent for platform windows-x64 in this depot \(has: linux-x64, linux-arm64\)/);
  });
});
