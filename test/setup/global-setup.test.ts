/**
 * The test run's global setup: how it decides what PostgreSQL and RabbitMQ to use
 * (every branch, with recorded probes and starters), the real probes against a closed
 * port, a silent port and this run's services, and whole nested vitest runs that show a
 * missing broker skipped with its reason in the summary: exit 0 outside CI, 1 in CI.
 */
import { spawn } from "node:child_process";
import net from "node:net";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { POSTGRES_URL, RABBITMQ_URL, SERVICES, withBrokerInUse } from "../fixtures/backends.js";
import { probePostgres, probeRabbitMq } from "./service-ways.js";
import {
  decidePostgres,
  decideRabbitMq,
  DEFAULT_POSTGRES_URL,
  DEFAULT_RABBITMQ_URL,
  redact,
  startersFrom,
} from "./services.js";
import type { RabbitMqStarter, ServiceWays, Started } from "./services.js";
import { isCi, skipVerdict } from "./skip-summary.js";

/** Ways that answer as scripted and record what was asked of them. */
function scripted(script: {
  postgres?: Record<string, string | null>;
  rabbitmq?: Record<string, string | null>;
  embedded?: string | Error;
  can?: Partial<Record<RabbitMqStarter, string | null>>;
  start?: Partial<Record<RabbitMqStarter, string | Error>>;
}): ServiceWays & { calls: string[]; stopped: string[] } {
  const calls: string[] = [];
  const stopped: string[] = [];
  const started = (url: string, control?: string[]): Started => ({
    url,
    control,
    stop: async () => void stopped.push(url),
  });
  return {
    calls,
    stopped,
    async probePostgres(url) {
      calls.push(`probe postgres ${url}`);
      return script.postgres && url in script.postgres ? (script.postgres[url] ?? null) : "ECONNREFUSED";
    },
    async probeRabbitMq(url) {
      calls.push(`probe rabbitmq ${url}`);
      return script.rabbitmq && url in script.rabbitmq ? (script.rabbitmq[url] ?? null) : "ECONNREFUSED";
    },
    async startEmbeddedPostgres() {
      calls.push("start embedded");
      if (script.embedded instanceof Error) throw script.embedded;
      return started(script.embedded ?? "postgres://postgres@127.0.0.1:40001/postgres");
    },
    async canStart(starter) {
      calls.push(`can ${starter}`);
      return script.can && starter in script.can ? (script.can[starter] ?? null) : null;
    },
    async startRabbitMq(starter) {
      calls.push(`start ${starter}`);
      const outcome = script.start?.[starter];
      if (outcome instanceof Error) throw outcome;
      return started(outcome ?? `amqp://guest:guest@127.0.0.1:4000${starter === "docker" ? 1 : 2}`, [`${starter}-ctl`]);
    },
    async localControl() {
      calls.push("local control");
      return ["rabbitmqctl"];
    },
  };
}

describe("PostgreSQL: the requested server when it answers, else an embedded one", () => {
  it("uses the default URL when it answers, and starts nothing", async () => {
    const ways = scripted({ postgres: { [DEFAULT_POSTGRES_URL]: null } });
    const { choice } = await decidePostgres({}, ways);
    expect(choice).toMatchObject({ url: DEFAULT_POSTGRES_URL, how: "reachable" });
    expect(ways.calls).toEqual([`probe postgres ${DEFAULT_POSTGRES_URL}`]);
  });

  it("probes RUNNER_DEPOT_TEST_POSTGRES, and starts the embedded one when it does not answer", async () => {
    const ways = scripted({ postgres: { "postgres://db.example:5432/x": "ETIMEDOUT" } });
    const decision = await decidePostgres({ RUNNER_DEPOT_TEST_POSTGRES: "postgres://db.example:5432/x" }, ways);
    expect(decision.choice).toMatchObject({
      url: "postgres://postgres@127.0.0.1:40001/postgres",
      requested: "postgres://db.example:5432/x",
      how: "embedded",
    });
    expect(decision.choice.reason).toBe(
      "nothing usable at postgres://db.example:5432/x (ETIMEDOUT); started an embedded PostgreSQL (PGlite) at postgres://postgres@127.0.0.1:40001/postgres",
    );
    expect(ways.calls).toEqual(["probe postgres postgres://db.example:5432/x", "start embedded"]);
    await decision.stop();
    expect(ways.stopped).toEqual(["postgres://postgres@127.0.0.1:40001/postgres"]);
  });

  it("`embedded` goes straight to the embedded one; `skip` skips without probing", async () => {
    const embedded = scripted({});
    expect((await decidePostgres({ RUNNER_DEPOT_TEST_POSTGRES: "embedded" }, embedded)).choice.how).toBe("embedded");
    expect(embedded.calls).toEqual(["start embedded"]);
    const skipped = scripted({});
    expect((await decidePostgres({ RUNNER_DEPOT_TEST_POSTGRES: "skip" }, skipped)).choice).toMatchObject({
      url: null,
      how: "unavailable",
      reason: "RUNNER_DEPOT_TEST_POSTGRES=skip",
    });
    expect(skipped.calls).toEqual([]);
  });

  it("an embedded one that fails to start leaves PostgreSQL unavailable, with both reasons", async () => {
    const ways = scripted({ embedded: new Error("embedded PostgreSQL exited with 1: out of memory\nstack") });
    const { choice } = await decidePostgres({}, ways);
    expect(choice).toMatchObject({ url: null, how: "unavailable" });
    expect(choice.reason).toBe(
      `nothing usable at ${DEFAULT_POSTGRES_URL} (ECONNREFUSED); the embedded PostgreSQL did not start (embedded PostgreSQL exited with 1: out of memory)`,
    );
  });
});

describe("RabbitMQ: the requested broker when it answers, else one started, else skipped with the reason", () => {
  it("uses the default URL when it answers, with rabbitmqctl when this machine reaches the node", async () => {
    const ways = scripted({ rabbitmq: { [DEFAULT_RABBITMQ_URL]: null } });
    const { choice } = await decideRabbitMq({}, ways);
    expect(choice).toMatchObject({
      url: DEFAULT_RABBITMQ_URL,
      how: "reachable",
      control: ["rabbitmqctl"],
      reason: "answered at amqp://guest:***@127.0.0.1:5672",
    });
    expect(ways.calls).toEqual([`probe rabbitmq ${DEFAULT_RABBITMQ_URL}`, "local control"]);
  });

  it("tries Docker first, then the Debian package, and says why each way was passed over", async () => {
    const ways = scripted({ can: { docker: "no Docker daemon (socket missing)" } });
    const decision = await decideRabbitMq({ RUNNER_DEPOT_TEST_RABBITMQ: "amqp://u:secret@127.0.0.1:1" }, ways);
    expect(decision.choice).toMatchObject({
      url: "amqp://guest:guest@127.0.0.1:40002",
      how: "rabbitmq-server",
      control: ["rabbitmq-server-ctl"],
    });
    expect(decision.choice.reason).toBe(
      "nothing at amqp://u:***@127.0.0.1:1 (ECONNREFUSED); docker: no Docker daemon (socket missing); started one with rabbitmq-server at amqp://guest:***@127.0.0.1:40002",
    );
    expect(ways.calls).toEqual([
      "probe rabbitmq amqp://u:secret@127.0.0.1:1",
      "can docker",
      "can rabbitmq-server",
      "start rabbitmq-server",
    ]);
    await decision.stop();
    expect(ways.stopped).toEqual(["amqp://guest:guest@127.0.0.1:40002"]);
  });

  it("a way that fails to start is reported and the next one is tried", async () => {
    const ways = scripted({ start: { docker: new Error("pull access denied") } });
    const { choice } = await decideRabbitMq({}, ways);
    expect(choice.how).toBe("rabbitmq-server");
    expect(choice.reason).toContain("docker failed: pull access denied; started one with rabbitmq-server");
  });

  it("with no way to start one, RabbitMQ is unavailable and every reason is kept", async () => {
    const ways = scripted({ can: { docker: "not installed", "rabbitmq-server": "needs root" } });
    const { choice } = await decideRabbitMq({}, ways);
    expect(choice).toMatchObject({ url: null, how: "unavailable", control: null });
    expect(choice.reason).toBe(
      "nothing at amqp://guest:***@127.0.0.1:5672 (ECONNREFUSED); docker: not installed; rabbitmq-server: needs root",
    );
  });

  it("RUNNER_DEPOT_TEST_RABBITMQ_START orders the ways or turns them off; `skip` tries nothing", async () => {
    const ordered = scripted({});
    expect(
      (await decideRabbitMq({ RUNNER_DEPOT_TEST_RABBITMQ_START: "rabbitmq-server, docker" }, ordered)).choice.how,
    ).toBe("rabbitmq-server");
    expect(ordered.calls).not.toContain("can docker");
    const none = scripted({});
    const { choice } = await decideRabbitMq({ RUNNER_DEPOT_TEST_RABBITMQ_START: "none" }, none);
    expect(choice).toMatchObject({
      how: "unavailable",
      reason: "nothing at amqp://guest:***@127.0.0.1:5672 (ECONNREFUSED); RUNNER_DEPOT_TEST_RABBITMQ_START=none",
    });
    expect(none.calls).toEqual([`probe rabbitmq ${DEFAULT_RABBITMQ_URL}`]);
    const skip = scripted({});
    expect((await decideRabbitMq({ RUNNER_DEPOT_TEST_RABBITMQ: "skip" }, skip)).choice.reason).toBe(
      "RUNNER_DEPOT_TEST_RABBITMQ=skip",
    );
    expect(skip.calls).toEqual([]);
    expect(() => startersFrom({ RUNNER_DEPOT_TEST_RABBITMQ_START: "docker,podman" })).toThrow('unknown way "podman"');
  });

  it("never prints a password", () => {
    expect(redact("amqp://guest:guest@127.0.0.1:5672")).toBe("amqp://guest:***@127.0.0.1:5672");
    expect(redact("postgres://app:hunter2@db:5432/x?sslmode=require")).toBe(
      "postgres://app:***@db:5432/x?sslmode=require",
    );
    expect(redact("not a url")).toBe("not a url");
  });
});

describe("the summary: skipped tests grouped by reason; in CI any skip fails the run", () => {
  const skipped = [
    { file: "test/a.test.ts", name: "a > one", note: "RabbitMQ unavailable: x" },
    { file: "test/a.test.ts", name: "a > two", note: "RabbitMQ unavailable: x" },
    { file: "test/b.test.ts", name: "b > one", note: undefined },
  ];

  it("outside CI: listed with their reasons, the run passes", () => {
    expect(skipVerdict(skipped, false)).toEqual({
      lines: [
        "skipped: 3 tests",
        "  - RabbitMQ unavailable: x: test/a.test.ts (2)",
        "  - skipped in the code (it.skip / describe.skip / .todo): test/b.test.ts (1)",
      ],
      fail: false,
    });
    expect(skipVerdict([], true)).toEqual({ lines: [], fail: false });
  });

  it("in CI: the same lines and a failure", () => {
    const verdict = skipVerdict(skipped.slice(2), true);
    expect(verdict.fail).toBe(true);
    expect(verdict.lines.at(-1)).toBe("CI=true: CI has every service, so a skipped test fails the run.");
  });

  it("CI counts as on for any value but empty, false and 0", () => {
    expect([undefined, "", "false", "0", "FALSE"].map((CI) => isCi({ CI }))).toEqual([
      false,
      false,
      false,
      false,
      false,
    ]);
    expect(["true", "1", "yes"].map((CI) => isCi({ CI }))).toEqual([true, true, true]);
  });
});

describe("the real probes", () => {
  let silent: net.Server;
  let silentPort: number;
  const held: net.Socket[] = [];
  beforeAll(async () => {
    // Accepts connections and never says a word: a probe must give up on its own.
    silent = net.createServer((socket) => void held.push(socket));
    await new Promise<void>((resolve) => silent.listen(0, "127.0.0.1", resolve));
    silentPort = (silent.address() as net.AddressInfo).port;
  });
  afterAll(async () => {
    for (const socket of held) socket.destroy();
    await new Promise((resolve) => silent.close(resolve));
  });

  it("a closed port: refused, said so", async () => {
    const closed = await closedPort();
    expect(await probePostgres(`postgres://postgres@127.0.0.1:${closed}/test`)).toMatch(/ECONNREFUSED/);
    expect(await probeRabbitMq(`amqp://guest:guest@127.0.0.1:${closed}`)).toMatch(/ECONNREFUSED/);
  });

  it("a port that accepts and stays silent: the probe gives up instead of hanging", async () => {
    const [postgres, rabbitmq] = await Promise.all([
      probePostgres(`postgres://postgres@127.0.0.1:${silentPort}/test`),
      probeRabbitMq(`amqp://guest:guest@127.0.0.1:${silentPort}`),
    ]);
    expect(postgres).toMatch(/timeout/i);
    expect(rabbitmq).toMatch(/ETIMEDOUT|timeout|timed out/i);
  });

  it("this run's services answer the probes the setup used to pick them", async ({ skip }) => {
    expect(await probePostgres(POSTGRES_URL)).toBeNull();
    skip(SERVICES.rabbitmq.url === null, `RabbitMQ unavailable: ${SERVICES.rabbitmq.reason}`);
    // Never during another file's outage test (a second worker may be running it).
    expect(await withBrokerInUse(() => probeRabbitMq(RABBITMQ_URL))).toBeNull();
    // Up to the outage test's own bound (240 s) of waiting for the broker.
  }, 300_000);
});

describe("a whole run without RabbitMQ (nested vitest with the suite's setup and reporter)", () => {
  it("skips its tests with the reason in the summary and passes; with CI=true the same run fails", async ({ skip }) => {
    skip(SERVICES.postgres.url === null, `PostgreSQL unavailable: ${SERVICES.postgres.reason}`);
    // This run's PostgreSQL is handed on, so the nested run probes it and starts nothing.
    const env = { RUNNER_DEPOT_TEST_POSTGRES: POSTGRES_URL, RUNNER_DEPOT_TEST_RABBITMQ: "skip" };
    const [local, ci] = await Promise.all([nestedRun({ ...env, CI: "" }), nestedRun({ ...env, CI: "true" })]);

    for (const run of [local, ci]) {
      expect(run.stdout).toContain(`services: PostgreSQL: reachable: answered at ${redact(POSTGRES_URL)}`);
      expect(run.stdout).toContain("services: RabbitMQ: SKIPPED: RUNNER_DEPOT_TEST_RABBITMQ=skip");
      expect(run.stdout).toMatch(/CHECK postgres=reachable/);
      expect(run.stdout).toMatch(/Tests\s+1 passed \| 2 skipped \(3\)/);
      expect(run.stdout).toContain(
        "skipped: 2 tests\n  - RabbitMQ unavailable: RUNNER_DEPOT_TEST_RABBITMQ=skip: test/setup/skip-project/rabbitmq.check.ts (2)",
      );
    }
    expect(local.code, local.stdout + local.stderr).toBe(0);
    expect(local.stdout).not.toContain("CI=true");
    expect(ci.code, ci.stdout + ci.stderr).toBe(1);
    expect(ci.stdout).toContain("CI=true: CI has every service, so a skipped test fails the run.");
    // Two nested vitest runs at once: 16 s in CI, a quarter of the default 60 s.
  }, 180_000);
});

const ROOT = fileURLToPath(new URL("../..", import.meta.url));

/** Runs vitest on test/setup/skip-project with `env` over this environment minus vitest's own variables. */
function nestedRun(env: Record<string, string>): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const base = Object.fromEntries(
    Object.entries(process.env).filter(([key]) => !key.startsWith("VITEST") && key !== "FORCE_COLOR"),
  );
  const vitest = fileURLToPath(new URL("../../node_modules/vitest/vitest.mjs", import.meta.url));
  const child = spawn(process.execPath, [vitest, "run", "--config", "test/setup/skip-project/vitest.config.ts"], {
    cwd: ROOT,
    env: { ...base, ...env, NO_COLOR: "1" },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stdout = "";
  let stderr = "";
  child.stdout.setEncoding("utf8").on("data", (d: string) => (stdout += d));
  child.stderr.setEncoding("utf8").on("data", (d: string) => (stderr += d));
  return new Promise((resolve, reject) => {
    child.once("error", reject);
    child.once("close", (code) => resolve({ code, stdout, stderr }));
  });
}

/** A port nothing listens on: one the OS just handed out and took back. */
async function closedPort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as net.AddressInfo;
  await new Promise((resolve) => server.close(resolve));
  return port;
}
