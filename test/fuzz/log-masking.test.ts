/**
 * Property test of secret masking end to end (issue 23): a real child process writes a job's
 * output in random pieces (down to 1 byte) through `sh` → runJob (the agent) → a RunnerClient
 * over a TCP proxy that cuts the call at a random byte (a cut and resume) → startRunnerServer.
 * Secrets of 4–4,096 bytes (multi-line and encoded forms among them) are declared to both
 * sides, to the service only (an agent that does not mask), or registered by the job with
 * `::add-mask::`. No secret may appear in the agent's local echo, what it hands the spool
 * (the spool is in memory; its input is what it holds and replays), the log store (memory,
 * fs, PostgreSQL), the archive (fs, S3), follow(), the console's SSE stream and raw download,
 * or the result message (memory queue, RabbitMQ).
 *
 * Cases: FUZZ_RUNS / 10 under `npm run fuzz` (10,000), 1,000 in CI; each a whole job, plus a
 * tenth as many under a random seed. A job took 110–370 ms on the shared 2-core machine
 * (load 9–15): the CI run's 1,100 jobs took 140 s at 09:25 UTC on 2026-11-29, and may take
 * up to ~7 minutes; the timeout allows 1.6 s a job.
 */
import { randomUUID } from "node:crypto";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import http from "node:http";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import amqp from "amqplib";
import fc from "fast-check";
import { toNodeHandler } from "srvx/node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createMemoryLogStore, createMemoryQueue } from "../../src/adapters/memory/index.js";
import { createFsLogArchive, createFsLogStore } from "../../src/adapters/fs/index.js";
import { createPostgresLogStore } from "../../src/adapters/postgres/index.js";
import { createRabbitMqQueue } from "../../src/adapters/rabbitmq/index.js";
import { createS3LogArchive } from "../../src/adapters/s3/index.js";
import { createConsole } from "../../src/console/index.js";
import { runJob } from "../../src/runner/agent/run-job.js";
import { createArchivingLogStore, type ArchivingLogStore } from "../../src/runner/archive/archiving-store.js";
import { createRunnerClient, type RunnerClient } from "../../src/runner/client/runner-client.js";
import { createRunnerService, type RunnerService } from "../../src/runner/index.js";
import type { JobLogStore, JobResult, JobResultQueue } from "../../src/runner/ports.js";
import { startRunnerServer, type RunnerServer } from "../../src/runner/server/start-server.js";
import { secretForms } from "../../src/runner/masking/secret-masker.js";
import {
  createTestSchema,
  needs,
  RABBITMQ_URL,
  startS3Child,
  withBrokerInUse,
  type S3Fixture,
} from "../fixtures/backends.js";
import { fuzzParams, fuzzRuns, fuzzTimeout } from "./settings.js";

const ready = needs("postgres", "rabbitmq");

/** Whole jobs per run: a tenth of FUZZ_RUNS under `npm run fuzz`, 1,000 in CI. */
const RUNS = process.env.FUZZ_RUNS ? Math.max(1, Math.round(fuzzRuns() / 10)) : 1_000;

/** One backend set a job goes through; jobs take turns. */
interface Backend {
  name: string;
  logs: JobLogStore;
  archive: ArchivingLogStore | null;
  runner: RunnerService;
  server: RunnerServer;
  proxy: CuttingProxy;
  web: { url: string; close(): Promise<void> };
  /** The result message as the queue got it (JSON text). */
  message(requestId: string): Promise<string>;
  close(): Promise<void>;
}

interface JobCase {
  declared: string[];
  serviceOnly: string[];
  added: string[];
  /** Output lines (a line may hold a multi-line secret's newlines). */
  lines: string[];
  /** Cut points of the output into the child's writes, as fractions of its length. */
  splits: number[];
  /** Where the proxy cuts the call (a fraction of the output's length), or null. */
  cut: number | null;
  /** Local echo off (runJob hands the client bytes), as text (lines as strings), or as bytes (`onOutput`). */
  echo: "none" | "lines" | "bytes";
  repoSecret: boolean;
}

const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;
const wellFormed = (s: string) => !LONE_SURROGATE.test(s) && Buffer.byteLength(s) >= 4 && Buffer.byteLength(s) <= 4096;
const line4 = (s: string) => s.split("\n").some((l) => Buffer.byteLength(l.replace(/\r$/, "")) >= 4);

/** Secrets of 4–4,096 bytes: any text, long ASCII, PEM-like multi-line values. */
const secretArb = fc
  .oneof(
    { weight: 4, arbitrary: fc.string({ unit: "binary", minLength: 1, maxLength: 40 }) },
    { weight: 2, arbitrary: fc.string({ unit: "grapheme-ascii", minLength: 200, maxLength: 4096 }) },
    { weight: 1, arbitrary: fc.string({ unit: "binary", minLength: 100, maxLength: 1000 }) },
    {
      weight: 2,
      arbitrary: fc
        .array(fc.uint8Array({ minLength: 3, maxLength: 48 }), { minLength: 2, maxLength: 60 })
        .map((rows) => [
          "-----BEGIN KEY-----",
          ...rows.map((r) => Buffer.from(r).toString("base64")),
          "-----END KEY-----",
        ])
        .map((rows) => rows.join("\n")),
    },
  )
  .filter((s) => wellFormed(s) && line4(s) && !s.includes("::add-mask::"));

/** Text around a printed secret: never a newline (lines are ours), never a command. */
const fillerArb = fc
  .string({ unit: "binary", maxLength: 24 })
  .map((s) => (LONE_SURROGATE.test(s) ? "" : s).replace(/\n/g, " "));

/** A secret printed in one of the documented forms. */
function printed(value: string, form: number, shift: number): string {
  const raw = Buffer.from(value, "utf8");
  switch (form % 6) {
    case 0:
      return value;
    case 1:
      // Inside a longer base64 text, at one of three alignments.
      return Buffer.concat([Buffer.alloc(shift % 3, 0x41), raw, Buffer.from("zz")]).toString("base64");
    case 2:
      return raw.toString("base64url");
    case 3:
      return encodeURIComponent(value);
    case 4:
      return JSON.stringify(value);
    default:
      return raw.toString("base64");
  }
}

const caseArb = fc
  .record({
    declared: fc.array(secretArb, { maxLength: 2 }),
    serviceOnly: fc.array(secretArb, { maxLength: 2 }),
    added: fc.array(secretArb, { maxLength: 2 }),
    uses: fc.array(fc.tuple(fillerArb, fc.nat(), fc.nat(), fc.nat(), fillerArb, fc.boolean()), {
      minLength: 1,
      maxLength: 8,
    }),
    plain: fc.array(fillerArb, { maxLength: 6 }),
    splits: fc.array(fc.double({ min: 0, max: 1, noNaN: true }), { maxLength: 30 }),
    cut: fc.option(fc.double({ min: 0, max: 1, noNaN: true })),
    echo: fc.constantFrom("none" as const, "lines" as const, "bytes" as const),
    repoSecret: fc.boolean(),
  })
  .filter((c) => c.declared.length + c.serviceOnly.length + c.added.length > 0)
  .map((c): JobCase => {
    const all = [...c.declared, ...c.serviceOnly, ...c.added];
    // A value is masked from the line that registers it on: the commands come first.
    const lines = c.added.map(
      (v) => `::add-mask::${v.replace(/%/g, "%25").replace(/\r/g, "%0D").replace(/\n/g, "%0A")}`,
    );
    let open = "";
    for (const [before, which, form, shift, after, newline] of c.uses) {
      open += before + printed(all[which % all.length]!, form, shift) + after;
      if (newline) {
        lines.push(open);
        open = "";
      }
    }
    lines.push(open, ...c.plain);
    return {
      declared: c.declared,
      serviceOnly: c.serviceOnly,
      added: c.added,
      lines,
      splits: c.splits,
      cut: c.cut,
      echo: c.echo,
      repoSecret: c.repoSecret,
    };
  });

/** What must not appear: every form of the value that fits on one line, and the value itself across lines. */
function leaks(texts: string[], secrets: string[], where: string): void {
  const joined = texts.join("\n");
  for (const value of secrets) {
    for (const form of secretForms(value)) {
      if (form.includes("\n")) continue;
      if (joined.includes(form))
        throw new Error(`${where}: a secret's form (${Buffer.byteLength(form)} bytes) is in clear`);
    }
    if (joined.includes(value)) throw new Error(`${where}: a secret (${Buffer.byteLength(value)} bytes) is in clear`);
  }
}

/** A TCP proxy that cuts each connection once the client has sent `cutAt` bytes (reset per job). */
interface CuttingProxy {
  port: number;
  arm(bytes: number | null): void;
  close(): Promise<void>;
}

async function startCuttingProxy(targetPort: number): Promise<CuttingProxy> {
  let cutAt: number | null = null;
  let sent = 0;
  const sockets = new Set<net.Socket>();
  const server = net.createServer((down) => {
    const up = net.connect(targetPort, "127.0.0.1");
    sockets.add(down).add(up);
    const kill = () => {
      down.destroy();
      up.destroy();
    };
    down.on("data", (chunk: Buffer) => {
      if (cutAt !== null && sent + chunk.length > cutAt) {
        up.write(chunk.subarray(0, cutAt - sent));
        cutAt = null;
        kill();
        return;
      }
      sent += chunk.length;
      up.write(chunk);
    });
    up.on("data", (chunk: Buffer) => down.write(chunk));
    for (const s of [down, up]) {
      s.on("error", () => undefined);
      s.on("close", () => {
        sockets.delete(s);
        kill();
      });
    }
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    port: (server.address() as net.AddressInfo).port,
    arm(bytes) {
      cutAt = bytes;
      sent = 0;
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

async function serveConsole(runner: RunnerService): Promise<{ url: string; close(): Promise<void> }> {
  const web = createConsole({ runner });
  const server = http.createServer(toNodeHandler((r: Request) => web.fetch(r)) as unknown as http.RequestListener);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as net.AddressInfo).port}`,
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

async function startBackend(
  name: string,
  logs: JobLogStore,
  archive: ArchivingLogStore | null,
  queue: JobResultQueue,
  message: (requestId: string) => Promise<string>,
  closeMore: () => Promise<void>,
): Promise<Backend> {
  const runner = createRunnerService(queue, { logs, retentionMs: false });
  const server = await startRunnerServer(runner, { port: 0 });
  const proxy = await startCuttingProxy(server.port);
  const web = await serveConsole(runner);
  return {
    name,
    logs,
    archive,
    runner,
    server,
    proxy,
    web,
    message,
    async close() {
      await web.close();
      await proxy.close();
      await server.close();
      await runner.close();
      await logs.close?.();
      await closeMore();
    },
  };
}

/** The lines of an SSE response up to its `end` event, decoded from their JSON. */
async function sseLines(response: Response): Promise<string[]> {
  const text = await response.text();
  const out: string[] = [];
  for (const block of text.split("\n\n")) {
    const fields = new Map(block.split("\n").map((l) => [l.slice(0, l.indexOf(":")), l.slice(l.indexOf(":") + 2)]));
    if (fields.get("event") === "lines") {
      for (const [line] of (JSON.parse(fields.get("data")!) as { lines: Array<[string, number]> }).lines)
        out.push(line);
    }
  }
  return out;
}

/** The sh script that writes `bytes` in the given pieces, one printf (one write) each. */
function scriptFor(bytes: Buffer, splits: number[]): string {
  const cuts = [...new Set(splits.map((f) => Math.floor(f * bytes.length)))].filter((n) => n > 0 && n < bytes.length);
  cuts.sort((a, b) => a - b);
  const out: string[] = [];
  let from = 0;
  for (const to of [...cuts, bytes.length]) {
    let fmt = "";
    for (let i = from; i < to; i++) fmt += `\\${bytes[i]!.toString(8).padStart(3, "0")}`;
    out.push(`printf '${fmt}'`);
    from = to;
  }
  return `${out.join("\n")}\n`;
}

describe("secret masking end to end (property)", () => {
  let dir: string;
  let s3: S3Fixture;
  let db: Awaited<ReturnType<typeof createTestSchema>>;
  let backends: Backend[] = [];
  const rabbitQueue = `rd-test-masking-${randomUUID()}`;
  let rabbit: amqp.ChannelModel | null = null;

  beforeAll(async () => {
    if (!ready) return;
    dir = await mkdtemp(path.join(os.tmpdir(), "runner-depot-masking-"));
    s3 = await startS3Child();
    db = await createTestSchema();
    const memoryQueue = createMemoryQueue();
    const fsQueue = createMemoryQueue();
    const fromMemory = (q: ReturnType<typeof createMemoryQueue>) => async (id: string) =>
      JSON.stringify(q.results.find((r) => r.requestId === id) ?? null);
    const rabbitmq = createRabbitMqQueue({
      url: RABBITMQ_URL,
      queue: rabbitQueue,
      queueArguments: { "x-expires": 600_000 },
      reconnectDelayMs: { initial: 100, max: 1_000 },
    });
    const seen = new Map<string, string>();
    // Other test files restart the shared broker between our jobs (each job holds the broker's
    // use mark, test/fixtures/backends.ts): the reader reconnects when its channel was closed.
    let channel: amqp.Channel | null = null;
    const reader = async (): Promise<amqp.Channel> => {
      if (channel !== null) return channel;
      rabbit = await amqp.connect(RABBITMQ_URL);
      rabbit.on("error", () => {});
      rabbit.on("close", () => (channel = null));
      const opened = await rabbit.createChannel();
      opened.on("error", () => {});
      opened.on("close", () => (channel = null));
      return (channel = opened);
    };
    const fromRabbit = async (id: string) => {
      for (let tries = 0; tries < 3_000 && !seen.has(id); tries++) {
        const msg = await (await reader()).get(rabbitQueue, { noAck: true }).catch(() => null);
        if (msg)
          seen.set((JSON.parse(msg.content.toString("utf8")) as JobResult).requestId, msg.content.toString("utf8"));
        else await new Promise((r) => setTimeout(r, 10));
      }
      return seen.get(id) ?? "null";
    };
    const fsArchive = createArchivingLogStore(createFsLogStore(path.join(dir, "live"), { fsync: false }), {
      archive: createFsLogArchive(path.join(dir, "archive")),
    });
    const s3Archive = createArchivingLogStore(createPostgresLogStore({ pool: db.pool, schema: db.schema }), {
      archive: createS3LogArchive({ bucket: s3.bucket, prefix: "masking/", client: s3.client }),
    });
    backends = [
      await startBackend("memory", createMemoryLogStore(), null, memoryQueue, fromMemory(memoryQueue), async () => {}),
      await startBackend("fs + fs archive", fsArchive, fsArchive, fsQueue, fromMemory(fsQueue), async () => {}),
      await startBackend("PostgreSQL + S3 archive + RabbitMQ", s3Archive, s3Archive, rabbitmq, fromRabbit, async () => {
        await rabbitmq.close?.();
      }),
    ];
  }, 60_000);

  afterAll(async () => {
    for (const b of backends) await b.close().catch(() => {});
    await rabbit?.close().catch(() => {});
    await db?.drop().catch(() => {});
    await s3?.close().catch(() => {});
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  /** Runs one job through `b` and checks every place its lines reach. */
  async function check(b: Backend, job: JobCase, index: number): Promise<void> {
    const requestId = randomUUID();
    const agentSecrets = [...job.declared, ...job.added];
    const allSecrets = [...agentSecrets, ...job.serviceOnly];
    await b.runner.expectJob(requestId, { secrets: [...job.declared, ...job.serviceOnly] });
    const output = Buffer.from(job.lines.join("\n") + "\n", "utf8");
    const script = path.join(dir, `job-${index}.sh`);
    await writeFile(script, scriptFor(output, job.splits));
    b.proxy.arm(job.cut === null ? null : Math.floor(job.cut * output.length));
    const real = createRunnerClient({
      endpoint: `http://127.0.0.1:${b.proxy.port}`,
      requestId,
      token: "",
      backoff: { initialMs: 1, maxMs: 20 },
    });
    // What the agent hands the client is what the spool holds and replays.
    const spooled: string[] = [];
    const client: RunnerClient = Object.create(real);
    client.log = (line, stderr) => (spooled.push(line), real.log(line, stderr));
    client.logUtf8 = (src, start, end, stderr) => (
      spooled.push(Buffer.from(src.buffer, src.byteOffset, src.byteLength).toString("utf8", start, end)),
      real.logUtf8!(src, start, end, stderr)
    );
    client.logLines = (src, start, end, stderr, time, max) => {
      const taken = real.logLines!(src, start, end, stderr, time, max);
      const text = Buffer.from(src.buffer, src.byteOffset, src.byteLength).toString("utf8", start, taken.next);
      if (taken.next > start) spooled.push(...text.slice(0, -1).split("\n"));
      return taken;
    };
    const echo: string[] = [];
    const repoUrl = job.repoSecret
      ? `https://ci:${allSecrets[0]}@example.com/repo.git`
      : "https://example.com/repo.git";
    try {
      const code = await runJob(client, {
        command: "/bin/sh",
        args: [script],
        secrets: job.declared,
        repoUrl,
        ...(job.echo === "lines" ? { onLine: (line: string) => echo.push(line) } : {}),
        ...(job.echo === "bytes" ? { onOutput: (bytes: Buffer) => echo.push(bytes.toString("utf8")) } : {}),
      });
      expect(code).toBe(0);
    } finally {
      await real.close();
      await rm(script, { force: true });
    }
    // The agent's side: masked before it leaves the process (secrets it knows).
    leaks(echo, agentSecrets, `${b.name}: agent echo`);
    // The bytes echo is what the agent handed the client, line for line.
    if (job.echo === "bytes") expect(echo.join("")).toBe(spooled.map((l) => `${l}\n`).join(""));
    leaks(spooled, agentSecrets, `${b.name}: spool`);
    // Everything after the service: no secret it or the agent knows.
    const stored = await b.logs.read(requestId, 0, 1_000_000);
    expect(stored.length).toBeGreaterThanOrEqual(job.lines.length);
    leaks(
      stored.map((l) => l.line),
      allSecrets,
      `${b.name}: log store`,
    );
    const followed: string[] = [];
    for await (const l of b.runner.follow(requestId)) followed.push(l.line);
    leaks(followed, allSecrets, `${b.name}: follow()`);
    const raw = await (await fetch(`${b.web.url}/api/jobs/${requestId}/raw`)).text();
    leaks([raw], allSecrets, `${b.name}: raw download`);
    leaks(
      await sseLines(await fetch(`${b.web.url}/api/jobs/${requestId}/events?from=0`)),
      allSecrets,
      `${b.name}: SSE`,
    );
    const message = await b.message(requestId);
    expect(message).not.toBe("null");
    leaks([message, (JSON.parse(message) as JobResult).repoUrl], allSecrets, `${b.name}: result message`);
    if (b.archive) {
      const state = await b.archive.archiveJob(requestId);
      expect(state?.archived, `${b.name}: archived`).toBeTruthy();
      const archived = await b.logs.read(requestId, 0, 1_000_000);
      expect(archived.length).toBe(stored.length);
      leaks(
        archived.map((l) => l.line),
        allSecrets,
        `${b.name}: archive`,
      );
    }
  }

  it(
    `no secret reaches any store, the archive, follow(), the console, the result or the agent's echo (${RUNS} jobs)`,
    async () => {
      let index = 0;
      // The fixed seed's run, then a tenth as many under a random seed (settings.ts).
      const sets = fuzzParams<[JobCase]>("log masking end to end");
      for (const [k, params] of sets.entries()) {
        await fc.assert(
          fc.asyncProperty(caseArb, async (job) => {
            const i = index++;
            const backend = backends[i % backends.length]!;
            // The RabbitMQ job holds the broker's use mark: no other file's outage during it.
            if (backend.name.includes("RabbitMQ")) await withBrokerInUse(() => check(backend, job, i));
            else await check(backend, job, i);
          }),
          { ...params, numRuns: k === 0 ? RUNS : Math.max(1, Math.round(RUNS / 10)) },
        );
      }
    },
    // 1,800 s for CI's 1,100 jobs; fuzzTimeout scales it by FUZZ_RUNS / 2,000 (50× for `npm run fuzz`'s 11,000).
    fuzzTimeout(1_800_000),
  );
});
