/**
 * Playing the VM locally (issue 29 item 4), on a real `serve` built as the published CLI:
 * `runner-depot job --run -- <cmd>` creates the job and runs it here as its agent would
 * (output printed, stored and followed, exit code returned); `job --json` output saved to
 * a file is a config `agent --config` runs; a file that is not a job config is named as
 * such instead of "unsupported version undefined".
 */
import { spawn } from "node:child_process";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createRunnerClient } from "../../../src/runner/index.js";
import { bundleCli, spawnJsonLogged, type JsonLoggedProcess } from "../../fixtures/cli-bundle.js";

let cli: Awaited<ReturnType<typeof bundleCli>>;
let dir: string;
let serve: JsonLoggedProcess;

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs the built command in `dir` (where serve.json tells it the server and the admin token). */
function run(args: string[], env: Record<string, string> = {}): Promise<Run> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [cli.file, ...args], {
      cwd: dir,
      env: { ...process.env, ...env },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stdout = "";
    let stderr = "";
    child.stdout.setEncoding("utf8").on("data", (d: string) => (stdout += d));
    child.stderr.setEncoding("utf8").on("data", (d: string) => (stderr += d));
    child.once("error", reject);
    child.once("close", (code) => resolve({ code, stdout, stderr }));
  });
}

const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

beforeAll(async () => {
  cli = await bundleCli();
  dir = await mkdtemp(path.join(tmpdir(), "job-run-"));
  const data = path.join(dir, ".runner-depot");
  serve = spawnJsonLogged([
    cli.file,
    "serve",
    "--data",
    data,
    "--runner-port",
    "0",
    "--depot-port",
    "0",
    "--log-format",
    "json",
  ]);
  while (!serve.logs.some((l) => l.msg === "runner-depot serving") && serve.child.exitCode === null) await pause(100);
  if (serve.child.exitCode !== null) throw new Error(`serve exited: ${JSON.stringify(serve.logs)}`);
}, 120_000);

afterAll(async () => {
  if (serve && serve.child.exitCode === null) {
    serve.child.kill("SIGTERM");
    await serve.exited;
  }
  await cli?.remove();
  if (dir) await rm(dir, { recursive: true, force: true });
});

describe("job --run and agent --config with job --json output", () => {
  it("job --run runs the command here, streams it to the server and exits with its exit code", async () => {
    const job = await run([
      "job",
      "--run",
      "--repo",
      "https://git.example/app.git",
      "--",
      process.execPath,
      "-e",
      "console.log('out line'); console.error('err line'); process.exit(3)",
    ]);
    expect(job.code, job.stderr).toBe(3);
    expect(job.stdout).toBe("out line\n");
    const id = /job ([0-9a-f-]{36}) created; running it here/.exec(job.stderr)?.[1];
    expect(id, job.stderr).toBeDefined();
    expect(job.stderr).toContain("err line\n");
    // The server stored both lines and the result: the log, read back through the command.
    const logs = await run(["logs", id!]);
    expect(logs.stdout).toBe("out line\n");
    expect(logs.stderr).toContain("err line");
    // Log sections (issue 24 item 2): one section of a job's log, by name, through the control API.
    const grouped = await run([
      "job",
      "--run",
      "--",
      process.execPath,
      "-e",
      "console.log('a'); console.log('::group::Build'); console.log('b1'); console.log('::endgroup::'); console.log('c')",
    ]);
    const groupedId = /job ([0-9a-f-]{36}) created; running it here/.exec(grouped.stderr)?.[1];
    expect(grouped.code, grouped.stderr).toBe(0);
    expect((await run(["logs", groupedId!, "--section", "Build"])).stdout).toBe("::group::Build\nb1\n::endgroup::\n");
    const missing = await run(["logs", groupedId!, "--section", "Deploy"]);
    expect(missing.code).toBe(1);
    expect(missing.stderr).toContain("has no section");
    const jobs = await run(["jobs", "--json"]);
    const listed = (JSON.parse(jobs.stdout) as { jobs: Array<Record<string, unknown>> }).jobs.find(
      (j) => j.requestId === id,
    );
    expect(listed).toMatchObject({ exitCode: 3, repoUrl: "https://git.example/app.git" });
  }, 120_000);

  it("logs --grep prints the matching lines with their numbers, searched on the server (issue 24, item 3)", async () => {
    const job = await run([
      "job",
      "--run",
      "--",
      process.execPath,
      "-e",
      "for (let i = 0; i < 5000; i++) console.log(i % 1000 === 7 ? 'Hit ' + i : 'line ' + i)",
    ]);
    expect(job.code, job.stderr).toBe(0);
    const id = /job ([0-9a-f-]{36}) created; running it here/.exec(job.stderr)![1]!;
    const want = "8:Hit 7\n1008:Hit 1007\n2008:Hit 2007\n3008:Hit 3007\n4008:Hit 4007\n";
    expect(await run(["logs", id, "--grep", "Hit"])).toMatchObject({ code: 0, stdout: want });
    // Case-sensitive by default, like grep; -i and --regex as grep's.
    expect(await run(["logs", id, "--grep", "hit"])).toMatchObject({ code: 1, stdout: "" });
    expect(await run(["logs", id, "--grep", "hit", "-i"])).toMatchObject({ code: 0, stdout: want });
    expect(await run(["logs", id, "--grep", "^Hit \\d*7$", "--regex"])).toMatchObject({ code: 0, stdout: want });
    const bad = await run(["logs", id, "--grep", "(a)\\1", "--regex"]);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain("not a regular expression RE2 takes");
  }, 60_000);

  it("agent --config runs a saved `job --json`, and names a file that is no job config", async () => {
    const created = await run(["job", "--json", "--", process.execPath, "-e", "console.log('from the saved job')"]);
    expect(created.code, created.stderr).toBe(0);
    const saved = JSON.parse(created.stdout) as { requestId: string; config: { requestId: string; command: string } };
    expect(saved.config).toMatchObject({ requestId: saved.requestId, command: process.execPath });
    await writeFile(path.join(dir, "job.json"), created.stdout);
    const agent = await run(["agent", "--config", "job.json"]);
    expect(agent.code, agent.stderr).toBe(0);
    expect(agent.stdout).toBe("from the saved job\n");

    // Old `job --json` output (no config) and a file without a version are named for what they are.
    const { config: _config, ...old } = saved;
    await writeFile(path.join(dir, "old.json"), JSON.stringify(old));
    const fromOld = await run(["agent", "--config", "old.json"]);
    expect(fromOld.code).toBe(2);
    expect(fromOld.stderr).toMatch(/'runner-depot job --json' output without its "config" field.*job --run/);
    await writeFile(path.join(dir, "other.json"), JSON.stringify({ endpoint: "http://127.0.0.1:1" }));
    const fromOther = await run(["agent", "--config", "other.json"]);
    expect(fromOther.code).toBe(2);
    expect(fromOther.stderr).toMatch(/no "version" field: not a job config/);
    expect(fromOther.stderr).not.toMatch(/undefined/);
    expect(await readFile(path.join(dir, "job.json"), "utf8")).toBe(created.stdout);
  }, 120_000);

  it("job --secret-env declares a secret: masked by the agent, and by the server for a client that does not mask", async () => {
    const secret = `tok-${randomUUID()}`;
    const env = { JOB_SECRET: secret };
    const job = await run(
      [
        "job",
        "--run",
        "--secret-env",
        "JOB_SECRET",
        "--",
        process.execPath,
        "-e",
        "console.log('before\\nkey=' + process.env.JOB_SECRET + '\\nafter'); setTimeout(() => console.log('plain'), 50)",
      ],
      env,
    );
    expect(job.code, job.stderr).toBe(0);
    // The agent's local echo (bytes a pipe read, or a line at a time around a secret) and the stored log: masked.
    expect(job.stdout).toBe("before\nkey=***\nafter\nplain\n");
    const id = /job ([0-9a-f-]{36}) created/.exec(job.stderr)![1]!;
    expect((await run(["logs", id])).stdout).toBe("before\nkey=***\nafter\nplain\n");

    // A job whose lines come from a client that does not mask: the server masks what `job` declared.
    const created = await run(["job", "--json", "--secret-env", "JOB_SECRET", "--", "true"], env);
    expect(created.code, created.stderr).toBe(0);
    const { requestId, token, endpoint, config } = JSON.parse(created.stdout) as {
      requestId: string;
      token: string;
      endpoint: string;
      config: { secrets?: string[] };
    };
    expect(config.secrets).toEqual([secret]);
    const client = createRunnerClient({ endpoint, requestId, token });
    client.log(`raw ${secret} line`);
    await client.end({ exitCode: 0, success: true, repoUrl: "", commitSha: "" });
    await client.close();
    const raw = await run(["logs", requestId]);
    expect(raw.stdout).toBe("raw *** line\n");

    // A missing variable is a usage error naming it; nothing is created.
    const missing = await run(["job", "--secret-env", "NO_SUCH_VAR_HERE", "--", "true"]);
    expect(missing.code).toBe(2);
    expect(missing.stderr).toContain("--secret-env NO_SUCH_VAR_HERE");
  }, 120_000);

  it("POST /-/jobs reads at most 1 MiB of JSON object; more is TOO_LARGE, a non-object INVALID_ARGUMENT", async () => {
    const state = JSON.parse(await readFile(path.join(dir, ".runner-depot", "serve.json"), "utf8")) as {
      depotUrl: string;
      adminToken: string;
    };
    const post = (body: string) =>
      fetch(`${state.depotUrl}/-/jobs`, {
        method: "POST",
        headers: { authorization: `Bearer ${state.adminToken}`, "content-type": "application/json" },
        body,
      });
    const huge = await post(JSON.stringify({ command: ["true"], secrets: ["x".repeat(2 * 1024 * 1024)] }));
    expect(huge.status).toBe(413);
    expect(((await huge.json()) as { code: string }).code).toBe("TOO_LARGE");
    for (const body of ["null", "not json"]) {
      const bad = await post(body);
      expect(bad.status).toBe(400);
      expect(((await bad.json()) as { code: string }).code).toBe("INVALID_ARGUMENT");
    }
  }, 60_000);
});
