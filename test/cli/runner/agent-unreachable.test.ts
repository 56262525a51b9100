/**
 * Issue 29 item 10: `runner-depot agent` pointed at a runner that never answers (a port
 * nothing listens on; a server that accepts and never answers) used to run the job
 * anyway, then retry for 10 minutes. Now it retries its credentials check for `--wait`
 * seconds and exits 1 without running the command; a runner that comes up within the
 * wait gets the job. The agent runs in its own process (tsx), over real sockets.
 */
import { spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { createServer } from "node:net";
import os from "node:os";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createMemoryQueue } from "../../../src/adapters/memory/index.js";
import { createRunnerService, startRunnerServer } from "../../../src/runner/index.js";
import { startHostileServer } from "../../fixtures/hostile-runner-server.js";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
const main = path.join(root, "src", "cli", "main.ts");
const tsx = pathToFileURL(path.join(root, "node_modules", "tsx", "dist", "loader.mjs")).href;

let dir: string;
beforeAll(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), "runner-depot-agent-unreachable-"));
});
afterAll(async () => {
  if (dir) await rm(dir, { recursive: true, force: true });
});

/** Starts the agent for a job that touches `marker` and prints a line; `exited` resolves with its exit code. */
function agent(endpoint: string, requestId: string, marker: string, wait: string) {
  const script = `require("node:fs").writeFileSync(${JSON.stringify(marker)}, "ran"); console.log("the job ran");`;
  const child = spawn(
    process.execPath,
    [
      "--import",
      tsx,
      main,
      "agent",
      "--quiet",
      "--wait",
      wait,
      "--endpoint",
      endpoint,
      "--request-id",
      requestId,
      "--",
      process.execPath,
      "-e",
      script,
    ],
    { stdio: ["ignore", "ignore", "pipe"], env: { ...process.env, RUNNER_DEPOT_JOB_TOKEN: "" } },
  );
  let stderr = "";
  child.stderr.on("data", (d: Buffer) => (stderr += d));
  const exited = new Promise<number | null>((r) => child.once("close", (code) => r(code)));
  return { child, exited, stderr: () => stderr };
}

/** A port nothing listens on (one was bound, then released). */
async function closedPort(): Promise<number> {
  const probe = createServer();
  await new Promise<void>((r) => probe.listen(0, "127.0.0.1", r));
  const port = (probe.address() as { port: number }).port;
  await new Promise((r) => probe.close(r));
  return port;
}

async function until(done: () => boolean, ms: number): Promise<boolean> {
  const end = Date.now() + ms;
  while (!done() && Date.now() < end) await new Promise((r) => setTimeout(r, 20));
  return done();
}

describe("runner-depot agent when the runner never answers", () => {
  it("exits 1 without running the command when nothing listens at the endpoint", async () => {
    const port = await closedPort();
    const marker = path.join(dir, "refused");
    const job = agent(`http://127.0.0.1:${port}`, randomUUID(), marker, "2");
    try {
      expect(await job.exited).toBe(1);
      const stderr = job.stderr();
      // It tried more than once before giving up, and said why each time.
      expect(stderr).toMatch(
        /cannot reach the runner at http:\/\/127\.0\.0\.1:\d+ .*connection refused.*trying again in/,
      );
      expect(stderr).toMatch(
        /cannot reach the runner at http:\/\/127\.0\.0\.1:\d+ \(.*connection refused.*\) within 2 s; check --endpoint and that the runner is up \(--wait to wait longer\); the command was not run/,
      );
      expect(stderr).not.toMatch(/running it anyway/);
      expect(existsSync(marker)).toBe(false);
    } finally {
      job.child.kill("SIGKILL");
    }
  }, 60_000);

  it("exits 1 without running the command when the server accepts the call and never answers", async () => {
    const server = await startHostileServer({ kind: "stall" });
    const marker = path.join(dir, "stalled");
    const job = agent(server.url, randomUUID(), marker, "2");
    try {
      expect(await job.exited).toBe(1);
      expect(job.stderr()).toMatch(/no answer within \d+ ms\) within 2 s; .*the command was not run/);
      expect(job.stderr()).not.toMatch(/running it anyway/);
      // The checks reached the server: it is the silence that stops the agent, not the connection.
      expect(server.calls).toBeGreaterThanOrEqual(1);
      expect(existsSync(marker)).toBe(false);
    } finally {
      job.child.kill("SIGKILL");
      await server.close();
    }
  }, 60_000);

  it("runs the job when the runner comes up within the wait", async () => {
    const port = await closedPort();
    const requestId = randomUUID();
    const marker = path.join(dir, "late");
    const job = agent(`http://127.0.0.1:${port}`, requestId, marker, "120");
    const queue = createMemoryQueue();
    const runner = createRunnerService(queue, {});
    let server: Awaited<ReturnType<typeof startRunnerServer>> | undefined;
    try {
      // Only once the agent has found nothing there does the runner start listening.
      expect(await until(() => /trying again in/.test(job.stderr()), 60_000)).toBe(true);
      expect(existsSync(marker)).toBe(false);
      server = await startRunnerServer(runner, { port, host: "127.0.0.1" });
      expect(await job.exited).toBe(0);
      expect(existsSync(marker)).toBe(true);
      expect((await runner.logs.read(requestId)).map((l) => l.line)).toEqual(["the job ran"]);
      expect(queue.results.find((r) => r.requestId === requestId)).toMatchObject({ outcome: "finished", exitCode: 0 });
    } finally {
      job.child.kill("SIGKILL");
      await server?.close();
      await runner.close();
    }
  }, 180_000);
});
