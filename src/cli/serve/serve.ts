/**
 * `runner-depot serve`: the orchestrator side on embedded defaults — the gRPC runner
 * service (fs log store, results printed as JSON lines) and the depot (fs store) —
 * plus a small control API on the depot's port for `job` and `logs`.
 */
import { randomBytes } from "node:crypto";
import { mkdir, readFile, rm, writeFile } from "node:fs/promises";
import path from "node:path";
import { createFsLogStore, createFsStore } from "../../adapters/fs/index.js";
import {
  createPackageRouter,
  bearerTokens,
  servePackageRouter,
  composeStore,
  runRetention,
} from "../../depot/index.js";
import type { PackageStore } from "../../depot/ports.js";
import { orchestratorSigningKey, readTrustedKeys } from "../depot/signing.js";
import { isJobPrincipal, jobCredentials, jobProvenance } from "../runner/job-publishing.js";
import { jobPublications } from "../../depot/store/attestations.js";
import { createRunnerService, startRunnerServer } from "../../runner/index.js";
import type { JobLogStore, JobResult, JobResultQueue } from "../../runner/ports.js";
import { isLoopbackHost } from "../../loopback.js";
import { checkDescriptors } from "../../depot/server/descriptors.js";
import { CliError, DEFAULT_DATA_DIR, importAdapter, portOption, type Command, type ServeState } from "../args.js";
import { commandName } from "../args.js";
import { createControlApi } from "./control.js";
import { lockDataDir } from "./serve-lock.js";
import { createConsole, createConsoleSessions } from "../../console/index.js";
import type { Logger } from "../../telemetry.js";
import { openPackageStore, postgresSchema } from "../depot/package-store-options.js";
import { createServeLogger, gatedLogger, logPackageWarnings } from "./serve-log.js";
import { createOperatorEndpoints, serveOperatorEndpoints, type OperatorEndpoints, type Probe } from "./serve-health.js";
import { startServeTelemetry } from "./serve-telemetry.js";
import { scheduleGarbageCollection } from "./serve-gc.js";
import { publishServeAgents } from "./serve-agent.js";
import type { CloudInitAgent } from "../../runner/index.js";

const usage = `Usage: runner-depot serve [options]

Runs the runner service (gRPC, HTTP/2) and the package depot (HTTP) on embedded
defaults: logs and packages under --data, job results printed on stdout as JSON lines.
Prints both URLs and the admin token (publishing, job creation, logs) on stderr and
writes them to <data>/serve.json for the other commands.

Options:
  --data <dir>            data directory (default ./${DEFAULT_DATA_DIR})
  --host <host>           interface for both servers (default 127.0.0.1)
  --runner-port <port>    gRPC port (default 50051; 0 picks one)
  --depot-port <port>     HTTP port (default 8080; 0 picks one)
  --public-runner-url <u> runner URL as the VMs reach it (default: the listening URL)
  --public-depot-url <u>  depot URL as the VMs reach it, for the agent they fetch
                          (default: the listening URL)
  --agent-dir <dir>       the single-file agents to publish into the depot (default:
                          build/agent of this package, from 'npm run build:agent')
  --no-agent              do not publish the agent: VMs run an installed runner-depot
  --tls-cert <file>       PEM certificate for the runner server (with --tls-key)
  --tls-key <file>        PEM private key for the runner server
  --tls-client-ca <file>  require client certificates signed by this CA (mutual TLS)
  --insecure              allow a non-loopback --host (the depot port is plain HTTP)
  --amqp <url>            publish job results to RabbitMQ instead of stdout
  --postgres <url>        keep job logs and depot records in PostgreSQL
  --s3-bucket <name>      keep depot blobs in S3 (with --s3-endpoint, --s3-region)
  --s3-endpoint <url>     S3 endpoint (path-style), e.g. http://127.0.0.1:4568
  --s3-region <region>    S3 region (default us-east-1)
  --s3-no-payload-check   the S3 server does not check a request's signed payload hash
                          (s3rver does not; AWS S3, MinIO and radosgw do): a body with a
                          declared digest then goes by multipart upload, checked here
  --postgres-schema <s>   PostgreSQL schema for both (default runner_depot)
  --lost-after <seconds>  close jobs silent for this long as lost (default 600)
  --job-quota-bytes <n>   what one job may publish with its own credentials, in archive
                          bytes; past it a commit answers 413 QUOTA_EXCEEDED (default: none)
  --job-quota-versions <n>  likewise in versions (default: none)

Operations:
  --log-level <level>     trace, debug, info (default), warn, error, fatal or silent
  --log-format <format>   json (JSON lines on stderr) or pretty; default pretty on a
                          terminal, json otherwise
  --metrics-port <port>   serve GET /metrics, /healthz and /readyz on their own port,
                          without a token (default: on the depot port, /metrics with
                          the admin token)
  --metrics-host <host>   interface of --metrics-port (default 127.0.0.1); an address
                          beyond loopback needs --metrics-public
  --metrics-public        allow a non-loopback --metrics-host: that listener has no
                          token, so whoever reaches it reads the metrics
  --gc-interval <seconds> run the depot's garbage collection this often (default 3600;
                          0 turns it off); runs never overlap, each logs what it reclaimed
  --gc-grace <seconds>    a blob is deleted once unreferenced in two runs at least this
                          far apart (default 3600); keep it longer than an upload takes
  --builder-id <uri>      the builder ID the provenance of job-published versions names
                          (default urn:runner-depot:orchestrator:<key ID>); the key is
                          <data>/orchestrator.key, its trusted-keys entry
                          <data>/orchestrator-key.json
  --trusted-keys <file>   the keys whose signatures the depot takes on a version
                          (POST /attestations; 'runner-depot keys generate' prints entries)
  --drain-grace <seconds> on SIGTERM/SIGINT, time calls in flight get to finish
                          (default 20); readiness turns false first
  --drain-delay <seconds> keep accepting this long after readiness turned false (and
                          the runner's gRPC health NOT_SERVING), so load balancers
                          see it first (default 0)
Traces go to OTLP/HTTP when OTEL_EXPORTER_OTLP_ENDPOINT (or ..._TRACES_ENDPOINT) is set.`;

export const serveCommand: Command = {
  usage,
  options: {
    data: { type: "string" },
    host: { type: "string" },
    "runner-port": { type: "string" },
    "depot-port": { type: "string" },
    "public-runner-url": { type: "string" },
    "public-depot-url": { type: "string" },
    "agent-dir": { type: "string" },
    "no-agent": { type: "boolean" },
    "tls-cert": { type: "string" },
    "tls-key": { type: "string" },
    "tls-client-ca": { type: "string" },
    insecure: { type: "boolean" },
    amqp: { type: "string" },
    postgres: { type: "string" },
    "s3-bucket": { type: "string" },
    "s3-endpoint": { type: "string" },
    "s3-region": { type: "string" },
    "s3-no-payload-check": { type: "boolean" },
    "lost-after": { type: "string" },
    "job-quota-bytes": { type: "string" },
    "job-quota-versions": { type: "string" },
    "postgres-schema": { type: "string" },
    "log-level": { type: "string" },
    "log-format": { type: "string" },
    "metrics-port": { type: "string" },
    "metrics-host": { type: "string" },
    "metrics-public": { type: "boolean" },
    "gc-interval": { type: "string" },
    "gc-grace": { type: "string" },
    "drain-grace": { type: "string" },
    "drain-delay": { type: "string" },
    "trusted-keys": { type: "string" },
    "builder-id": { type: "string" },
  },
  async run(values) {
    const dataDir = path.resolve(typeof values.data === "string" ? values.data : DEFAULT_DATA_DIR);
    const host = typeof values.host === "string" ? values.host : "127.0.0.1";
    const runnerPort = portOption(values["runner-port"], "runner-port", 50051);
    const depotPort = portOption(values["depot-port"], "depot-port", 8080);
    const trustedKeysFile = values["trusted-keys"] as string | undefined;
    const trustedKeys = trustedKeysFile !== undefined ? await readTrustedKeys(trustedKeysFile) : undefined;
    const lostAfter = values["lost-after"] === undefined ? 600 : Number(values["lost-after"]);
    if (!(lostAfter > 0)) throw new CliError("--lost-after must be a positive number of seconds", 2);
    const drainGrace = values["drain-grace"] === undefined ? 20 : Number(values["drain-grace"]);
    if (!(drainGrace >= 0) || !Number.isFinite(drainGrace))
      throw new CliError("--drain-grace must be a number of seconds (0 or more)", 2);
    const drainDelay = values["drain-delay"] === undefined ? 0 : Number(values["drain-delay"]);
    if (!(drainDelay >= 0) || !Number.isFinite(drainDelay))
      throw new CliError("--drain-delay must be a number of seconds (0 or more)", 2);
    const metricsPort =
      values["metrics-port"] === undefined ? undefined : portOption(values["metrics-port"], "metrics-port", 9464);
    const metricsHost = typeof values["metrics-host"] === "string" ? values["metrics-host"] : "127.0.0.1";
    if (values["metrics-host"] !== undefined && metricsPort === undefined)
      throw new CliError("--metrics-host goes with --metrics-port", 2);
    checkMetricsHost(metricsHost, metricsPort, values["metrics-public"] === true);
    const jobQuota = {
      bytes: countOption(values["job-quota-bytes"], "job-quota-bytes"),
      versions: countOption(values["job-quota-versions"], "job-quota-versions"),
    };
    const gcInterval = secondsOption(values["gc-interval"], "gc-interval", 3600);
    const gcGrace = secondsOption(values["gc-grace"], "gc-grace", 3600);
    const gate = { quiet: false };
    const logger = gatedLogger(
      createServeLogger({
        level: typeof values["log-level"] === "string" ? values["log-level"] : undefined,
        format: typeof values["log-format"] === "string" ? values["log-format"] : undefined,
      }),
      gate,
    );
    let serving = false;
    if (!!values["tls-cert"] !== !!values["tls-key"]) throw new CliError("--tls-cert and --tls-key go together", 2);
    if (values["tls-client-ca"] && !values["tls-cert"])
      throw new CliError("--tls-client-ca needs --tls-cert and --tls-key (mutual TLS is on top of TLS)", 2);
    // Beyond loopback, tokens travel on the wire: refuse plaintext unless asked for.
    // The depot port is plain HTTP (and the runner's too without --tls-cert).
    if (!isLoopbackHost(host) && values.insecure !== true) {
      throw new CliError(
        `listening on ${host}: the depot port is plain HTTP, so tokens would cross the network in clear text; put a TLS terminator in front (and --tls-cert/--tls-key on the runner), then pass --insecure`,
        2,
      );
    }
    await mkdir(dataDir, { recursive: true });
    // One server per data folder: a second one would overwrite serve.json and hide the first.
    const unlock = await lockDataDir(dataDir);

    // Closed newest first on any exit, including a failed start (e.g. a port in use).
    const closers: Array<() => Promise<unknown>> = [];
    // Before any backend or server exists, so each finds the global providers.
    const telemetry = startServeTelemetry();
    closers.push(() => telemetry.shutdown());
    // The stores' warnings (a data folder whose directories cannot be fsynced) in the log.
    const stopWarnings = logPackageWarnings(logger);
    closers.push(async () => stopWarnings());
    const closeAll = async () => {
      for (const close of closers.reverse()) await close().catch(() => undefined);
    };
    try {
      // Both secrets persist, so tokens handed to VMs survive a restart of the server.
      const secret = await persistentSecret(path.join(dataDir, "job-secret"));
      const adminToken = await persistentSecret(path.join(dataDir, "admin-token"));
      const queue = await openQueue(values, logger.child({ component: "queue" }));
      closers.push(async () => queue.close?.());
      const logs = await openLogStore(values, dataDir);
      closers.push(async () => logs.close?.());
      const store = await openPackageStore(values, dataDir);
      closers.push(async () => store.close?.());
      const orchestratorKey = await orchestratorSigningKey(dataDir);
      const builderId =
        typeof values["builder-id"] === "string"
          ? values["builder-id"]
          : `urn:runner-depot:orchestrator:${orchestratorKey.keyId}`;

      const runner = createRunnerService(queue, {
        logs,
        secret,
        lostAfterMs: lostAfter * 1000,
        logger: logger.child({ component: "runner" }),
      });
      closers.push(() => runner.close());
      const tls = values["tls-cert"]
        ? {
            cert: await readFile(String(values["tls-cert"])),
            key: await readFile(String(values["tls-key"])),
            ca: values["tls-client-ca"] ? await readFile(String(values["tls-client-ca"])) : undefined,
          }
        : undefined;
      const runnerServer = await listening("runner-port", runnerPort, () =>
        startRunnerServer(runner, {
          host,
          port: runnerPort,
          tls,
          insecure: values.insecure === true,
          gracefulShutdownMs: drainGrace * 1000,
          logger: logger.child({ component: "runner" }),
        }),
      );
      closers.push(() => runnerServer.close());
      const runnerUrl =
        typeof values["public-runner-url"] === "string" ? values["public-runner-url"] : runnerServer.url;

      // Reading the depot is open; publishing needs the admin token.
      // A running job may publish what it was allowed with its own credentials (job-publishing.ts).
      const depot = createPackageRouter(store, {
        authorize: jobCredentials({
          logs,
          secret,
          fallback: bearerTokens({ [adminToken]: ["*"] }, { publicRead: true }),
        }),
        provenance: {
          key: orchestratorKey,
          builderId,
          jobOf: jobProvenance(logs, (id) => `/-/console/jobs/${encodeURIComponent(id)}`),
        },
        // A job's own credentials publish within the job's quota (docs/depot-api.md, Quotas); others have none.
        ...(jobQuota.bytes !== undefined || jobQuota.versions !== undefined
          ? { quota: (principal: string) => (isJobPrincipal(principal) ? jobQuota : undefined) }
          : {}),
        logger: logger.child({ component: "depot" }),
        gcGraceMs: gcGrace * 1000,
        ...(trustedKeys ? { trustedKeys } : {}),
      });
      // The router logs each run ('garbage collected' with what it reclaimed, or the failure);
      // closed before the store, and a run in progress is waited for.
      if (gcInterval > 0) {
        const gc = scheduleGarbageCollection(() => depot.collectGarbage(), gcInterval * 1000);
        closers.push(() => gc.stop());
      }
      const operator = createOperatorEndpoints({
        probes: readinessProbes(store, logs, queue),
        metricsText: () => telemetry.metricsText(),
        metricsToken: metricsPort === undefined ? adminToken : null,
        logger,
      });
      // The web console on the depot's port: one-time login URLs (at startup, and from
      // `runner-depot console-url` through the control API), then a session cookie.
      let depotUrl = "";
      let agents: ReadonlyMap<string, CloudInitAgent> = new Map();
      const sessions = createConsoleSessions();
      const consoleLoginUrl = () => `${depotServer.url}/-/console/?token=${sessions.loginToken()}`;
      const control = createControlApi({
        runner,
        logs,
        secret,
        adminToken,
        runnerUrl,
        consoleLoginUrl,
        depotUrl: () => depotUrl,
        agents: () => agents,
        retention: (policy, dryRun) => runRetention(store, policy, { dryRun }),
      });
      // Beyond loopback a TLS terminator must stand in front (--insecure says so): the cookie is Secure.
      const webConsole = createConsole({
        runner,
        depot,
        sessions,
        base: "/-/console",
        jobPublications: (requestId) => jobPublications(store, requestId),
        ...(isLoopbackHost(host) ? {} : { secureCookies: true }),
      });
      const route = (request: Request) => {
        const pathname = new URL(request.url).pathname;
        const answer = operator.answer(request, pathname, { metrics: metricsPort === undefined });
        if (answer) return answer;
        if (pathname === "/-/console" || pathname.startsWith("/-/console/")) return webConsole.fetch(request);
        return pathname.startsWith("/-/") ? control(request) : depot.fetch(request);
      };
      const depotServer = await listening("depot-port", depotPort, () =>
        servePackageRouter(
          { isOpen: false, fetch: route },
          { host, port: depotPort, insecure: values.insecure === true, logger: logger.child({ component: "depot" }) },
        ),
      );
      closers.push(() => depotServer.close());
      // What a VM is given (a job that publishes, the agent it fetches): the public URL when set.
      depotUrl = typeof values["public-depot-url"] === "string" ? values["public-depot-url"] : depotServer.url;
      // The operator listener closes last, so probes see the drain.
      const operatorServer =
        metricsPort === undefined
          ? undefined
          : await listening("metrics-port", metricsPort, () =>
              serveOperatorEndpoints(operator, metricsHost, metricsPort),
            );
      if (operatorServer) closers.unshift(() => operatorServer.close());
      // Before serve.json announces this server: the first job created already fetches the agent.
      if (values["no-agent"] !== true) {
        agents = await publishServeAgents({
          depotUrl: depotServer.url,
          vmDepotUrl: depotUrl,
          adminToken,
          dir: typeof values["agent-dir"] === "string" ? values["agent-dir"] : undefined,
          logger,
        });
      }

      // The signals are ours before serve.json announces this server: a SIGTERM sent the
      // moment the file appears must drain and release the lock, not kill (the default).
      const stopSignal = new Promise<string>((resolve) => {
        process.once("SIGINT", () => resolve("SIGINT"));
        process.once("SIGTERM", () => resolve("SIGTERM"));
      });
      const state: ServeState = { runnerUrl, depotUrl: depotServer.url, adminToken, pid: process.pid };
      await writeFile(path.join(dataDir, "serve.json"), `${JSON.stringify(state, null, 2)}\n`, { mode: 0o600 });
      closers.push(() => rm(path.join(dataDir, "serve.json"), { force: true }));
      process.stderr.write(
        `runner-depot serving\n  runner (gRPC):  ${runnerServer.url}\n  depot (HTTP):   ${depotServer.url}\n` +
          `  admin token:    ${adminToken}\n  data:           ${dataDir}\n` +
          `  console:        ${consoleLoginUrl()}  (works once; '${commandName()} console-url' mints another)\n` +
          `Next: '${commandName()} job --run -- <command>' runs a job here as a VM would ('job -- <command>' prints its cloud-init); Ctrl-C stops.\n`,
      );

      logger.info(
        {
          runnerUrl,
          depotUrl: depotServer.url,
          metricsUrl: operatorServer ? `${operatorServer.url}/metrics` : `${depotServer.url}/metrics`,
          traces: telemetry.tracesTo ?? "off",
          gcIntervalSeconds: gcInterval,
          data: dataDir,
        },
        "runner-depot serving",
      );

      serving = true;
      const signal = await stopSignal;
      // Readiness false and gRPC health NOT_SERVING at once; both servers keep accepting
      // for --drain-delay, then stop and give calls in flight --drain-grace.
      const [delayMs, graceMs] = [drainDelay * 1000, drainGrace * 1000];
      await drain(logger, operator, signal, graceMs, [
        ["depot", () => pause(delayMs).then(() => depotServer.drain({ graceMs }))],
        ["runner", () => runnerServer.drain({ notServingMs: delayMs, graceMs })],
      ]);
    } finally {
      // A failed start is reported by the CLI's one line; closing says nothing more.
      if (!serving) gate.quiet = true;
      await closeAll();
      await unlock();
    }
    return 0;
  },
};

/**
 * The drain: readiness turns false first, then each server stops taking work and gives
 * its calls in flight the grace time; the log names what was cut.
 */
async function drain(
  logger: Logger,
  operator: OperatorEndpoints,
  signal: string,
  graceMs: number,
  servers: Array<[string, () => Promise<unknown>]>,
): Promise<void> {
  operator.drain();
  logger.info({ signal, graceMs }, "draining: readiness is false, servers stop accepting");
  const started = performance.now();
  await Promise.all(
    servers.map(async ([name, close]) => {
      const report = await close();
      // The depot names its cut requests (method, path, age); the runner its cut calls' request IDs (cutRequestIds).
      const cut = (report as { cut?: unknown } | undefined)?.cut;
      const count = Array.isArray(cut) ? cut.length : typeof cut === "number" ? cut : 0;
      const fields = {
        server: name,
        ms: Math.round(performance.now() - started),
        ...(report && typeof report === "object" ? report : {}),
      };
      if (count > 0) logger.warn(fields, `${name} drained: ${count} call(s) cut at the grace time`);
      else logger.info(fields, `${name} drained`);
    }),
  );
}

/** What `/readyz` checks: one cheap read per backend (a record and a blob stat, a job lookup, the broker channel). */
function readinessProbes(store: PackageStore, logs: JobLogStore, queue: JobResultQueue): Probe[] {
  const probes: Probe[] = [
    {
      name: "store",
      check: () => Promise.all([store.getRecord("format"), store.statBlob(`sha256:${"0".repeat(64)}`)]),
    },
    { name: "logStore", check: () => logs.get("00000000-0000-4000-8000-000000000000") },
    // Unready past nine tenths of the descriptor limit: new connections and store files would fail next.
    { name: "descriptors", check: () => checkDescriptors() },
  ];
  const ready = (queue as { ready?: (timeoutMs?: number) => Promise<void> }).ready;
  if (typeof ready === "function") probes.push({ name: "queue", check: () => ready.call(queue, 1_500) });
  return probes;
}

const pause = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** A number of seconds, 0 or more; `fallback` when the flag is absent. */
/** A whole number of at least 1 from a flag, or undefined when absent; usage error otherwise. */
function countOption(value: unknown, flag: string): number | undefined {
  if (value === undefined) return undefined;
  const n = Number(value);
  if (!Number.isSafeInteger(n) || n < 1) throw new CliError(`--${flag} must be a whole number of at least 1`, 2);
  return n;
}

function secondsOption(value: unknown, flag: string, fallback: number): number {
  const seconds = value === undefined ? fallback : Number(value);
  if (!(seconds >= 0) || !Number.isFinite(seconds))
    throw new CliError(`--${flag} must be a number of seconds (0 or more)`, 2);
  return seconds;
}

/**
 * The operator listener answers /metrics without a token (metrics name packages, routes and
 * traffic): beyond loopback only when the operator says so.
 */
function checkMetricsHost(host: string, port: number | undefined, allowPublic: boolean): void {
  if (allowPublic && port === undefined) throw new CliError("--metrics-public goes with --metrics-port", 2);
  if (port === undefined || allowPublic || isLoopbackHost(host)) return;
  throw new CliError(
    `--metrics-host ${host} is not a loopback address: the metrics listener has no token, so anyone who reaches it reads /metrics (package names, routes, traffic); bind it to an internal interface behind a firewall, then pass --metrics-public`,
    2,
  );
}

/** Starts a server, turning "address in use" into an error that says what to do. */
async function listening<T>(flag: string, port: number, start: () => Promise<T>): Promise<T> {
  try {
    return await start();
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "EADDRINUSE") {
      throw new CliError(`port ${port} is in use; pass --${flag} <port> (0 picks a free one)`);
    }
    throw error;
  }
}

/** Reads a secret from `file`, creating it (mode 0600) on first use. */
async function persistentSecret(file: string): Promise<string> {
  try {
    const existing = (await readFile(file, "utf8")).trim();
    if (existing) return existing;
  } catch {
    // First start: create it below.
  }
  const fresh = randomBytes(32).toString("base64url");
  await writeFile(file, `${fresh}\n`, { mode: 0o600 });
  return fresh;
}

/** The results queue: RabbitMQ with --amqp, else JSON lines on stdout. */
async function openQueue(values: Record<string, unknown>, logger: Logger): Promise<JobResultQueue> {
  if (typeof values.amqp === "string") {
    const { createRabbitMqQueue } = await importAdapter(() => import("../../adapters/rabbitmq/index.js"), "amqplib");
    return createRabbitMqQueue({ url: values.amqp, logger });
  }
  return {
    async publishJobResult(result: JobResult) {
      process.stdout.write(`${JSON.stringify(result)}\n`);
    },
  };
}

async function openLogStore(values: Record<string, unknown>, dataDir: string): Promise<JobLogStore> {
  if (typeof values.postgres === "string") {
    const { createPostgresLogStore } = await importAdapter(() => import("../../adapters/postgres/index.js"), "pg");
    return createPostgresLogStore({ connectionString: values.postgres, schema: postgresSchema(values) });
  }
  return createFsLogStore(path.join(dataDir, "logs"));
}
