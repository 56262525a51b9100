/**
 * Test fixtures for the real backends (not a test file): s3rver in-process, throw-away
 * PostgreSQL schemas, a TCP proxy that can cut a backend off, and RabbitMQ control.
 */
import { execFile, spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { mkdir, mkdtemp, rm, rmdir } from "node:fs/promises";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { S3Client } from "@aws-sdk/client-s3";
import pg from "pg";
// s3rver ships no types.
// @ts-expect-error untyped CommonJS module
import S3rver from "s3rver";

const run = promisify(execFile);

export const POSTGRES_URL = process.env.RUNNER_DEPOT_TEST_POSTGRES ?? "postgres://postgres@127.0.0.1:5432/test";
export const RABBITMQ_URL = process.env.RUNNER_DEPOT_TEST_RABBITMQ ?? "amqp://guest:guest@127.0.0.1:5672";

/** A running s3rver with one bucket, and a client for it. */
export interface S3Fixture {
  endpoint: string;
  bucket: string;
  clientConfig: ConstructorParameters<typeof S3Client>[0];
  client: S3Client;
  close(): Promise<void>;
}

/** Starts s3rver on 127.0.0.1 (port chosen by the OS) over a fresh temp dir. */
export async function startS3(options: { port?: number } = {}): Promise<S3Fixture> {
  const directory = await mkdtemp(join(tmpdir(), "runner-depot-s3-"));
  const bucket = "depot";
  const server = new S3rver({
    address: "127.0.0.1",
    port: options.port ?? 0,
    silent: true,
    directory,
    configureBuckets: [{ name: bucket }],
  });
  const address = (await server.run()) as net.AddressInfo;
  const endpoint = `http://127.0.0.1:${address.port}`;
  return fixtureFor(endpoint, bucket, async () => {
    server.httpServer.closeAllConnections?.();
    await server.close();
    await rm(directory, { recursive: true, force: true });
  });
}

/**
 * Starts s3rver in a child process with OpenSSL's legacy provider: s3rver encrypts its
 * ListObjectsV2 continuation tokens with DES, which Node's OpenSSL 3 refuses by default,
 * so an in-process s3rver fails any listing of more than 1 000 keys.
 */
export async function startS3Child(): Promise<S3Fixture> {
  const directory = await mkdtemp(join(tmpdir(), "runner-depot-s3-"));
  const script = `const S3rver = require("s3rver");
    new S3rver({ address: "127.0.0.1", port: 0, silent: true, directory: process.env.S3_DIR, configureBuckets: [{ name: "depot" }] })
      .run().then((a) => console.log("PORT " + a.port));`;
  const child = spawn(process.execPath, ["--openssl-legacy-provider", "-e", script], {
    cwd: process.cwd(),
    env: { ...process.env, S3_DIR: directory },
    stdio: ["ignore", "pipe", "inherit"],
  });
  const port = await new Promise<number>((resolve, reject) => {
    let out = "";
    child.stdout!.on("data", (d: Buffer) => {
      out += d.toString();
      const m = /PORT (\d+)/.exec(out);
      if (m) resolve(Number(m[1]));
    });
    child.once("exit", (code) => reject(new Error(`s3rver exited with ${code}`)));
  });
  return fixtureFor(`http://127.0.0.1:${port}`, "depot", async () => {
    child.kill();
    await new Promise((resolve) => child.once("exit", resolve));
    await rm(directory, { recursive: true, force: true });
  });
}

/** An S3 fixture for an endpoint (e.g. a proxy in front of s3rver). */
export function fixtureFor(endpoint: string, bucket: string, close: () => Promise<void> = async () => {}): S3Fixture {
  const clientConfig = {
    endpoint,
    region: "us-east-1",
    forcePathStyle: true,
    credentials: { accessKeyId: "S3RVER", secretAccessKey: "S3RVER" },
    maxAttempts: 1,
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
    url: (template) => template.replace(`:${port}`, `:${own}`),
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

/**
 * Runs `work` while holding a machine-wide lock, so two test files never take the
 * shared broker down at the same time.
 */
export async function withBrokerLock<T>(work: () => Promise<T>): Promise<T> {
  for (let i = 0; ; i++) {
    try {
      await mkdir(LOCK);
      break;
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "EEXIST" || i > 1200) throw error;
      await new Promise((r) => setTimeout(r, 100));
    }
  }
  try {
    return await work();
  } finally {
    await rmdir(LOCK).catch(() => {});
  }
}

/** Runs rabbitmqctl with arguments. */
export async function rabbitmqctl(...args: string[]): Promise<string> {
  const { stdout } = await run("rabbitmqctl", args, { timeout: 60_000 });
  return stdout;
}

/** Number of client connections the broker currently has. */
export async function brokerConnections(): Promise<number> {
  const out = await rabbitmqctl("list_connections", "-q", "--no-table-headers", "name");
  return out.split("\n").filter((l) => l.trim()).length;
}
