/**
 * The real probes and starters behind the global setup's decision (test/setup/services.ts):
 * a PostgreSQL or AMQP handshake with a short bound, the embedded PostgreSQL child, and a
 * RabbitMQ broker from Docker or from the installed Debian package.
 */
import { execFile, spawn } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { randomUUID } from "node:crypto";
import { access, mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import amqp from "amqplib";
import pg from "pg";
import type { RabbitMqStarter, ServiceWays, Started } from "./services.js";

const exec = promisify(execFile);
const ROOT = fileURLToPath(new URL("../..", import.meta.url));
/** A probe answers within this or counts as unreachable. */
const PROBE_MS = 3_000;
/** PGlite runs initdb in WebAssembly at start: tens of seconds on a busy two-core machine. */
const EMBEDDED_START_MS = 180_000;
/** A broker's first start (Docker may pull its image first). */
const BROKER_START_MS = 300_000;

export const realWays: ServiceWays = {
  probePostgres,
  probeRabbitMq,
  startEmbeddedPostgres,
  canStart,
  startRabbitMq,
  localControl,
};

/** Connects and runs `select 1`; null when that worked, else why not. */
export async function probePostgres(url: string): Promise<string | null> {
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: PROBE_MS, query_timeout: PROBE_MS });
  client.on("error", () => {});
  try {
    await client.connect();
    await client.query("select 1");
    return null;
  } catch (error) {
    return why(error);
  } finally {
    await client.end().catch(() => {});
  }
}

/** Opens an AMQP connection and a channel; null when that worked, else why not. */
export async function probeRabbitMq(url: string): Promise<string | null> {
  try {
    const connection = await amqp.connect(url, { timeout: PROBE_MS });
    connection.on("error", () => {});
    try {
      await connection.createChannel();
    } finally {
      await connection.close().catch(() => {});
    }
    return null;
  } catch (error) {
    return why(error);
  }
}

/** Starts test/setup/embedded-postgres.ts and waits for the URL it prints. */
export async function startEmbeddedPostgres(): Promise<Started> {
  const child = spawn(process.execPath, ["--import", "tsx", join(ROOT, "test/setup/embedded-postgres.ts")], {
    cwd: ROOT,
    stdio: ["pipe", "pipe", "pipe"],
  });
  const url = await lineFrom(child, /^READY (\S+)$/m, EMBEDDED_START_MS, "embedded PostgreSQL");
  return {
    url,
    async stop() {
      // Closing its stdin asks it to stop; it also goes if this process dies.
      child.stdin!.end();
      await exited(child, 10_000);
    },
  };
}

export async function canStart(starter: RabbitMqStarter): Promise<string | null> {
  if (starter === "docker") {
    try {
      await exec("docker", ["info", "--format", "{{.ServerVersion}}"], { timeout: 15_000 });
      return null;
    } catch (error) {
      const e = error as NodeJS.ErrnoException & { stderr?: string };
      if (e.code === "ENOENT") return "not installed";
      return `no Docker daemon (${(e.stderr || e.message).trim().split("\n")[0]})`;
    }
  }
  if (process.getuid?.() !== 0) return "needs root";
  if (!(await exists(RABBITMQ_BIN))) return "not installed (apt-get install rabbitmq-server)";
  return null;
}

export function startRabbitMq(starter: RabbitMqStarter): Promise<Started> {
  return starter === "docker" ? startDockerBroker() : startDebianBroker();
}

/** `rabbitmqctl` reaches a broker already running on this machine; not one elsewhere. */
export async function localControl(url: string): Promise<string[] | null> {
  const host = new URL(url).hostname;
  if (!["127.0.0.1", "localhost", "[::1]"].includes(host)) return null;
  try {
    await exec("rabbitmqctl", ["-q", "status"], { timeout: 60_000 });
    return ["rabbitmqctl"];
  } catch {
    return null;
  }
}

/** A throw-away container with the official image, its port published on 127.0.0.1. */
async function startDockerBroker(): Promise<Started> {
  const name = `runner-depot-test-rabbitmq-${randomUUID().slice(0, 8)}`;
  await exec("docker", ["run", "-d", "--rm", "--name", name, "-p", "127.0.0.1::5672", "rabbitmq:3-alpine"], {
    timeout: BROKER_START_MS,
  });
  const stop = async () => {
    await exec("docker", ["rm", "-f", name], { timeout: 60_000 }).catch(() => {});
  };
  try {
    const { stdout } = await exec("docker", ["port", name, "5672/tcp"], { timeout: 30_000 });
    const port = /:(\d+)\s*$/m.exec(stdout)?.[1];
    if (!port) throw new Error(`docker port printed ${JSON.stringify(stdout)}`);
    const url = `amqp://guest:guest@127.0.0.1:${port}`;
    await untilAnswers(url, BROKER_START_MS);
    return { url, control: ["docker", "exec", name, "rabbitmqctl"], stop };
  } catch (error) {
    await stop();
    throw error;
  }
}

/** The Debian package's rabbitmq-server, run directly (not through its `su rabbitmq` wrapper). */
const RABBITMQ_BIN = "/usr/lib/rabbitmq/bin/rabbitmq-server";
const RABBITMQCTL_BIN = "/usr/lib/rabbitmq/bin/rabbitmqctl";

/**
 * A private broker node for this run: its own node name, ports and data in a temp dir,
 * so a broker already on the machine (and its configuration) is left alone.
 */
async function startDebianBroker(): Promise<Started> {
  const dir = await mkdtemp(join(tmpdir(), "runner-depot-rabbitmq-"));
  const [port, distPort] = [await freePort(), await freePort()];
  const node = `rd-test-${process.pid}@localhost`;
  await mkdir(join(dir, "log"));
  await writeFile(join(dir, "enabled_plugins"), "[].\n");
  // An env file of our own, so /etc/rabbitmq/rabbitmq-env.conf's node name is not used.
  await writeFile(join(dir, "rabbitmq-env.conf"), "");
  await writeFile(join(dir, "rabbitmq.conf"), "loopback_users.guest = true\n");
  const env = {
    ...process.env,
    RABBITMQ_CONF_ENV_FILE: join(dir, "rabbitmq-env.conf"),
    RABBITMQ_CONFIG_FILE: join(dir, "rabbitmq.conf"),
    RABBITMQ_NODENAME: node,
    RABBITMQ_NODE_IP_ADDRESS: "127.0.0.1",
    RABBITMQ_NODE_PORT: String(port),
    RABBITMQ_DIST_PORT: String(distPort),
    RABBITMQ_MNESIA_BASE: join(dir, "mnesia"),
    RABBITMQ_LOG_BASE: join(dir, "log"),
    RABBITMQ_ENABLED_PLUGINS_FILE: join(dir, "enabled_plugins"),
    RABBITMQ_PID_FILE: join(dir, "pid"),
    ERL_EPMD_ADDRESS: "127.0.0.1",
  };
  const child = spawn(RABBITMQ_BIN, [], { env, stdio: "ignore" });
  const control = [RABBITMQCTL_BIN, "-n", node];
  const stop = async () => {
    await exec(RABBITMQCTL_BIN, ["-n", node, "stop"], { timeout: 60_000 }).catch(() => {});
    if (child.exitCode === null) child.kill("SIGKILL");
    await exited(child, 10_000);
    await rm(dir, { recursive: true, force: true });
  };
  const url = `amqp://guest:guest@127.0.0.1:${port}`;
  try {
    await Promise.race([
      untilAnswers(url, BROKER_START_MS),
      new Promise((_, reject) =>
        child.once("exit", (code) => reject(new Error(`rabbitmq-server exited with ${code} (logs in ${dir}/log)`))),
      ),
    ]);
    return { url, control, stop };
  } catch (error) {
    await stop();
    throw error;
  }
}

async function untilAnswers(url: string, ms: number): Promise<void> {
  const deadline = Date.now() + ms;
  for (;;) {
    const failure = await probeRabbitMq(url);
    if (failure === null) return;
    if (Date.now() > deadline) throw new Error(`no answer at ${url} within ${ms / 1000} s (${failure})`);
    await new Promise((r) => setTimeout(r, 500));
  }
}

/** Resolves with the first capture of `pattern` in the child's stdout; rejects if it exits first or takes too long. */
function lineFrom(child: ChildProcess, pattern: RegExp, ms: number, what: string): Promise<string> {
  return new Promise((resolve, reject) => {
    let out = "";
    let err = "";
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error(`${what} did not start within ${ms / 1000} s`));
    }, ms);
    child.stderr!.setEncoding("utf8").on("data", (d: string) => (err = (err + d).slice(-2000)));
    child.stdout!.setEncoding("utf8").on("data", (d: string) => {
      out += d;
      const match = pattern.exec(out);
      if (match) {
        clearTimeout(timer);
        resolve(match[1]!);
      }
    });
    child.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`${what} exited with ${code}: ${err.trim().split("\n").slice(-3).join(" | ")}`));
    });
    child.once("error", (error) => {
      clearTimeout(timer);
      reject(error);
    });
  });
}

async function exited(child: ChildProcess, ms: number): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  await new Promise<void>((resolve) => {
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      resolve();
    }, ms);
    child.once("exit", () => {
      clearTimeout(timer);
      resolve();
    });
  });
}

async function freePort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as net.AddressInfo;
  await new Promise((resolve) => server.close(resolve));
  return port;
}

async function exists(path: string): Promise<boolean> {
  return access(path).then(
    () => true,
    () => false,
  );
}

/** A short reason from a connection error: its code, else its first line. */
function why(error: unknown): string {
  const e = error as NodeJS.ErrnoException & { errors?: NodeJS.ErrnoException[] };
  const code = e.code ?? e.errors?.[0]?.code;
  const text = (e.message || e.errors?.[0]?.message || String(error)).split("\n")[0]!;
  return code && !text.includes(code) ? `${code}${text ? `: ${text}` : ""}` : text || "no answer";
}
