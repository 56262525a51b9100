/**
 * `runner-depot serve` as an operator sees it, on a real process built as the published
 * CLI is: GET /metrics parsed by a Prometheus text-format parser that is not ours,
 * /healthz, /readyz turning 503 (naming the backend) when PostgreSQL or RabbitMQ becomes
 * unreachable and 200 when it is back — through TCP proxies this test owns, never by
 * stopping the machine's shared services — and the SIGTERM drain with calls in flight:
 * readiness false first, a call that finishes within the grace time kept, one that does
 * not cut and named in the log, exit 0.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { fileURLToPath } from "node:url";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { request as httpRequest, type ClientRequest } from "node:http";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import parsePrometheusTextFormat from "parse-prometheus-text-format";
import ajv2020Module from "ajv/dist/2020.js";
import { parse as parseYaml } from "yaml";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { bundleCli, serveArgs, spawnJsonLogged } from "../../fixtures/cli-bundle.js";
import {
  acquireBrokerUse,
  createTestSchema,
  needs,
  POSTGRES_URL,
  RABBITMQ_URL,
  startProxyFor,
  type TcpProxy,
} from "../../fixtures/backends.js";
import { add, openTransaction } from "../../fixtures/depot.js";
import { createServer as createTcpServer, type AddressInfo } from "node:net";
import { randomUUID } from "node:crypto";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { Runner } from "../../../src/gen/runner/v1/runner_pb.js";
import { mintJobToken } from "../../../src/runner/protocol/token.js";
import { controlledStream, line, send } from "../../fixtures/runner-service.js";

const haveBackends = needs("postgres", "rabbitmq");

/** openapi.yaml's schemas of the operator endpoints, compiled: every /readyz and /healthz body seen here must fit them. */
const openapi = parseYaml(await readFile(new URL("../../../openapi.yaml", import.meta.url), "utf8")) as {
  paths: Record<string, { get: { responses: Record<string, { content: Record<string, { schema: unknown }> }> } }>;
  components: { schemas: { Readiness: object } };
};
const ajv = new ajv2020Module.default({ strict: false });
const fitsReadiness = ajv.compile({ ...openapi.components.schemas.Readiness, additionalProperties: false });
const fitsHealth = ajv.compile(
  openapi.paths["/healthz"]!.get.responses["200"]!.content["application/json"]!.schema as object,
);

interface Serve {
  child: ChildProcess;
  /** Parsed JSON log lines so far (the start banner's plain lines are left out). */
  logs: Array<Record<string, unknown>>;
  depotUrl: string;
  metricsUrl: string;
  adminToken: string;
  exited: Promise<number | null>;
}

const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Polls `check` until it returns true (no timing is asserted: the test's own timeout bounds it). */
async function until(check: () => Promise<boolean> | boolean): Promise<void> {
  while (!(await check())) await pause(100);
}

async function startServe(cli: string, args: string[], dataDir: string): Promise<Serve> {
  const { child, logs, exited } = spawnJsonLogged([cli, ...serveArgs(dataDir, args)]);
  await until(() => logs.some((l) => l.msg === "runner-depot serving") || child.exitCode !== null);
  const serving = logs.find((l) => l.msg === "runner-depot serving");
  if (!serving) throw new Error(`serve did not start: ${JSON.stringify(logs)}`);
  const state = JSON.parse(await readFile(path.join(dataDir, "serve.json"), "utf8")) as { adminToken: string };
  return {
    child,
    logs,
    exited,
    depotUrl: String(serving.depotUrl),
    metricsUrl: String(serving.metricsUrl),
    adminToken: state.adminToken,
  };
}

async function readyz(
  base: string,
): Promise<{ status: number; body: { status: string; unreachable: string[]; checks: Record<string, string> } }> {
  const response = await fetch(`${base}/readyz`);
  const body = (await response.json()) as { status: string; unreachable: string[]; checks: Record<string, string> };
  expect(fitsReadiness(body), JSON.stringify(fitsReadiness.errors)).toBe(true);
  expect(Object.keys(openapi.paths["/readyz"]!.get.responses)).toContain(String(response.status));
  return { status: response.status, body };
}

describe("serve: metrics, health and readiness", () => {
  let bundle: Awaited<ReturnType<typeof bundleCli>> | undefined;
  let postgres: TcpProxy;
  let rabbit: TcpProxy;
  let schema: Awaited<ReturnType<typeof createTestSchema>>;
  let dataDir: string;
  let serve: Serve;
  let releaseBroker: (() => Promise<void>) | undefined;

  beforeAll(async () => {
    if (!haveBackends) return;
    // serve talks to the shared broker throughout (its readiness names the queue): never
    // during another file's outage test, which a second worker may be running meanwhile.
    releaseBroker = await acquireBrokerUse();
    bundle = await bundleCli();
    postgres = await startProxyFor(POSTGRES_URL, 5432);
    rabbit = await startProxyFor(RABBITMQ_URL, 5672);
    schema = await createTestSchema();
    dataDir = await mkdtemp(path.join(tmpdir(), "serve-ops-"));
    serve = await startServe(
      bundle.file,
      [
        "--postgres",
        postgres.url(POSTGRES_URL),
        "--postgres-schema",
        schema.schema,
        "--amqp",
        rabbit.url(RABBITMQ_URL),
        "--log-level",
        "debug",
      ],
      dataDir,
    );
    // Up to the outage test's own bound (240 s) of waiting for the broker, then the start.
  }, 420_000);

  afterAll(async () => {
    if (serve?.child.exitCode === null) {
      serve.child.kill("SIGTERM");
      await serve.exited;
    }
    await postgres?.close();
    await rabbit?.close();
    await schema?.drop();
    if (dataDir) await rm(dataDir, { recursive: true, force: true });
    await bundle?.remove();
    await releaseBroker?.();
  });

  it("serves /healthz, and /metrics only with the admin token, in Prometheus text a parser reads", async () => {
    const health = await fetch(`${serve.depotUrl}/healthz`);
    const alive = await health.json();
    expect([health.status, alive]).toEqual([200, { status: "alive" }]);
    expect(fitsHealth(alive)).toBe(true);
    expect((await fetch(serve.metricsUrl)).status).toBe(401);
    expect((await fetch(serve.metricsUrl, { headers: { Authorization: "Bearer not-the-token" } })).status).toBe(401);

    // Traffic of known shape: two catalog reads, one 404, one publish refused for want of a token.
    for (let i = 0; i < 2; i++) expect((await fetch(`${serve.depotUrl}/catalog`)).status).toBe(200);
    expect((await fetch(`${serve.depotUrl}/data/nothing-here`)).status).toBe(404);
    expect((await fetch(`${serve.depotUrl}/trans/tool@1.0.0`, { method: "POST" })).status).toBe(401);
    const id = await openTransaction(serve.depotUrl, "tool@1.0.0", { Authorization: `Bearer ${serve.adminToken}` });
    expect(id).toMatch(/^[0-9a-f-]{36}$/);

    const response = await fetch(serve.metricsUrl, { headers: { Authorization: `Bearer ${serve.adminToken}` } });
    expect(response.status).toBe(200);
    expect(response.headers.get("content-type")).toBe("text/plain; version=0.0.4; charset=utf-8");
    const families = parsePrometheusTextFormat(await response.text());
    const family = (name: string) => families.find((f) => f.name === name);
    const requests = family("depot_requests_total")!;
    expect(requests.type).toBe("COUNTER");
    const counted = requests.metrics
      .map(
        (m) =>
          `${m.labels!.http_request_method} ${m.labels!.http_route} ${m.labels!.http_response_status_code} ${m.value}`,
      )
      .sort();
    expect(counted).toEqual([
      "GET /catalog 200 2",
      "GET /data/:pkg 404 1",
      "POST /trans/:pkg 201 1",
      "POST /trans/:pkg 401 1",
    ]);
    expect(family("depot_transactions_open")?.metrics.map((m) => m.value)).toEqual(["1"]);
    expect(family("depot_request_duration")?.type).toBe("HISTOGRAM");
    expect(family("depot_store_duration")?.type).toBe("HISTOGRAM");
    // The auth refusal is a log line without the token.
    const refused = serve.logs.find((l) => l.msg === "auth refused");
    expect(refused).toMatchObject({
      level: 40,
      code: "UNAUTHENTICATED",
      action: "publish",
      name: "tool",
      component: "depot",
    });
    expect(JSON.stringify(serve.logs)).not.toContain(serve.adminToken);
  });

  it("/readyz is 200, turns 503 naming PostgreSQL's users when it is cut off, and 200 when it is back", async () => {
    expect(await readyz(serve.depotUrl)).toEqual({
      status: 200,
      body: {
        status: "ready",
        unreachable: [],
        checks: { store: "ok", logStore: "ok", descriptors: "ok", queue: "ok" },
      },
    });
    await postgres.break();
    let seen = await readyz(serve.depotUrl);
    await until(async () => (seen = await readyz(serve.depotUrl)).status === 503);
    expect(seen.body.status).toBe("unready");
    expect(seen.body.unreachable).toEqual(["store", "logStore"]);
    expect(seen.body.checks.queue).toBe("ok");
    await postgres.heal();
    await until(async () => (seen = await readyz(serve.depotUrl)).status === 200);
    expect(seen.body).toEqual({
      status: "ready",
      unreachable: [],
      checks: { store: "ok", logStore: "ok", descriptors: "ok", queue: "ok" },
    });
    expect(serve.logs.filter((l) => l.msg === "readiness changed").map((l) => l.status)).toEqual([
      "ready",
      "unready",
      "ready",
    ]);
  });

  it("/readyz turns 503 naming the queue when RabbitMQ is cut off, and 200 when it is back", async () => {
    await rabbit.break();
    let seen = await readyz(serve.depotUrl);
    await until(async () => (seen = await readyz(serve.depotUrl)).status === 503);
    expect(seen.body).toMatchObject({
      status: "unready",
      unreachable: ["queue"],
      checks: { store: "ok", logStore: "ok", descriptors: "ok" },
    });
    expect(seen.body.checks.queue).not.toBe("ok");
    await rabbit.heal();
    await until(async () => (seen = await readyz(serve.depotUrl)).status === 200);
    expect(seen.body.unreachable).toEqual([]);
  });
});

/** A chunked upload the test holds open: `finish()` sends the rest and resolves with the status. */
function heldUpload(
  url: string,
  token: string,
): { request: ClientRequest; started: Promise<void>; finish(): Promise<number>; outcome: Promise<number | string> } {
  const target = new URL(url);
  let resolveStatus!: (status: number | string) => void;
  const outcome = new Promise<number | string>((resolve) => (resolveStatus = resolve));
  const request = httpRequest(
    {
      host: target.hostname,
      port: target.port,
      path: target.pathname,
      method: "POST",
      headers: { Authorization: `Bearer ${token}`, "Pkg-Path": "bin/tool", "Transfer-Encoding": "chunked" },
    },
    (response) => {
      response.resume();
      response.once("end", () => resolveStatus(response.statusCode ?? 0));
    },
  );
  request.once("error", (error: NodeJS.ErrnoException) => resolveStatus(error.code ?? "error"));
  const started = new Promise<void>((resolve) => request.write("first half of the file, ", () => resolve()));
  return {
    request,
    started,
    outcome,
    async finish() {
      request.end("second half\n");
      return (await outcome) as number;
    },
  };
}

/** A grpc-js client of the standard grpc.health.v1 service (another implementation than ours). */
function healthClient(runnerUrl: string): { check(): Promise<string>; close(): void } {
  const definition = protoLoader.loadSync(
    fileURLToPath(new URL("../../../proto/grpc/health/v1/health.proto", import.meta.url)),
    { keepCase: true, defaults: true, enums: String },
  );
  const pkg = grpc.loadPackageDefinition(definition) as unknown as {
    grpc: {
      health: {
        v1: {
          Health: new (
            address: string,
            credentials: grpc.ChannelCredentials,
          ) => grpc.Client & {
            Check(r: { service: string }, cb: (e: grpc.ServiceError | null, r?: { status: string }) => void): void;
          };
        };
      };
    };
  };
  const client = new pkg.grpc.health.v1.Health(new URL(runnerUrl).host, grpc.credentials.createInsecure());
  return {
    check: () =>
      new Promise((resolve, reject) =>
        client.Check({ service: "" }, (error, response) => (error ? reject(error) : resolve(response!.status))),
      ),
    close: () => client.close(),
  };
}

async function activeRequests(metricsUrl: string): Promise<number> {
  const families = parsePrometheusTextFormat(await (await fetch(metricsUrl)).text());
  return Number(families.find((f) => f.name === "depot_requests_active")?.metrics[0]?.value ?? 0);
}

describe("serve: drain on SIGTERM", () => {
  it("turns readiness and gRPC health false first, lets a call in flight finish, cuts the one past the grace time, names it, exits 0", async () => {
    const bundle = await bundleCli();
    const dataDir = await mkdtemp(path.join(tmpdir(), "serve-drain-"));
    try {
      // The checks below must fit in the drain's windows on a loaded machine: three requests
      // to the child within --drain-delay, and the kept upload's end within --drain-grace
      // after it (4 s and 3 s left about a 2x margin at load 20).
      const serve = await startServe(
        bundle.file,
        ["--metrics-port", "0", "--drain-grace", "8", "--drain-delay", "6", "--log-level", "debug"],
        dataDir,
      );
      const operator = serve.metricsUrl.replace(/\/metrics$/, "");
      expect((await readyz(operator)).status).toBe(200);
      const runnerUrl = String(serve.logs.find((l) => l.msg === "runner-depot serving")!.runnerUrl);
      const health = healthClient(runnerUrl);
      expect(await health.check()).toBe("SERVING");
      // Without a token on the separate listener.
      expect((await fetch(serve.metricsUrl)).status).toBe(200);
      const auth = { Authorization: `Bearer ${serve.adminToken}` };
      const kept = heldUpload(
        `${serve.depotUrl}/add/${await openTransaction(serve.depotUrl, "kept@1.0.0", auth)}/file`,
        serve.adminToken,
      );
      const stuckId = await openTransaction(serve.depotUrl, "stuck@1.0.0", auth);
      const stuck = heldUpload(`${serve.depotUrl}/add/${stuckId}/file`, serve.adminToken);
      await Promise.all([kept.started, stuck.started]);
      // A runner's StreamLogs call that never ends: the runner server cuts it and names its job.
      const jobId = randomUUID();
      const secret = (await readFile(path.join(dataDir, "job-secret"), "utf8")).trim();
      const runner = createClient(Runner, createGrpcTransport({ baseUrl: runnerUrl }));
      const runnerStream = controlledStream();
      const runnerCall = send(runner, runnerStream.items, { token: mintJobToken(secret, jobId) });
      runnerStream.push(line(jobId, "still running"));
      await until(() => serve.logs.some((l) => l.msg === "call started" && l.requestId === jobId));
      // Both requests are in the server before the signal: its in-flight gauge says so.
      await until(async () => (await activeRequests(serve.metricsUrl)) === 2);

      serve.child.kill("SIGTERM");
      // Readiness first: the operator listener answers 503 "draining" while both calls are still in flight.
      let seen = await readyz(operator);
      await until(async () => (seen = await readyz(operator)).status === 503);
      expect(seen.body.status).toBe("draining");
      expect((await fetch(`${operator}/healthz`)).status).toBe(200);
      // The runner's gRPC health says NOT_SERVING while it still accepts (--drain-delay).
      expect(await health.check()).toBe("NOT_SERVING");
      health.close();
      // After the delay, new connections to the depot are refused.
      await until(() =>
        fetch(`${serve.depotUrl}/catalog`).then(
          () => false,
          () => true,
        ),
      );
      // The first call finishes within the grace time; the second is left hanging.
      expect(await kept.finish()).toBe(201);
      expect(await serve.exited).toBe(0);
      expect(await stuck.outcome).not.toBe(201);
      // The runner call was cut UNAVAILABLE with where its job stands, for the runner to resume.
      expect(await runnerCall).toMatchObject({ code: "Unavailable", committed: "1" });
      runnerStream.close();

      const messages = serve.logs.map((l) => String(l.msg));
      const drainAt = messages.findIndex((m) => m.startsWith("draining"));
      const cutAt = messages.findIndex((m) => m === "depot drained: 1 call(s) cut at the grace time");
      expect(drainAt).toBeGreaterThanOrEqual(0);
      expect(cutAt).toBeGreaterThan(drainAt);
      const drained = serve.logs[cutAt]!;
      expect(drained).toMatchObject({ server: "depot", finished: 1, level: 40 });
      expect(drained.cut).toEqual([expect.objectContaining({ method: "POST", path: `/add/${stuckId}/file` })]);
      const runnerDrained = serve.logs.find((l) => l.msg === "runner drained: 1 call(s) cut at the grace time");
      expect(runnerDrained).toMatchObject({ server: "runner", inFlight: 1, cut: 1, cutRequestIds: [jobId], level: 40 });
      expect(messages.indexOf(String(runnerDrained!.msg))).toBeGreaterThan(drainAt);
      expect(JSON.stringify(serve.logs)).not.toContain(secret);
    } finally {
      await rm(dataDir, { recursive: true, force: true });
      await bundle.remove();
    }
  }, 120_000);
});

describe("serve: scheduled garbage collection", () => {
  it("--gc-interval reclaims the blob of an abandoned transaction, logs it, and /metrics counts the bytes", async () => {
    const bundle = await bundleCli();
    const dataDir = await mkdtemp(path.join(tmpdir(), "serve-gc-"));
    try {
      const serve = await startServe(bundle.file, ["--gc-interval", "1", "--gc-grace", "1"], dataDir);
      const auth = { Authorization: `Bearer ${serve.adminToken}` };
      const body = "a file only an abandoned transaction ever named\n";
      const id = await openTransaction(serve.depotUrl, "gone@1.0.0", auth);
      expect((await add(serve.depotUrl, id, { type: "file", path: "bin/gone", body }, auth)).status).toBe(201);
      expect((await fetch(`${serve.depotUrl}/trans/${id}`, { method: "DELETE", headers: auth })).status).toBe(204);
      // Seen unreferenced by one run, deleted by a later one at least the grace apart.
      const collected = () => serve.logs.filter((l) => l.msg === "garbage collected");
      await until(() => collected().some((l) => Number(l.deletedBlobs) > 0));
      const reclaimed = collected().reduce((sum, l) => sum + Number(l.reclaimedBytes), 0);
      expect(reclaimed).toBe(Buffer.byteLength(body));
      expect(collected().find((l) => Number(l.deletedBlobs) > 0)).toMatchObject({
        level: 30,
        component: "depot",
        deletedBlobs: 1,
        reclaimedBytes: Buffer.byteLength(body),
      });
      expect(serve.logs.some((l) => l.msg === "garbage collection failed")).toBe(false);

      const families = parsePrometheusTextFormat(await (await fetch(serve.metricsUrl, { headers: auth })).text());
      const value = (name: string) => families.find((f) => f.name === name)?.metrics.map((m) => m.value);
      // This exporter adds no unit suffix for By: depot.gc.reclaimed is depot_gc_reclaimed_total.
      expect(value("depot_gc_reclaimed_total")).toEqual([String(Buffer.byteLength(body))]);
      expect(value("depot_gc_deleted_blobs_total")).toEqual(["1"]);
      serve.child.kill("SIGTERM");
      expect(await serve.exited).toBe(0);
    } finally {
      await rm(dataDir, { recursive: true, force: true });
      await bundle.remove();
    }
  }, 120_000);
});

describe("serve: the metrics listener beyond loopback", () => {
  /** Runs the CLI to its exit: its code and stderr. */
  function run(cli: string, args: string[]): Promise<{ code: number | null; stderr: string }> {
    const child = spawn(process.execPath, [cli, ...args], { stdio: ["ignore", "ignore", "pipe"] });
    let stderr = "";
    child.stderr!.setEncoding("utf8").on("data", (chunk: string) => (stderr += chunk));
    return new Promise((resolve) => child.once("exit", (code) => resolve({ code, stderr })));
  }

  it("refuses a non-loopback --metrics-host without --metrics-public, on one line, exit 2; with it, goes on to bind", async () => {
    const bundle = await bundleCli();
    const dataDir = await mkdtemp(path.join(tmpdir(), "serve-metrics-public-"));
    // A port already taken on loopback: binding the wildcard address to it fails, so the
    // opt-in path is shown without ever listening beyond loopback.
    const taken = createTcpServer();
    await new Promise<void>((resolve) => taken.listen(0, "127.0.0.1", resolve));
    const port = String((taken.address() as AddressInfo).port);
    try {
      const base = ["serve", "--data", dataDir, "--runner-port", "0", "--depot-port", "0", "--log-format", "json"];
      for (const host of ["0.0.0.0", "::", "192.0.2.10"]) {
        const refused = await run(bundle.file, [...base, "--metrics-port", "0", "--metrics-host", host]);
        expect(refused.code, host).toBe(2);
        expect(refused.stderr.trim().split("\n"), host).toHaveLength(1);
        expect(refused.stderr).toContain(`--metrics-host ${host} is not a loopback address`);
        expect(refused.stderr).toContain("pass --metrics-public");
      }
      const lonely = await run(bundle.file, [...base, "--metrics-public"]);
      expect([lonely.code, lonely.stderr.trim()]).toEqual([
        2,
        "runner-depot: --metrics-public goes with --metrics-port",
      ]);
      const allowed = await run(bundle.file, [
        ...base,
        "--metrics-port",
        port,
        "--metrics-host",
        "0.0.0.0",
        "--metrics-public",
      ]);
      expect(allowed.code).toBe(1);
      expect(allowed.stderr).toContain(`port ${port} is in use; pass --metrics-port <port>`);
      expect(allowed.stderr).not.toContain("--metrics-public");
    } finally {
      await new Promise<void>((resolve) => taken.close(() => resolve()));
      await rm(dataDir, { recursive: true, force: true });
      await bundle.remove();
    }
  }, 120_000);
});
