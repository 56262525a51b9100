/**
 * A newcomer's walk through real processes of the `runner-depot` command: `serve` on
 * embedded defaults, `job` printing cloud-init, `agent` running a real command whose
 * lines appear in `logs --follow` and whose result `serve` prints, then `publish` of a
 * directory with a dependency and `install` into an empty directory.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { mkdir, mkdtemp, readFile, readdir, readlink, rm, stat, symlink, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parse } from "yaml";
import { bundleCli } from "../fixtures/cli-bundle.js";
import { stopChild } from "../fixtures/stop-child.js";

// Built once as the published dist/cli.js is (tsup); run from fresh directories with no node_modules.
let bundle: Awaited<ReturnType<typeof bundleCli>>;

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs the CLI to completion. */
function cli(args: string[], cwd: string): Promise<Run> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [bundle.file, ...args], { cwd, stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d: Buffer) => (stdout += d));
    child.stderr.on("data", (d: Buffer) => (stderr += d));
    child.on("error", reject);
    child.on("close", (code) => resolve({ code, stdout, stderr }));
  });
}

let work: string;
let serve: ChildProcess;
let serveOut = "";
let state: { runnerUrl: string; depotUrl: string; adminToken: string };

beforeAll(async () => {
  bundle = await bundleCli();
  work = await mkdtemp(path.join(os.tmpdir(), "runner-depot-walk-"));
  serve = spawn(process.execPath, [bundle.file, "serve", "--runner-port", "0", "--depot-port", "0", "--no-agent"], {
    cwd: work,
    stdio: ["ignore", "pipe", "pipe"],
  });
  serve.stdout!.on("data", (d: Buffer) => (serveOut += d));
  let serveErr = "";
  serve.stderr!.on("data", (d: Buffer) => (serveErr += d));
  // `serve` writes .runner-depot/serve.json once both servers listen.
  for (let i = 0; i < 300; i++) {
    try {
      state = JSON.parse(await readFile(path.join(work, ".runner-depot", "serve.json"), "utf8"));
      break;
    } catch {
      if (serve.exitCode !== null) throw new Error(`serve exited: ${serveErr}`);
      await new Promise((r) => setTimeout(r, 100));
    }
  }
  expect(state?.depotUrl).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
  expect(serveErr).toContain(state.adminToken);
});

afterAll(async () => {
  await stopChild(serve);
  await rm(work, { recursive: true, force: true });
  await bundle?.remove();
});

describe("runner-depot command", () => {
  it("answers --help on every subcommand and exits 2 on usage errors", async () => {
    for (const sub of ["serve", "job", "agent", "logs", "jobs", "cancel", "publish", "install"]) {
      const run = await cli([sub, "--help"], work);
      expect(run.code, sub).toBe(0);
      expect(run.stdout).toContain(`runner-depot ${sub}`);
    }
    const unknown = await cli(["frobnicate"], work);
    expect(unknown.code).toBe(2);
    expect(unknown.stderr.trim().split("\n")).toHaveLength(1);
    const badFlag = await cli(["logs", "--nope"], work);
    expect(badFlag.code).toBe(2);
    expect(badFlag.stderr).toMatch(/--help/);
  });

  it("serve refuses what it cannot do safely, on one line, and exits instead of hanging", async () => {
    const none = await cli([], work);
    expect(none.code).toBe(2);
    expect(none.stderr).toContain("Usage: runner-depot");
    const exposed = await cli(["serve", "--host", "0.0.0.0", "--data", path.join(work, "exposed")], work);
    expect(exposed.code).toBe(2);
    expect(exposed.stderr).toMatch(/plain HTTP.*--insecure/);
    // The depot port is taken (by the walk's own server): serve closes what it opened and exits 1.
    const busyPort = new URL(state.depotUrl).port;
    const busy = await cli(
      ["serve", "--runner-port", "0", "--depot-port", busyPort, "--data", path.join(work, "busy")],
      work,
    );
    expect(busy.code).toBe(1);
    expect(busy.stderr.trim()).toBe(
      `runner-depot: port ${busyPort} is in use; pass --depot-port <port> (0 picks a free one)`,
    );
  });

  it("streams a job from `agent` into `logs --follow` and prints its result", async () => {
    // exitCode, not process.exit(): on Node 24 a child's stdout to its parent's pipe is
    // asynchronous, and process.exit() drops what is still queued (the job's own loss,
    // which no agent can read back; seen as the last 8 lines missing 1 run in 4).
    const script =
      "for (let i = 0; i < 200; i++) (i % 10 === 9 ? console.error : console.log)('line ' + i); process.exitCode = 3";
    const job = await cli(
      ["job", "--repo", "https://example.test/repo.git", "--commit", "abc123", "--", process.execPath, "-e", script],
      work,
    );
    expect(job.code, job.stderr).toBe(0);
    expect(job.stdout.startsWith("#cloud-config\n")).toBe(true);
    const userData = parse(job.stdout) as {
      write_files: Array<{ path: string; content: string; permissions: string }>;
      runcmd: string[][];
    };
    const config = JSON.parse(userData.write_files[0]!.content) as { requestId: string; endpoint: string };
    expect(userData.write_files[0]!.permissions).toBe("0600");
    expect(config.endpoint).toBe(state.runnerUrl);
    expect(userData.runcmd[0]!.slice(-2)).toEqual(["--config", userData.write_files[0]!.path]);

    // The stand-in VM: write the config where cloud-init would, start the agent as runcmd says.
    const configPath = path.join(work, "job.json");
    await writeFile(configPath, userData.write_files[0]!.content, { mode: 0o600 });
    const follow = cli(["logs", config.requestId, "--follow"], work);
    const agent = await cli(["agent", "--config", configPath], work);
    expect(agent.code, agent.stderr).toBe(3);

    const logs = await follow;
    expect(logs.code).toBe(3);
    const expectedOut = Array.from({ length: 200 }, (_, i) => i)
      .filter((i) => i % 10 !== 9)
      .map((i) => `line ${i}`);
    const expectedErr = Array.from({ length: 20 }, (_, k) => `line ${k * 10 + 9}`);
    expect(logs.stdout.trim().split("\n")).toEqual(expectedOut);
    const errLines = logs.stderr.trim().split("\n");
    expect(errLines.slice(0, -1)).toEqual(expectedErr);
    expect(JSON.parse(errLines.at(-1)!)).toMatchObject({
      requestId: config.requestId,
      outcome: "finished",
      exitCode: 3,
    });

    // --timestamps: each line after the time the agent read it from the job's pipe (RFC 3339, µs), in order.
    const stamped = await cli(["logs", config.requestId, "--timestamps"], work);
    expect(stamped.code, stamped.stderr).toBe(0);
    const rows = stamped.stdout.trim().split("\n");
    for (const row of rows) expect(row).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z line \d+$/);
    expect(rows.map((r) => r.slice(28))).toEqual(expectedOut);
    const times = rows.map((r) => r.slice(0, 27));
    expect([...times].sort()).toEqual(times);

    // serve printed the job result as one JSON line.
    // Up to 60 s (a condition, not a time: 5 s was thin for a loaded machine's pipe and timers).
    for (let i = 0; i < 600 && !serveOut.includes(config.requestId); i++) await new Promise((r) => setTimeout(r, 100));
    const results = serveOut
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as Record<string, unknown>);
    const result = results.find((r) => r.requestId === config.requestId);
    expect(result).toMatchObject({
      outcome: "finished",
      exitCode: 3,
      success: false,
      repoUrl: "https://example.test/repo.git",
      commitSha: "abc123",
      lines: { stdout: 180, stderr: 20 },
      logTruncated: false,
    });
  });

  it("publishes a directory with a dependency and installs it into an empty directory", async () => {
    const lib = path.join(work, "lib-src");
    await mkdir(path.join(lib, "include"), { recursive: true });
    await writeFile(path.join(lib, "include", "lib.h"), "int lib(void);\n");
    const app = path.join(work, "app-src");
    await mkdir(path.join(app, "bin"), { recursive: true });
    await writeFile(path.join(app, "bin", "app"), "#!/bin/sh\necho app\n", { mode: 0o755 });
    await writeFile(path.join(app, "README"), "héllo ünïcode\n");
    await symlink("bin/app", path.join(app, "run"));

    const pubLib = await cli(["publish", lib, "libfoo@1.2.0"], work);
    expect(pubLib.code, pubLib.stderr).toBe(0);
    const pubApp = await cli(
      ["publish", app, "app@1.0.0", "--require", "libfoo@^1.0", "--attr", "description=demo"],
      work,
    );
    expect(pubApp.code, pubApp.stderr).toBe(0);
    expect(pubApp.stderr).toContain("published app@1.0.0");

    // Publishing needs the token: without serve.json nearby (another cwd) and no token it is refused.
    const elsewhere = await mkdtemp(path.join(os.tmpdir(), "runner-depot-walk-anon-"));
    const anon = await cli(["publish", lib, "libfoo@1.3.0", "--url", state.depotUrl], elsewhere);
    expect(anon.code).toBe(1);
    expect(anon.stderr.trim().split("\n")).toHaveLength(1);

    const target = path.join(elsewhere, "vendor");
    const install = await cli(["install", "app@^1", target, "--url", state.depotUrl], elsewhere);
    expect(install.code, install.stderr).toBe(0);
    expect(install.stderr).toContain("installed app@1.0.0");
    expect(install.stderr).toContain("installed libfoo@1.2.0");

    expect(await tree(path.join(target, "app"))).toEqual(await tree(app));
    expect(await tree(path.join(target, "libfoo"))).toEqual(await tree(lib));
    await rm(elsewhere, { recursive: true, force: true });
  });
});

/** Paths, file bytes, modes and link targets of a directory tree. */
async function tree(dir: string): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const entry of await readdir(dir, { recursive: true, withFileTypes: true })) {
    const full = path.join(entry.parentPath, entry.name);
    const rel = path.relative(dir, full);
    if (entry.isSymbolicLink()) out[rel] = `link:${await readlink(full)}`;
    else if (entry.isDirectory()) out[rel] = "dir";
    else out[rel] = `file:${((await stat(full)).mode & 0o777).toString(8)}:${await readFile(full, "base64")}`;
  }
  return out;
}
