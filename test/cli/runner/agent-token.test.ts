/**
 * Issue 9, runner item 5: `runner-depot agent --token <value starting with '-'>` (about one
 * job token in 64) runs the job instead of failing with "argument is ambiguous".
 */
import { spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { describe, expect, it } from "vitest";
import { bindDashValues } from "../../../src/cli/args.js";
import { createRunnerService, mintJobToken, startRunnerServer } from "../../../src/runner/index.js";
import { createMemoryQueue } from "../../../src/adapters/memory/index.js";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
const main = path.join(root, "src", "cli", "main.ts");
const tsx = pathToFileURL(path.join(root, "node_modules", "tsx", "dist", "loader.mjs")).href;

function cli(args: string[]): Promise<{ code: number | null; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ["--import", tsx, main, ...args], { stdio: ["ignore", "ignore", "pipe"] });
    let stderr = "";
    child.stderr.on("data", (d: Buffer) => (stderr += d));
    child.on("error", reject);
    child.on("close", (code) => resolve({ code, stderr }));
  });
}

describe("agent --token with a value starting with '-'", () => {
  it("runs the job and streams it with that token", async () => {
    const secret = "dash-token-secret-0123456789";
    // A request ID whose token starts with '-' (base64url: 1 in 64).
    let id = randomUUID();
    while (!mintJobToken(secret, id).startsWith("-")) id = randomUUID();
    const token = mintJobToken(secret, id);
    const queue = createMemoryQueue();
    const runner = createRunnerService(queue, { secret });
    const server = await startRunnerServer(runner, { port: 0 });
    try {
      const run = await cli([
        "agent",
        "--endpoint",
        server.url,
        "--request-id",
        id,
        "--token",
        token,
        "--",
        process.execPath,
        "-e",
        "console.log('hello from the job')",
      ]);
      expect(run.stderr).not.toMatch(/ambiguous/);
      expect(run.code).toBe(0);
      expect((await runner.logs.read(id)).map((l) => l.line)).toEqual(["hello from the job"]);
      expect(queue.results.find((r) => r.requestId === id)).toMatchObject({ outcome: "finished", exitCode: 0 });
    } finally {
      await server.close();
      await runner.close();
    }
  });

  it("binds only string options, short and long, and leaves '--', what follows it and the command's own options alone", () => {
    const options = {
      token: { type: "string" as const, short: "t" },
      endpoint: { type: "string" as const },
      verbose: { type: "boolean" as const },
    };
    expect(bindDashValues(["--token", "-abc", "--verbose", "-t", "-x", "--", "--token", "-y"], options)).toEqual([
      "--token=-abc",
      "--verbose",
      "--token=-x",
      "--",
      "--token",
      "-y",
    ]);
    // A forgotten value stays a usage error: neither '--' nor another option is swallowed.
    expect(bindDashValues(["--token", "--", "make"], options)).toEqual(["--token", "--", "make"]);
    expect(bindDashValues(["--token", "--endpoint", "http://x"], options)).toEqual([
      "--token",
      "--endpoint",
      "http://x",
    ]);
    expect(bindDashValues(["--token", "--endpoint=http://x"], options)).toEqual(["--token", "--endpoint=http://x"]);
  });

  it("a forgotten value is still refused with the command's message", async () => {
    const run = await cli(["agent", "--token", "--endpoint", "http://127.0.0.1:1", "--", "true"]);
    expect(run.code).toBe(2);
    expect(run.stderr).toMatch(/--token needs a value/);
  });
});
