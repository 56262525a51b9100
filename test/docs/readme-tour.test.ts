/**
 * The README's "A 60-second tour", run exactly as printed: its code blocks are taken from
 * README.md, joined in order into one `tour.mts` (what the README tells a reader to do;
 * scripts/readme-tour.ts), and run with tsx in a fresh directory. The only help it gets is module resolution:
 * `runner-depot/*` resolves to this checkout's source through a tsconfig `paths` entry, as
 * an installed package would resolve to its build. The tour starts its own runner and
 * depot servers on loopback and exits; the assertions check what it printed and wrote.
 */
import { execFile } from "node:child_process";
import { mkdir, readdir, readFile, rm, stat, writeFile } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import { sectionCodeBlocks, tourProgram, TOUR_HEADING } from "../../scripts/readme-tour.js";
import { writeSourceTsconfig } from "../fixtures/source-tsconfig.js";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");

function run(command: string, args: string[], cwd: string): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(command, args, { cwd, timeout: 90_000, maxBuffer: 16 * 1024 * 1024 }, (error, stdout, stderr) => {
      const code = error ? (typeof error.code === "number" ? error.code : 1) : 0;
      resolve({ code, stdout, stderr });
    });
  });
}

describe("README tour", () => {
  const dir = path.join(root, ".tmp", `readme-tour-${process.pid}-${Date.now()}`);
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it("has three TypeScript blocks, the first importing from the package by name", async () => {
    const blocks = sectionCodeBlocks(await readFile(path.join(root, "README.md"), "utf8"), TOUR_HEADING);
    expect(blocks.map((b) => b.lang)).toEqual(["ts", "ts", "ts"]);
    expect(blocks[0]!.code).toContain('from "runner-depot/runner"');
    expect(blocks[2]!.code).toContain('from "runner-depot/depot"');
  });

  it("runs as printed: a job streams and ends with one result, a package publishes and installs", async () => {
    await mkdir(dir, { recursive: true });
    await writeFile(path.join(dir, "tour.mts"), tourProgram(await readFile(path.join(root, "README.md"), "utf8")));
    // What `npm install runner-depot` provides: the package's subpaths, here from source.
    await writeSourceTsconfig(dir, root);

    const tsx = path.join(root, "node_modules", ".bin", "tsx");
    // Twice, as a reader who runs it again would: the second run starts from an empty ./tour-data.
    const first = await run(tsx, ["tour.mts"], dir);
    expect(first.stderr, first.stdout).toBe("");
    expect(first.code).toBe(0);
    const { code, stdout, stderr } = await run(tsx, ["tour.mts"], dir);
    expect(stderr, stdout).toBe("");
    expect(code).toBe(0);

    // Block 1: the user data handed to the VM, with the job's endpoint and token inside.
    expect(stdout).toMatch(/^#cloud-config\n/);
    expect(stdout).toContain("write_files:");
    // Block 2: the job's two lines, followed live, its exit code and its one result.
    expect(stdout).toContain("OUT hello from the VM\n");
    expect(stdout).toContain("ERR a warning\n");
    expect(stdout).toContain("agent exit code 0\n");
    expect(stdout).toMatch(/outcome: 'finished'/);
    expect(stdout).toMatch(/exitCode: 0/);
    expect(stdout).toMatch(/repoUrl: 'https:\/\/git\.example\/app\.git'/);
    expect(stdout).toMatch(/lines: \{ stdout: 1, stderr: 1 \}/);
    // Block 3: both packages installed through the dependency, the file with its mode.
    expect(stdout).toContain("'installed toolchain@1.4.0'");
    expect(stdout).toContain("'installed libgreet@2.1.0'");
    expect(stdout).toContain("#!/bin/sh\necho hello\n");
    const hello = await stat(path.join(dir, "tour-data/vendor/toolchain/bin/hello"));
    expect(hello.mode & 0o777).toBe(0o755);
    expect(await readFile(path.join(dir, "tour-data/vendor/libgreet/greeting.txt"), "utf8")).toBe("hello\n");
    // The job's log is on disk in the fs log store the tour configured.
    const jobs = path.join(dir, "tour-data/logs/jobs");
    const logFiles = (await readdir(jobs)).filter((f) => f.endsWith(".log"));
    expect(logFiles).toHaveLength(1);
    expect(await readFile(path.join(jobs, logFiles[0]!), "utf8")).toContain("hello from the VM");
    // tsx runs the tour, then tsc checks it and the package source it imports: 20 s at load
    // 19, a third of the default 60 s; a busier machine stretches it, as for api-examples.
  }, 240_000);
});
