/**
 * Test fixtures for the real backends (not a test file): s3rver (in a child process), throw-away
 * PostgreSQL schemas, a TCP proxy that can cut a backend off, and RabbitMQ control.
 */
import { execFile, spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { mkdir, mkdtemp, readdir, readFile, rm, rmdir, stat, writeFile } from "node:fs/promises";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { S3Client } from "@aws-sdk/client-s3";
import pg from "pg";
import { beforeEach } from "vitest";
import { servicesFromEnv } from "./setup/services.js";
import type { ServiceName, TestServices } from "./setup/services.js";

const run = promisify(execFile);

/**
 * The services this run uses. Under vitest: what the global setup decided
 * (test/setup/global-setup.ts); elsewhere (bench, soak): the RUNNER_DEPOT_TEST_*
 * variables or their defaults.
 */
export const SERVICES: TestServices = await servicesForThisProcess();

async function servicesForThisProcess(): Promise<TestServices> {
  if (process.env.VITEST) {
    const { inject } = await import("vitest");
    const provided = inject("services");
    if (provided) return provided;
  }
  return servicesFromEnv(process.env);
}

/** PostgreSQL for the tests (the requested URL when there is none: its tests are skipped). */
export const POSTGRES_URL = SERVICES.postgres.url ?? SERVICES.postgres.requested;
/** RabbitMQ for the tests (the requested URL when there is none: its tests are skipped). */
export const RABBITMQ_URL = SERVICES.rabbitmq.url ?? SERVICES.rabbitmq.requested;

/**
 * Makes every test of the calling file skip, with the reason as its note, when `service`
 * could not be had this run; returns whether it is there, for the file's beforeAll/afterAll
 * to do nothing otherwise. Call it once at the top level of a test file.
 */
export function needs(...services: ServiceName[]): boolean {
  const missing = services.filter((name) => SERVICES[name].url === null);
  const reason = missing.map((name) => `${name === "postgres" ? "PostgreSQL" : "RabbitMQ"} unavailable: ${SERVICES[name].reason}`).join("; ");
  beforeEach((context) => {
    if (missing.length > 0) context.skip(reason);
  });
  return missing.length === 0;
}

/** A running s3rver with one bucket, and a client for it. */
export interface S3Fixture {
  endpoint: string;
  bucket: string;
  clientConfig: ConstructorParameters<typeof S3Client>[0];
  client: S3Client;
  close(): Promise<void>;
}

/**
 * Starts s3rver on 127.0.0.1 (port chosen by the OS unless given) over a fresh temp dir, in
 * a child process (see {@link startS3Child}). It used to run in the test's own process, but
 * s3rver's file store sometimes fails to open its temp file under concurrent writes and
 * throws that from a stream without an error listener: in-process, that uncaught exception
 * failed a whole CI run (backends-depot, concurrent publishes). In its own process the one
 * request fails, as S3 answers 500 at times, and the SDK retries it.
 */
export async function startS3(options: { port?: number } = {}): Promise<S3Fixture> {
  return startS3Process(options.port ?? 0);
}

/**
 * Starts s3rver in a child process with OpenSSL's legacy provider: s3rver encrypts its
 * ListObjectsV2 continuation tokens with DES, which Node's OpenSSL 3 refuses by default,
 * so an in-process s3rver fails any listing of more than 1 000 keys.
 */
export async function startS3Child(): Promise<S3Fixture> {
  return startS3Process(0);
}

async function startS3Process(port: number): Promise<S3Fixture> {
  const directory = await mkdtemp(join(tmpdir(), "runner-depot-s3-"));
  // An s3rver fault in one request is that request's failure, not the server's end.
  const script = `process.on("uncaughtException", (e) => console.error("s3rver fault (the request fails, the client retries): " + e.message));
    const S3rver = require("s3rver");
    new S3rver({ address: "127.0.0.1", port: Number(process.env.S3_PORT), silent: true, directory: process.env.S3_DIR, configureBuckets: [{ name: "depot" }] })
      .run().then((a) => console.log("PORT " + a.port));`;
  const child = spawn(process.execPath, ["--openssl-legacy-provider", "-e", script], {
    cwd: process.cwd(),
    env: { ...process.env, S3_DIR: directory, S3_PORT: String(port) },
    stdio: ["ignore", "pipe", "inherit"],
  });
  const listening = await new Promise<number>((resolve, reject) => {
    let out = "";
    child.stdout!.on("data", (d: Buffer) => {
      out += d.toString();
      const m = /PORT (\d+)/.exec(out);
      if (m) resolve(Number(m[1]));
    });
    child.once("exit", (code) => reject(new Error(`s3rver exited with ${code}`)));
  });
  return fixtureFor(`http://127.0.0.1:${listening}`, "depot", { maxAttempts: 3 }, async () => {
    if (child.exitCode === null) {
      child.kill();
      await new Promise((resolve) => child.once("exit", resolve));
    }
    await rm(directory, { recursive: true, force: true });
  });
}

/**
 * An S3 fixture for an endpoint (e.g. a proxy in front of s3rver). `maxAttempts` is 1 by
 * default so outage tests through a proxy fail at once; fixtures on s3rver itself keep the
 * SDK's default of 3, as a host would: s3rver, like S3, sometimes answers 500
 * InternalError under concurrent writes, and S3 documents that as "retry".
 */
export function fixtureFor(
  endpoint: string,
  bucket: string,
  options: { maxAttempts?: number } = {},
  close: () => Promise<void> = async () => {},
): S3Fixture {
  const clientConfig = {
    endpoint,
    region: "us-east-1",
    forcePathStyle: true,
    credentials: { accessKeyId: "S3RVER", secretAccessKey: "S3RVER" },
    maxAttempts: options.maxAttempts ?? 1,
  };
  const client = new S3Client(clientConfig);
  return {
    endpoint,
    bucket,
    clientConfig,
    client,
    async close() {
      client.destroy();
      await close();
    },
  };
}

/** A throw-away schema; `drop()` removes it with everything in it. */
export async function createTestSchema(): Promise<{ schema: string; pool: pg.Pool; drop(): Promise<void> }> {
  const schema = `rd_test_${randomUUID().replace(/-/g, "").slice(0, 16)}`;
  const pool = new pg.Pool({ connectionString: POSTGRES_URL, max: 8 });
  pool.on("error", () => {});
  return {
    schema,
    pool,
    async drop() {
      await pool.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
      await pool.end();
    },
  };
}

/** A TCP proxy to a backend that can cut every connection and refuse new ones. */
export interface TcpProxy {
  port: number;
  url(template: string): string;
  /** Resets every open connection and refuses new ones until `heal()`. */
  break(): Promise<void>;
  heal(): Promise<void>;
  /** New connections go to `port` from now on (existing ones are left alone). */
  retarget(port: number): void;
  close(): Promise<void>;
}

/** Starts a proxy on 127.0.0.1 (OS-chosen port) to the host and port of a service URL. */
export function startProxyFor(serviceUrl: string, defaultPort: number): Promise<TcpProxy> {
  const url = new URL(serviceUrl);
  return startTcpProxy(url.hostname, url.port ? Number(url.port) : defaultPort);
}

/** Starts a proxy on 127.0.0.1 (OS-chosen port) to `host:port`. */
export async function startTcpProxy(host: string, port: number): Promise<TcpProxy> {
  const sockets = new Set<net.Socket>();
  let broken = false;
  let target = port;
  const server = net.createServer((client) => {
    if (broken) {
      client.resetAndDestroy();
      return;
    }
    const upstream = net.connect(target, host);
    sockets.add(client);
    sockets.add(upstream);
    const drop = () => {
      client.destroy();
      upstream.destroy();
      sockets.delete(client);
      sockets.delete(upstream);
    };
    client.on("error", drop).on("close", drop);
    upstream.on("error", drop).on("close", drop);
    client.pipe(upstream);
    upstream.pipe(client);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const own = (server.address() as net.AddressInfo).port;
  return {
    port: own,
    url(template) {
      // The same URL with the proxy's address in place of the backend's.
      const url = new URL(template);
      url.hostname = "127.0.0.1";
      url.port = String(own);
      return url.toString();
    },
    async break() {
      broken = true;
      for (const s of sockets) s.resetAndDestroy();
      sockets.clear();
    },
    async heal() {
      broken = false;
    },
    retarget(next) {
      target = next;
    },
    async close() {
      broken = true;
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

const LOCK = join(tmpdir(), "runner-depot-rabbitmq-outage.lock");
/** One file per test that is using the shared broker right now (the lock's shared side). */
const USERS = `${LOCK}.users`;

const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const exists = (path: string) => stat(path).then(() => true, () => false);

/** A user file whose process is gone no longer holds the broker (a killed test run). */
async function liveUsers(): Promise<number> {
  let live = 0;
  for (const name of await readdir(USERS).catch(() => [] as string[])) {
    const pid = Number((await readFile(join(USERS, name), "utf8").catch(() => "")).trim());
    if (pid > 0 && processAlive(pid)) live++;
    else await rm(join(USERS, name), { force: true });
  }
  return live;
}

function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === "EPERM";
  }
}

/**
 * Runs `work` while holding the machine-wide broker lock exclusively: no other outage
 * and no {@link withBrokerInUse} user runs meanwhile (test files run in parallel, and a
 * test that publishes while another stopped the broker would fail for no fault of its own).
 * Both sides write their mark first and check the other's after, so one always sees the other.
 */
export async function withBrokerLock<T>(work: () => Promise<T>): Promise<T> {
  const release = await acquireBrokerOutage();
  try {
    return await work();
  } finally {
    await release();
  }
}

/**
 * Takes the broker lock exclusively (see {@link withBrokerLock}) and returns its release.
 * A test whose outage must land while its own jobs run takes it before starting them:
 * waiting for other users inside the run would let its jobs all end first.
 */
export async function acquireBrokerOutage(): Promise<() => Promise<void>> {
  for (let i = 0; ; i++) {
    try {
      await mkdir(LOCK);
      break;
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "EEXIST" || i > 1200) throw error;
      await pause(100);
    }
  }
  try {
    // Users that started before the lock finish first (bounded: a user file is seconds).
    for (let i = 0; (await liveUsers()) > 0 && i < 1200; i++) await pause(100);
  } catch (error) {
    await rmdir(LOCK).catch(() => {});
    throw error;
  }
  return () => rmdir(LOCK).catch(() => {});
}

/**
 * Marks this test as using the shared broker, once no outage is under way; the returned
 * function takes the mark back. A whole file that talks to the broker holds it from
 * `beforeAll` to `afterAll`.
 */
export async function acquireBrokerUse(): Promise<() => Promise<void>> {
  await mkdir(USERS, { recursive: true });
  const mark = join(USERS, randomUUID());
  for (let i = 0; ; i++) {
    while (await exists(LOCK)) await pause(100);
    await writeFile(mark, String(process.pid));
    if (!(await exists(LOCK))) break;
    // An outage began between the check and the mark: step aside until it is over.
    await rm(mark, { force: true });
    if (i > 1200) throw new Error("the shared broker stayed locked for an outage");
  }
  return () => rm(mark, { force: true });
}

/** Runs `work`, which needs the shared broker up, never during another test's outage. */
export async function withBrokerInUse<T>(work: () => Promise<T>): Promise<T> {
  const release = await acquireBrokerUse();
  try {
    return await work();
  } finally {
    await release();
  }
}

/**
 * Why the broker cannot be stopped and started from here (rabbitmqctl for it is not to
 * be had: a broker on another machine), or null when it can.
 */
export const BROKER_CONTROL_MISSING: string | null = SERVICES.rabbitmq.control
  ? null
  : `no rabbitmqctl reaches the broker at ${SERVICES.rabbitmq.requested}`;

/** Runs rabbitmqctl with arguments against this run's broker. */
export async function rabbitmqctl(...args: string[]): Promise<string> {
  const [command, ...prefix] = SERVICES.rabbitmq.control ?? ["rabbitmqctl"];
  const { stdout } = await run(command!, [...prefix, ...args], { timeout: 60_000 });
  return stdout;
}

/** Number of client connections the broker currently has. */
export async function brokerConnections(): Promise<number> {
  const out = await rabbitmqctl("list_connections", "-q", "--no-table-headers", "name");
  return out.split("\n").filter((l) => l.trim()).length;
}
