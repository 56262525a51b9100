/**
 * `runner-depot serve`: the orchestrator side on embedded defaults — the gRPC runner
 * service (fs log store, results printed as JSON lines) and the depot (fs store) —
 * plus a small control API on the depot's port for `job` and `logs`.
 */
import { randomBytes } from "node:crypto";
import { mkdir, readFile, rm, writeFile } from "node:fs/promises";
import path from "node:path";
import { createFsLogStore, createFsStore } from "../adapters/fs/index.js";
import { createPackageRouter, bearerTokens, servePackageRouter, composeStore } from "../depot/index.js";
import type { PackageStore } from "../depot/ports.js";
import { createRunnerService, startRunnerServer } from "../runner/index.js";
import type { JobLogStore, JobResult, JobResultQueue } from "../runner/ports.js";
import { isLoopbackHost } from "../net.js";
import { CliError, DEFAULT_DATA_DIR, importAdapter, portOption, type Command, type ServeState } from "./args.js";
import { createControlApi } from "./control.js";

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
  --tls-cert <file>       PEM certificate for the runner server (with --tls-key)
  --tls-key <file>        PEM private key for the runner server
  --tls-client-ca <file>  require client certificates signed by this CA (mutual TLS)
  --insecure              allow a non-loopback --host (the depot port is plain HTTP)
  --amqp <url>            publish job results to RabbitMQ instead of stdout
  --postgres <url>        keep job logs and depot records in PostgreSQL
  --s3-bucket <name>      keep depot blobs in S3 (with --s3-endpoint, --s3-region)
  --s3-endpoint <url>     S3 endpoint (path-style), e.g. http://127.0.0.1:4568
  --s3-region <region>    S3 region (default us-east-1)
  --lost-after <seconds>  close jobs silent for this long as lost (default 600)`;

export const serveCommand: Command = {
  usage,
  options: {
    data: { type: "string" },
    host: { type: "string" },
    "runner-port": { type: "string" },
    "depot-port": { type: "string" },
    "public-runner-url": { type: "string" },
    "tls-cert": { type: "string" },
    "tls-key": { type: "string" },
    "tls-client-ca": { type: "string" },
    insecure: { type: "boolean" },
    amqp: { type: "string" },
    postgres: { type: "string" },
    "s3-bucket": { type: "string" },
    "s3-endpoint": { type: "string" },
    "s3-region": { type: "string" },
    "lost-after": { type: "string" },
  },
  async run(values) {
    const dataDir = path.resolve(typeof values.data === "string" ? values.data : DEFAULT_DATA_DIR);
    const host = typeof values.host === "string" ? values.host : "127.0.0.1";
    const runnerPort = portOption(values["runner-port"], "runner-port", 50051);
    const depotPort = portOption(values["depot-port"], "depot-port", 8080);
    const lostAfter = values["lost-after"] === undefined ? 600 : Number(values["lost-after"]);
    if (!(lostAfter > 0)) throw new CliError("--lost-after must be a positive number of seconds", 2);
    if (!!values["tls-cert"] !== !!values["tls-key"]) throw new CliError("--tls-cert and --tls-key go together", 2);
    if (values["tls-client-ca"] && !values["tls-cert"]) throw new CliError("--tls-client-ca needs --tls-cert and --tls-key (mutual TLS is on top of TLS)", 2);
    // Beyond loopback, tokens travel on the wire: refuse plaintext unless asked for.
    // The depot port is plain HTTP (and the runner's too without --tls-cert).
    if (!isLoopbackHost(host) && values.insecure !== true) {
      throw new CliError(
        `listening on ${host}: the depot port is plain HTTP, so tokens would cross the network in clear text; put a TLS terminator in front (and --tls-cert/--tls-key on the runner), then pass --insecure`,
        2,
      );
    }
    await mkdir(dataDir, { recursive: true });

    // Both secrets persist, so tokens handed to VMs survive a restart of the server.
    const secret = await persistentSecret(path.join(dataDir, "job-secret"));
    const adminToken = await persistentSecret(path.join(dataDir, "admin-token"));

    // Closed newest first on any exit, including a failed start (e.g. a port in use).
    const closers: Array<() => Promise<unknown>> = [];
    const closeAll = async () => {
      for (const close of closers.reverse()) await close().catch(() => undefined);
    };
    try {
      const queue = await openQueue(values);
      closers.push(async () => queue.close?.());
      const logs = await openLogStore(values, dataDir);
      closers.push(async () => logs.close?.());
      const store = await openPackageStore(values, dataDir);
      closers.push(async () => store.close?.());

      const runner = createRunnerService(queue, { logs, secret, lostAfterMs: lostAfter * 1000 });
      closers.push(() => runner.close());
      const tls = values["tls-cert"]
        ? {
            cert: await readFile(String(values["tls-cert"])),
            key: await readFile(String(values["tls-key"])),
            ca: values["tls-client-ca"] ? await readFile(String(values["tls-client-ca"])) : undefined,
          }
        : undefined;
      const runnerServer = await listening("runner-port", runnerPort, () =>
        startRunnerServer(runner, { host, port: runnerPort, tls, insecure: values.insecure === true }),
      );
      closers.push(() => runnerServer.close());
      const runnerUrl = typeof values["public-runner-url"] === "string" ? values["public-runner-url"] : runnerServer.url;

      // Reading the depot is open; publishing needs the admin token.
      const depot = createPackageRouter(store, { authorize: bearerTokens({ [adminToken]: ["*"] }, { publicRead: true }) });
      const control = createControlApi({ runner, logs, secret, adminToken, runnerUrl });
      const depotServer = await listening("depot-port", depotPort, () =>
        servePackageRouter(
          { isOpen: false, fetch: (request: Request) => (new URL(request.url).pathname.startsWith("/-/") ? control(request) : depot.fetch(request)) },
          { host, port: depotPort, insecure: values.insecure === true },
        ),
      );
      closers.push(() => depotServer.close());

      const state: ServeState = { runnerUrl, depotUrl: depotServer.url, adminToken, pid: process.pid };
      await writeFile(path.join(dataDir, "serve.json"), `${JSON.stringify(state, null, 2)}\n`, { mode: 0o600 });
      closers.push(() => rm(path.join(dataDir, "serve.json"), { force: true }));
      process.stderr.write(
        `runner-depot serving\n  runner (gRPC):  ${runnerServer.url}\n  depot (HTTP):   ${depotServer.url}\n` +
          `  admin token:    ${adminToken}\n  data:           ${dataDir}\n` +
          `Next: 'runner-depot job -- <command>' prints a VM's cloud-init; Ctrl-C stops.\n`,
      );

      await new Promise<void>((resolve) => {
        process.once("SIGINT", resolve);
        process.once("SIGTERM", resolve);
      });
      process.stderr.write("runner-depot: shutting down\n");
    } finally {
      await closeAll();
    }
    return 0;
  },
};

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
async function openQueue(values: Record<string, unknown>): Promise<JobResultQueue> {
  if (typeof values.amqp === "string") {
    const { createRabbitMqQueue } = await importAdapter(() => import("../adapters/rabbitmq/index.js"), "amqplib");
    return createRabbitMqQueue({ url: values.amqp });
  }
  return {
    async publishJobResult(result: JobResult) {
      process.stdout.write(`${JSON.stringify(result)}\n`);
    },
  };
}

async function openLogStore(values: Record<string, unknown>, dataDir: string): Promise<JobLogStore> {
  if (typeof values.postgres === "string") {
    const { createPostgresLogStore } = await importAdapter(() => import("../adapters/postgres/index.js"), "pg");
    return createPostgresLogStore({ connectionString: values.postgres });
  }
  return createFsLogStore(path.join(dataDir, "logs"));
}

async function openPackageStore(values: Record<string, unknown>, dataDir: string): Promise<PackageStore> {
  const fsStore = createFsStore(path.join(dataDir, "depot"));
  if (typeof values.postgres !== "string" && typeof values["s3-bucket"] !== "string") return fsStore;
  let blobs: PackageStore | Awaited<ReturnType<typeof import("../adapters/s3/index.js")["createS3BlobStore"]>> = fsStore;
  if (typeof values["s3-bucket"] === "string") {
    const { createS3BlobStore } = await importAdapter(() => import("../adapters/s3/index.js"), "@aws-sdk/client-s3 @aws-sdk/lib-storage @aws-sdk/s3-request-presigner");
    blobs = createS3BlobStore({
      bucket: values["s3-bucket"],
      clientConfig: {
        endpoint: typeof values["s3-endpoint"] === "string" ? values["s3-endpoint"] : undefined,
        region: typeof values["s3-region"] === "string" ? values["s3-region"] : "us-east-1",
        forcePathStyle: true,
      },
    });
  }
  let records: PackageStore | ReturnType<typeof import("../adapters/postgres/index.js")["createPostgresRecords"]> = fsStore;
  if (typeof values.postgres === "string") {
    const { createPostgresRecords } = await importAdapter(() => import("../adapters/postgres/index.js"), "pg");
    records = createPostgresRecords({ connectionString: values.postgres });
  }
  return composeStore({ blobs, records });
}
