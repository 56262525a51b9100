/**
 * `runner-depot agent` (the built CLI, in its own process) against hostile runner servers
 * (issue 31, items 2 and 10): its memory while a server streams an answer without end, and
 * a TLS certificate it cannot trust, which must stop it before the job's command runs.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { randomUUID } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { bundleCli } from "../../fixtures/cli-bundle.js";
import { selfSignedCertificate, startHostileServer } from "../../fixtures/hostile-runner-server.js";

/** How much the hostile server streams into one call (the issue measured 1 GiB). */
const ANSWER_MIB = Number(process.env.HOSTILE_ANSWER_MIB ?? 256);

let cli: Awaited<ReturnType<typeof bundleCli>>;
let dir: string;
beforeAll(async () => {
  cli = await bundleCli();
  dir = await mkdtemp(path.join(os.tmpdir(), "runner-depot-agent-hostile-"));
}, 120_000);
afterAll(async () => {
  await cli?.remove();
  if (dir) await rm(dir, { recursive: true, force: true });
});

/** A job that prints a line, touches `marker` and lives until its agent is gone. */
function jobArgs(marker: string): string[] {
  const script = [
    `require("node:fs").writeFileSync(${JSON.stringify(marker)}, "ran");`,
    `console.log("a line of the job");`,
    `const parent = process.ppid;`,
    `setInterval(() => { if (process.ppid !== parent) process.exit(0); }, 200);`,
  ].join("");
  return [process.execPath, "-e", script];
}

function agent(
  endpoint: string,
  marker: string,
): ChildProcess & { stderrText(): string; exited: Promise<number | null> } {
  const child = spawn(
    process.execPath,
    [cli.file, "agent", "--quiet", "--endpoint", endpoint, "--request-id", randomUUID(), "--", ...jobArgs(marker)],
    { stdio: ["ignore", "ignore", "pipe"], env: { ...process.env, RUNNER_DEPOT_JOB_TOKEN: "" } },
  );
  let stderr = "";
  child.stderr!.on("data", (d: Buffer) => (stderr += d));
  const exited = new Promise<number | null>((r) => child.once("close", (code) => r(code)));
  return Object.assign(child, { stderrText: () => stderr, exited });
}

/** VmRSS and VmHWM (peak) of a process, in MiB. */
function memory(pid: number): { rss: number; peak: number } {
  const status = readFileSync(`/proc/${pid}/status`, "utf8");
  const kib = (name: string) => Number(new RegExp(`^${name}:\\s+(\\d+) kB`, "m").exec(status)?.[1] ?? NaN);
  return { rss: kib("VmRSS") / 1024, peak: kib("VmHWM") / 1024 };
}

async function until(done: () => boolean, ms: number): Promise<boolean> {
  const end = Date.now() + ms;
  while (!done() && Date.now() < end) await new Promise((r) => setTimeout(r, 20));
  return done();
}

describe.runIf(process.platform === "linux")("runner-depot agent against a hostile runner server", () => {
  it(`keeps its memory while a server streams ${ANSWER_MIB} MiB of answer without trailers (item 2)`, async () => {
    const server = await startHostileServer({ kind: "stream-forever", maxBytes: ANSWER_MIB * 1024 * 1024 });
    const job = agent(server.url, path.join(dir, "stream-job"));
    try {
      // Call 0 is the credentials check; call 1 the client's first StreamLogs call.
      expect(await until(() => server.calls >= 2, 60_000)).toBe(true);
      const atFirstCall = memory(job.pid!);
      // Before the bound: one call takes the whole answer. After: calls are reset at 64 KiB and retried.
      await until(() => server.answerBytes[1]! >= ANSWER_MIB * 1024 * 1024 || server.calls >= 6, 120_000);
      await new Promise((r) => setTimeout(r, 500));
      const after = memory(job.pid!);
      const growth = after.peak - atFirstCall.rss;
      console.log(
        `agent vs ${ANSWER_MIB} MiB answer: ${server.calls - 1} calls, most answer bytes written in one ` +
          `${(Math.max(...server.answerBytes.slice(1)) / 1024 / 1024).toFixed(1)} MiB; RSS at its first call ` +
          `${atFirstCall.rss.toFixed(1)} MiB, peak ${after.peak.toFixed(1)} MiB (+${growth.toFixed(1)} MiB)`,
      );
      expect(Math.max(...server.answerBytes.slice(1))).toBeLessThan(1024 * 1024);
      expect(growth).toBeLessThan(64);
      expect(job.stderrText()).toMatch(/the answer is over 65536 bytes: not a runner\.v1 Ack; retrying/);
    } finally {
      job.kill("SIGKILL");
      await job.exited;
      await server.close();
    }
  }, 240_000);

  it("stops before running the job when the server's certificate cannot be trusted (item 10)", async () => {
    const cert = await selfSignedCertificate("runner", "IP:127.0.0.1");
    const server = await startHostileServer({ kind: "lying-committed", committed: "0" }, cert);
    const marker = path.join(dir, "tls-job");
    const job = agent(server.url, marker);
    try {
      const exited = await Promise.race([job.exited, new Promise<"running">((r) => setTimeout(r, 60_000, "running"))]);
      // Before: the check counted as "unreachable", the job ran, and the client retried for 10 minutes.
      expect(exited).toBe(1);
      // Node 24 adds its own hint inside the parentheses (--use-system-ca).
      expect(job.stderrText()).toMatch(
        /cannot connect to the runner at https:\/\/127\.0\.0\.1:\d+ securely: the runner's TLS certificate is not trusted \(DEPTH_ZERO_SELF_SIGNED_CERT: self-signed certificate[^)]*\); retrying cannot fix this.*the command was not run/,
      );
      expect(existsSync(marker)).toBe(false);
      expect(server.calls).toBe(0);
    } finally {
      job.kill("SIGKILL");
      await job.exited;
      await server.close();
    }
  }, 120_000);
});
