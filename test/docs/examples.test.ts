/**
 * Smoke test of examples/: every example runs with its one command, answers its own
 * requests and exits 0; every server example also serves a request sent from here with
 * `--serve` and stops cleanly on SIGTERM. The host unit-test example runs under its own
 * vitest root. orchestrator-loop uses the run's RabbitMQ (skipped, with the reason, without one).
 */
import { spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import http2 from "node:http2";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { createRunnerClient } from "../../src/runner/index.js";
import { RABBITMQ_URL, SERVICES, withBrokerInUse } from "../fixtures/backends.js";

const ROOT = fileURLToPath(new URL("../..", import.meta.url));
const TIMEOUT_MS = 45_000;

/**
 * The parent's environment minus vitest's own variables (they would confuse a nested
 * vitest), without colours, with this run's RabbitMQ for orchestrator-loop.
 */
function childEnv(): NodeJS.ProcessEnv {
  const env = Object.fromEntries(
    Object.entries(process.env).filter(([key]) => !key.startsWith("VITEST") && key !== "FORCE_COLOR"),
  );
  return { ...env, NO_COLOR: "1", AMQP_URL: RABBITMQ_URL };
}

interface Run {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

/** Runs a command to completion (killed after TIMEOUT_MS). */
function run(args: string[]): Promise<Run> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, args, { cwd: ROOT, env: childEnv(), stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout.setEncoding("utf8").on("data", (d: string) => (stdout += d));
    child.stderr.setEncoding("utf8").on("data", (d: string) => (stderr += d));
    const timer = setTimeout(() => child.kill("SIGKILL"), TIMEOUT_MS);
    child.once("error", reject);
    child.once("close", (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, stdout, stderr });
    });
  });
}

const tsx = (file: string, ...rest: string[]) => ["--import", "tsx", `examples/${file}`, ...rest];

/** Starts an example with --serve, waits for its "listening on <url>" line, lets `use` talk to it, then SIGTERMs it. */
async function serveAndStop(file: string, use: (url: string) => Promise<void>): Promise<Run> {
  const child = spawn(process.execPath, tsx(file, "--serve"), {
    cwd: ROOT,
    env: childEnv(),
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stdout = "";
  let stderr = "";
  child.stderr.setEncoding("utf8").on("data", (d: string) => (stderr += d));
  const closed = new Promise<Run>((resolve) =>
    child.once("close", (code, signal) => resolve({ code, signal, stdout, stderr })),
  );
  const timer = setTimeout(() => child.kill("SIGKILL"), TIMEOUT_MS);
  try {
    const url = await new Promise<string>((resolve, reject) => {
      child.stdout.setEncoding("utf8").on("data", (d: string) => {
        stdout += d;
        const match = /listening on (http:\/\/127\.0\.0\.1:\d+)/.exec(stdout);
        if (match) resolve(match[1]!);
      });
      void closed.then((r) =>
        reject(new Error(`${file} exited before listening: ${r.code}\n${r.stdout}\n${r.stderr}`)),
      );
    });
    await use(url);
  } finally {
    child.kill("SIGTERM");
  }
  const result = await closed;
  clearTimeout(timer);
  return result;
}

function expectClean(result: Run, name: string): void {
  expect(
    { code: result.code, signal: result.signal },
    `${name}\n--- stdout\n${result.stdout}\n--- stderr\n${result.stderr}`,
  ).toEqual({ code: 0, signal: null });
}

describe("examples answer their own requests and exit 0", () => {
  for (const [name, prefix] of [
    ["depot-node-http.ts", "depot-node-http"],
    ["depot-express.ts", "depot-express"],
    ["depot-fastify.ts", "depot-fastify"],
    ["depot-hono.ts", "depot-hono"],
  ] as const) {
    it(name, async () => {
      const result = await run(tsx(name));
      expectClean(result, name);
      expect(result.stdout).toContain(`${prefix}: published hello@1.0.0`);
      expect(result.stdout).toMatch(
        new RegExp(
          `${prefix}: GET http://127\\.0\\.0\\.1:\\d+/depot/data/hello@1\\.0\\.0 -> \\d+ bytes, sha256:[0-9a-f]{64} verified`,
        ),
      );
      expect(result.stdout).toContain(
        `${prefix}: manifest items dir:bin file:bin/hello link:bin/hi file:share/hello/data.bin`,
      );
      expect(result.stdout).toContain(`${prefix}: done`);
    });
  }

  for (const prefix of ["console-node-http", "console-express", "console-fastify", "console-hono"] as const) {
    it(`${prefix}.ts`, async () => {
      const result = await run(tsx(`${prefix}.ts`));
      expectClean(result, prefix);
      // Signed in once, read the job list, followed the job's events until its cancel ended them.
      expect(result.stdout).toContain(`${prefix}: login -> 303 /console/`);
      expect(result.stdout).toContain(`${prefix}: GET job page -> 200 text/html; charset=utf-8`);
      expect(result.stdout).toContain(`${prefix}: jobs demo:open`);
      expect(result.stdout).toContain(`${prefix}: cancel -> 200`);
      expect(result.stdout).toContain(
        `${prefix}: streamed ["\\u001b[32mbuilding\\u001b[0m","warning: demo"] then end cancelled`,
      );
      expect(result.stdout).toMatch(
        new RegExp(`${prefix}: packages -> 200 \\{"packages":\\[\\{"name":"hello","latest":"1\\.0\\.0"`),
      );
      expect(result.stdout).toContain(`${prefix}: without the session -> 401`);
      expect(result.stdout).toContain(`${prefix}: done`);
    });
  }

  it("runner-http2.ts", async () => {
    const result = await run(tsx("runner-http2.ts"));
    expectClean(result, "runner-http2");
    expect(result.stdout).toContain('runner-http2: GET /healthz -> {"ok":true');
    expect(result.stdout).toContain(
      'runner-http2: stored lines: ["out: compiling…","err: warning: something mild","out: tests passed"]',
    );
    expect(result.stdout).toContain("runner-http2: result outcome=finished success=true requestId=true");
  });

  it("runner-fastify.ts", async () => {
    const result = await run(tsx("runner-fastify.ts"));
    expectClean(result, "runner-fastify");
    expect(result.stdout).toContain('runner-fastify: GET /healthz -> {"ok":true');
    expect(result.stdout).toContain("runner-fastify: result outcome=finished exitCode=0 stdout=3 requestId=true");
  });

  it("orchestrator-loop.ts (RabbitMQ)", async ({ skip }) => {
    skip(SERVICES.rabbitmq.url === null, `RabbitMQ unavailable: ${SERVICES.rabbitmq.reason}`);
    // Never while another file has the shared broker stopped for its outage test.
    const result = await withBrokerInUse(() => run(tsx("orchestrator-loop.ts")));
    expectClean(result, "orchestrator-loop");
    expect(result.stdout).toMatch(/stdout\] step checkout\n/);
    expect(result.stdout).toMatch(/stderr\] 1 warning\n/);
    expect(result.stdout).toMatch(
      /consumed runner\.v1\.JobResult messageId=[0-9a-f-]{36} persistent=true outcome=finished exitCode=0/,
    );
    expect(result.stdout).toContain('followed 5 lines; result finished success=true lines={"stdout":4,"stderr":1}');
    expect(result.stdout).toContain("VM exited 0");
    expect(result.stdout).toContain("vm-agent: job");
    // Up to the outage test's own bound (240 s) of waiting for the broker, then the run.
  }, 300_000);

  it("host-unit-test (its own vitest root)", async () => {
    const result = await run([
      fileURLToPath(new URL("../../node_modules/vitest/vitest.mjs", import.meta.url)),
      "run",
      "--root",
      "examples/host-unit-test",
    ]);
    expectClean(result, "host-unit-test");
    expect(result.stdout).toMatch(/Tests\s+\d+ passed/);
    expect(result.stdout).not.toMatch(/failed/);
  });
});

describe("server examples with --serve answer a request from outside and stop on SIGTERM", () => {
  for (const name of ["depot-node-http.ts", "depot-express.ts", "depot-fastify.ts", "depot-hono.ts"]) {
    it(name, async () => {
      let answer: { status: number; body: unknown } | undefined;
      const result = await serveAndStop(name, async (url) => {
        const response = await fetch(`${url}/depot/catalog`);
        answer = { status: response.status, body: await response.json() };
      });
      expect(answer).toEqual({ status: 200, body: { packages: {}, count: 0, position: 0, updatedAt: null } });
      expectClean(result, name);
    });
  }

  for (const name of ["console-node-http.ts", "console-express.ts", "console-fastify.ts", "console-hono.ts"]) {
    it(name, async () => {
      const seen: Array<[string, number, string]> = [];
      const result = await serveAndStop(name, async (url) => {
        // From outside: the page asks to sign in, the script is served, the API refuses.
        for (const path of ["/console/", "/console/assets/console.js", "/console/api/jobs"]) {
          const response = await fetch(`${url}${path}`);
          seen.push([path, response.status, response.headers.get("content-type") ?? ""]);
          await response.text();
        }
      });
      expect(seen).toEqual([
        ["/console/", 401, "text/html; charset=utf-8"],
        ["/console/assets/console.js", 200, "text/javascript; charset=utf-8"],
        ["/console/api/jobs", 401, "application/problem+json"],
      ]);
      expectClean(result, name);
    });
  }

  for (const name of ["runner-http2.ts", "runner-fastify.ts"]) {
    it(name, async () => {
      let health = "";
      let committed = -1;
      const result = await serveAndStop(name, async (url) => {
        const session = http2.connect(url);
        health = await new Promise<string>((resolve, reject) => {
          const req = session.request({ ":path": "/healthz" });
          let body = "";
          req.setEncoding("utf8").on("data", (d: string) => (body += d));
          req.on("end", () => resolve(body)).on("error", reject);
          req.end();
        });
        session.close();
        const client = createRunnerClient({ endpoint: url, requestId: randomUUID() });
        client.log("from the smoke test");
        await client.end({ exitCode: 0, success: true, repoUrl: "", commitSha: "" });
        committed = client.stats.committed;
        await client.close();
      });
      expect(JSON.parse(health)).toMatchObject({ ok: true });
      expect(committed).toBe(2);
      expectClean(result, name);
    });
  }
});
