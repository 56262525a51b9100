/**
 * A job publishes through its agent, and the version carries the server's provenance
 * (issue 26), all through the `runner-depot` command: `serve`; `job --publish tool` (whose
 * cloud-init hands the job its depot URL and credentials); `agent` running `runner-depot
 * publish` with that environment; `verify --builder` against the orchestrator's key file
 * serve wrote.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { mkdir, readFile, writeFile } from "node:fs/promises";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { bundleCli, runBundledCli, type CliRun } from "../../fixtures/cli-bundle.js";
import { tempDir } from "../../fixtures/depot.js";
import { stopChild } from "../../fixtures/stop-child.js";

let cli: Awaited<ReturnType<typeof bundleCli>>;
let tmp: Awaited<ReturnType<typeof tempDir>>;
let serve: ChildProcess;
let data: string;

function run(args: string[], env: Record<string, string> = {}): Promise<CliRun> {
  return runBundledCli(cli.file, args, tmp.dir, { ...withoutDepotEnv(), ...env });
}

/** This process's environment without a depot URL or token of its own. */
function withoutDepotEnv(): NodeJS.ProcessEnv {
  const env = { ...process.env };
  delete env.RUNNER_DEPOT_TOKEN;
  delete env.RUNNER_DEPOT_URL;
  return env;
}

beforeAll(async () => {
  cli = await bundleCli();
  tmp = await tempDir("serve-provenance-");
  data = path.join(tmp.dir, "data");
  // --job-quota-versions 1: a job publishes one version with its own credentials (the admin token has no quota).
  serve = spawn(
    process.execPath,
    [cli.file, "serve", "--runner-port", "0", "--depot-port", "0", "--data", data, "--job-quota-versions", "1"],
    {
      cwd: tmp.dir,
      stdio: ["ignore", "pipe", "pipe"],
    },
  );
  let err = "";
  await new Promise<void>((resolve, reject) => {
    serve.stderr!.setEncoding("utf8").on("data", (d: string) => {
      err += d;
      if (/console:\s+http/.test(err)) resolve();
    });
    serve.once("exit", () => reject(new Error(`serve exited: ${err}`)));
  });
}, 120_000);

afterAll(async () => {
  if (serve) await stopChild(serve);
  await cli?.remove();
  await tmp?.cleanup();
});

describe("serve: a job publishes through its agent with its own credentials", () => {
  it("the version carries provenance naming the job, verified against serve's key and builder", async () => {
    const src = path.join(tmp.dir, "src");
    await mkdir(src, { recursive: true });
    await writeFile(path.join(src, "tool"), "#!/bin/sh\necho built by a job\n");
    const publish = [process.execPath, cli.file, "publish", src, "tool@1.0.0"];
    const created = await run([
      "job",
      "--json",
      "--data",
      data,
      "--publish",
      "tool",
      "--repo",
      "https://git.example.test/team/tool.git",
      "--commit",
      "89abcdef89abcdef89abcdef89abcdef89abcdef",
      "--",
      ...publish,
    ]);
    expect(created.code, created.err).toBe(0);
    const job = JSON.parse(created.out) as { requestId: string; token: string; endpoint: string; userData: string };
    const credentials = `job.${job.requestId}.${job.token}`;
    const state = JSON.parse(await readFile(path.join(data, "serve.json"), "utf8")) as { depotUrl: string };
    // What cloud-init gives the VM: its depot and its own credentials.
    expect(job.userData).toContain(credentials);
    expect(job.userData).toContain(state.depotUrl);

    const agent = await run(
      ["agent", "--endpoint", job.endpoint, "--request-id", job.requestId, "--token", job.token, "--", ...publish],
      { RUNNER_DEPOT_URL: state.depotUrl, RUNNER_DEPOT_TOKEN: credentials },
    );
    expect(agent.code, agent.err).toBe(0);

    const trusted = JSON.parse(await readFile(path.join(data, "orchestrator-key.json"), "utf8")) as {
      keys: Array<{ keyId: string }>;
    };
    const builder = `urn:runner-depot:orchestrator:${trusted.keys[0]!.keyId}`;
    const verified = await run([
      "verify",
      "tool@1.0.0",
      "--data",
      data,
      "--signatures",
      "require",
      "--trusted-keys",
      path.join(data, "orchestrator-key.json"),
      "--builder",
      builder,
    ]);
    expect(verified.code, verified.err).toBe(0);
    expect(verified.out).toContain(`attested provenance: built by ${builder} in job ${job.requestId}`);

    // The admin token publishes too, but no provenance: the builder requirement refuses it.
    expect((await run(["publish", src, "tool@2.0.0", "--data", data])).code).toBe(0);
    const refused = await run([
      "verify",
      "tool@2.0.0",
      "--data",
      data,
      "--trusted-keys",
      path.join(data, "orchestrator-key.json"),
      "--builder",
      builder,
    ]);
    expect(refused.code).toBe(1);
    expect(refused.err).toContain(`verify refused: tool@2.0.0: no provenance from ${builder}`);
  });
});

describe("serve --job-quota-versions: what one job may publish", () => {
  it("a job's second version answers 413 QUOTA_EXCEEDED and is not published; the first stands", async () => {
    const src = path.join(tmp.dir, "src-quota");
    await mkdir(src, { recursive: true });
    await writeFile(path.join(src, "lib"), "quota\n");
    const publish = (version: string) => `"${process.execPath}" "${cli.file}" publish "${src}" "qlib@${version}"`;
    const created = await run([
      "job",
      "--json",
      "--data",
      data,
      "--publish",
      "qlib",
      "--",
      "sh",
      "-c",
      `${publish("1.0.0")} && ${publish("1.0.1")}`,
    ]);
    expect(created.code, created.err).toBe(0);
    const job = JSON.parse(created.out) as { requestId: string; token: string; endpoint: string };
    const state = JSON.parse(await readFile(path.join(data, "serve.json"), "utf8")) as { depotUrl: string };
    const agent = await run(
      [
        "agent",
        "--endpoint",
        job.endpoint,
        "--request-id",
        job.requestId,
        "--token",
        job.token,
        "--",
        "sh",
        "-c",
        `${publish("1.0.0")} && ${publish("1.0.1")}`,
      ],
      { RUNNER_DEPOT_URL: state.depotUrl, RUNNER_DEPOT_TOKEN: `job.${job.requestId}.${job.token}` },
    );
    expect(agent.code).not.toBe(0);
    expect(agent.out + agent.err).toMatch(/quota/i);
    const versions = (await (await fetch(`${state.depotUrl}/version/qlib`)).json()) as {
      versions: Array<{ version: string }>;
    };
    expect(versions.versions.map((v) => v.version)).toEqual(["1.0.0"]);
  });
});
