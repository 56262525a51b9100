/**
 * Secrets as the orchestrator declares them: in the cloud-init job config (rendered, written
 * 0600, read back by the agent), and to the service with `expectJob` — refused under 4 bytes,
 * never written to the log store or the result, and masked by the service for a client that
 * does not mask (a real client over h2c sending the secret in clear).
 */
import { randomUUID } from "node:crypto";
import { mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parse } from "yaml";
import { createFsLogStore } from "../../../src/adapters/fs/index.js";
import { createMemoryQueue, type MemoryQueue } from "../../../src/adapters/memory/index.js";
import { readJobConfig, renderCloudInit } from "../../../src/runner/agent/cloud-init.js";
import { createRunnerClient } from "../../../src/runner/client/runner-client.js";
import { createRunnerService, type RunnerService } from "../../../src/runner/index.js";
import type { JobLogStore } from "../../../src/runner/ports.js";
import { startRunnerServer, type RunnerServer } from "../../../src/runner/server/start-server.js";
import { RunnerDepotError } from "../../../src/errors.js";
import type { Logger } from "../../../src/telemetry.js";

const TOKEN = "ghp_declaredSecretValue0123456789";
const PEM = "-----BEGIN KEY-----\nMIIBOgIBAAJBAKj34GkxFhD9\n-----END KEY-----";

let dir: string;
let queue: MemoryQueue;
let logs: JobLogStore;
let runner: RunnerService;
let server: RunnerServer;

beforeAll(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), "runner-depot-declared-"));
  queue = createMemoryQueue();
  logs = createFsLogStore(path.join(dir, "logs"), { fsync: false });
  runner = createRunnerService(queue, { logs });
  server = await startRunnerServer(runner, { port: 0 });
});

afterAll(async () => {
  await server?.close();
  await runner?.close();
  await logs?.close?.();
  await rm(dir, { recursive: true, force: true });
});

function refusal(work: () => unknown): RunnerDepotError {
  try {
    work();
  } catch (e) {
    return e as RunnerDepotError;
  }
  throw new Error("not refused");
}

describe("declared secrets", () => {
  it("the job config carries them to the agent, and a value under 4 bytes is refused without echoing it", async () => {
    const requestId = randomUUID();
    const job = { endpoint: "https://ci.internal:50051", requestId, token: "t", command: ["make"] };
    const doc = parse(renderCloudInit({ ...job, secrets: [TOKEN, PEM] }).replace(/^#cloud-config\n/, "")) as {
      write_files: Array<{ path: string; permissions: string; content: string }>;
    };
    expect(doc.write_files[0]!.permissions).toBe("0600");
    const file = path.join(dir, "job.json");
    await writeFile(file, doc.write_files[0]!.content, { mode: 0o600 });
    expect((await readJobConfig(file)).secrets).toEqual([TOKEN, PEM]);

    const error = refusal(() => renderCloudInit({ ...job, secrets: [TOKEN, "xyz"] }));
    expect(error.code).toBe("INVALID_ARGUMENT");
    expect(error.message).toContain("secrets[1]: a secret must be at least 4 bytes (got 3)");
    expect(error.message).not.toContain("xyz");
    await writeFile(file, JSON.stringify({ ...JSON.parse(doc.write_files[0]!.content), secrets: ["ab"] }));
    await expect(readJobConfig(file)).rejects.toMatchObject({ code: "INVALID_ARGUMENT" });
  });

  it("expectJob refuses a value under 4 bytes with INVALID_ARGUMENT", async () => {
    await expect(runner.expectJob(randomUUID(), { secrets: ["abc"] })).rejects.toMatchObject({
      code: "INVALID_ARGUMENT",
      message: expect.stringContaining("at least 4 bytes"),
    });
  });

  it("the service masks what a non-masking client sends, and stores no declared value anywhere", async () => {
    const requestId = randomUUID();
    await runner.expectJob(requestId, { repoUrl: `https://ci:${TOKEN}@example.com/r.git`, secrets: [TOKEN, PEM] });
    // createRunnerClient itself does not mask (runJob does): this is an agent that does not.
    const client = createRunnerClient({ endpoint: `http://127.0.0.1:${server.port}`, requestId, token: "" });
    client.log(`token=${TOKEN}`);
    client.log(`basic ${Buffer.from(`user:${TOKEN}`).toString("base64")}`);
    client.log(`url https://x:${encodeURIComponent(TOKEN)}@host`);
    for (const line of PEM.split("\n")) client.log(line);
    client.log("::add-mask::registered-at-run-time");
    client.log("later: registered-at-run-time", true);
    await client.end({ exitCode: 0, success: true, repoUrl: `https://ci:${TOKEN}@example.com/r.git`, commitSha: "" });
    await client.close();

    const lines = (await logs.read(requestId, 0, 100)).map((l) => l.line);
    expect(lines).toEqual([
      "token=***",
      expect.stringMatching(/^basic dXNlcj.{0,2}\*\*\*.{0,2}$/),
      "url https://x:***@host",
      "***",
      "***",
      "***",
      "::add-mask::***",
      "later: ***",
    ]);
    const result = queue.results.find((r) => r.requestId === requestId)!;
    expect(result.repoUrl).toBe("https://ci:***@example.com/r.git");
    // Nothing the store keeps (its state files included) holds a declared value.
    const files = await readdir(path.join(dir, "logs"), { recursive: true, withFileTypes: true });
    for (const f of files.filter((e) => e.isFile())) {
      const text = await readFile(path.join(f.parentPath, f.name), "utf8");
      expect(text.includes(TOKEN), f.name).toBe(false);
      expect(text.includes("MIIBOgIBAAJBAKj34GkxFhD9"), f.name).toBe(false);
    }
    const state = await logs.get(requestId);
    expect(state!.info.repoUrl).toBe("https://ci:***@example.com/r.git");
    expect(JSON.stringify(state)).not.toContain(TOKEN);
  });

  it("the service registers at most 1,024 ::add-mask:: values a job beyond the declared ones; every command line stays masked", async () => {
    const requestId = randomUUID();
    await runner.expectJob(requestId, { secrets: [TOKEN] });
    const client = createRunnerClient({ endpoint: `http://127.0.0.1:${server.port}`, requestId, token: "" });
    for (let i = 0; i <= 1_024; i++) client.log(`::add-mask::run-time-value-${String(i).padStart(4, "0")}`);
    client.log("first run-time-value-0000 last run-time-value-1024 declared " + TOKEN);
    await client.end({ exitCode: 0, success: true, repoUrl: "", commitSha: "" });
    await client.close();
    const lines = (await logs.read(requestId, 0, 2_000)).map((l) => l.line);
    expect(lines.slice(0, 1_025).every((l) => l === "::add-mask::***")).toBe(true);
    // The 1,025th value is over the service's bound: only an agent that masks would hide it.
    expect(lines[1_025]).toBe("first *** last run-time-value-1024 declared ***");
  });

  it("the service holds at most 8 MiB of forms of ::add-mask:: values a job, however they are crafted", async () => {
    const requestId = randomUUID();
    await runner.expectJob(requestId, { secrets: [TOKEN] });
    const client = createRunnerClient({ endpoint: `http://127.0.0.1:${server.port}`, requestId, token: "" });
    // Each ~4 KiB value's every encoding differs (~600 KiB of forms): 20 of them are 80 KiB of values, under the
    // 1,024 values and 256 KiB, but over 8 MiB of forms from the 14th on.
    // A distinct start each: values sharing a long prefix would make the scan's compares blow its budget, and the
    // whole line would be masked (fail closed), which would hide what this test looks for.
    const value = (i: number) => `v${String(i).padStart(2, "0")}:${"\x1f".repeat(4_000)} ~*/é<`;
    for (let i = 0; i < 20; i++) client.log(`::add-mask::${value(i)}`);
    client.log(`first ${value(0)} last ${value(19)} declared ${TOKEN}`);
    await client.end({ exitCode: 0, success: true, repoUrl: "", commitSha: "" });
    await client.close();
    const lines = (await logs.read(requestId, 0, 100)).map((l) => l.line);
    expect(lines.slice(0, 20).every((l) => l === "::add-mask::***")).toBe(true);
    expect(lines[20]).toBe(`first *** last ${value(19)} declared ***`);
  });
});

describe("the server-wide bound on ::add-mask:: forms", () => {
  // Each value's every encoding differs (~600 KiB of forms, as above): 3 fit in 2 MiB, a 4th does not.
  const value = (i: number) => `w${String(i).padStart(2, "0")}:${"\x1f".repeat(4_000)} ~*/é<`;
  const warnings: Record<string, unknown>[] = [];
  const logger: Logger = {
    child: () => logger,
    debug: () => undefined,
    info: () => undefined,
    warn: (fields: unknown) => void warnings.push(fields as Record<string, unknown>),
    error: () => undefined,
  };
  let bounded: RunnerService;
  let boundedServer: RunnerServer;
  let boundedLogs: JobLogStore;

  beforeAll(async () => {
    boundedLogs = createFsLogStore(path.join(dir, "bounded-logs"), { fsync: false });
    bounded = createRunnerService(createMemoryQueue(), {
      logs: boundedLogs,
      logger,
      limits: { addMaskFormBytes: 2 * 1024 * 1024 },
    });
    boundedServer = await startRunnerServer(bounded, { port: 0 });
  });

  afterAll(async () => {
    await boundedServer?.close();
    await bounded?.close();
    await boundedLogs?.close?.();
  });

  const open = (requestId: string) =>
    createRunnerClient({ endpoint: `http://127.0.0.1:${boundedServer.port}`, requestId, token: "" });
  const linesOf = async (requestId: string) => (await boundedLogs.read(requestId, 0, 100)).map((l) => l.line);

  it("holds one job's values against another's until the first job's result is recorded, and says so", async () => {
    const [first, second] = [randomUUID(), randomUUID()];
    const a = open(first);
    // Job A takes the bound (3 values fit; the 4th is refused though A's own 8 MiB would take it).
    for (let i = 0; i < 4; i++) a.log(`::add-mask::${value(i)}`);
    a.log(`A: ${value(2)} | ${value(3)}`);
    await a.flush();
    expect((await linesOf(first))[4]).toBe(`A: *** | ${value(3)}`);
    // Job B, far under its own bound, is refused while A holds the server's; a value too short to register, and a
    // second refused one, are not told again: one warning a job.
    const b = open(second);
    b.log(`::add-mask::${value(10)}`);
    b.log(`B: ${value(10)}`);
    b.log("::add-mask::ab");
    b.log(`::add-mask::${value(12)}`);
    await b.flush();
    expect((await linesOf(second)).slice(0, 4)).toEqual([
      "::add-mask::***",
      `B: ${value(10)}`,
      "::add-mask::***",
      "::add-mask::***",
    ]);
    // A job whose value is refused for being short is not told about the server-wide bound.
    const c = open(randomUUID());
    c.log("::add-mask::ab");
    await c.flush();
    await c.close();
    expect(warnings.map((w) => w.requestId)).toEqual([first, second]);
    expect(warnings[1]).toMatchObject({ maxRegisteredBytes: 2 * 1024 * 1024 });
    // A's result is recorded: its share is given back, and B's next value is registered.
    await a.end({ exitCode: 0, success: true, repoUrl: "", commitSha: "" });
    await a.close();
    b.log(`::add-mask::${value(11)}`);
    b.log(`B: ${value(11)}`);
    await b.end({ exitCode: 0, success: true, repoUrl: "", commitSha: "" });
    await b.close();
    expect((await linesOf(second)).slice(4)).toEqual(["::add-mask::***", "B: ***"]);
    expect(warnings).toHaveLength(2);
  });

  it("gives back what a cancelled job's late lines register", async () => {
    const [cancelled, other] = [randomUUID(), randomUUID()];
    const a = open(cancelled);
    a.log("hello");
    // The call stays open and idle (no flush: that would end it) while the host cancels the job; its next lines
    // arrive after the result is recorded, on a call that read the job as open.
    await expect.poll(async () => (await linesOf(cancelled)).length).toBe(1);
    await bounded.cancelJob(cancelled);
    for (let i = 20; i < 23; i++) a.log(`::add-mask::${value(i)}`);
    await expect(a.flush()).rejects.toThrow(/cancelled/);
    await a.close();
    const b = open(other);
    b.log(`::add-mask::${value(30)}`);
    b.log(`B: ${value(30)}`);
    await b.end({ exitCode: 0, success: true, repoUrl: "", commitSha: "" });
    await b.close();
    expect((await linesOf(other)).slice(0, 2)).toEqual(["::add-mask::***", "B: ***"]);
  });
});
