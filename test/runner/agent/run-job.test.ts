/**
 * runJob end to end: a real child process → runJob → createRunnerClient → HTTP/2 socket
 * → startRunnerServer → log store and queue. Also through a TCP proxy that cuts the
 * connection at 50 random points during one job.
 */
import { randomUUID } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createFsLogStore } from "../../../src/adapters/fs/index.js";
import { createMemoryQueue, type MemoryQueue } from "../../../src/adapters/memory/index.js";
import { runJob } from "../../../src/runner/agent/run-job.js";
import {
  createRunnerClient,
  type RunnerClient,
  type RunnerClientOptions,
} from "../../../src/runner/client/runner-client.js";
import { createLogItemEncoder, utf8Length } from "../../../src/runner/protocol/encoder.js";
import type { JobLogStore, StoredLine } from "../../../src/runner/ports.js";
import { createRunnerService, type RunnerService } from "../../../src/runner/index.js";
import { startRunnerServer, type RunnerServer } from "../../../src/runner/server/start-server.js";
import { mintJobToken } from "../../../src/runner/protocol/token.js";
// @ts-expect-error plain-JS fixture without types
import { isStderr, lineFor, TAIL } from "../../fixtures/runner-lines.mjs";

const fixtures = path.join(path.dirname(fileURLToPath(import.meta.url)), "..", "..", "fixtures");
const LINES_FIXTURE = path.join(fixtures, "runner-lines.mjs");
const BEHAVE_FIXTURE = path.join(fixtures, "runner-behave.mjs");
const SECRET = "agent-test-secret";
const lineOf = lineFor as (i: number) => string;
const stderrOf = isStderr as (i: number) => boolean;

let dir: string;
let queue: MemoryQueue;
let logs: JobLogStore;
let runner: RunnerService;
let server: RunnerServer;

beforeAll(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), "runner-depot-agent-"));
  queue = createMemoryQueue();
  logs = createFsLogStore(dir, { fsync: false });
  runner = createRunnerService(queue, { logs, secret: SECRET });
  server = await startRunnerServer(runner, { port: 0 });
});

afterAll(async () => {
  await server?.close();
  await runner?.close();
  await logs?.close?.();
  await rm(dir, { recursive: true, force: true });
});

function newClient(endpoint: string, extra: Partial<RunnerClientOptions> = {}) {
  const requestId = randomUUID();
  const client = createRunnerClient({ endpoint, requestId, token: mintJobToken(SECRET, requestId), ...extra });
  return { requestId, client };
}

/** Passes every call through and records the lines in the order runJob handed them over. */
function recording(client: RunnerClient) {
  const seen: StoredLine[] = [];
  /** The stamp runJob gave each line (when it read it from the pipe). */
  const times: (number | undefined)[] = [];
  const wrapped: RunnerClient = {
    log(line, stderr = false, time) {
      seen.push({ line, stderr });
      times.push(time);
      return client.log(line, stderr, time);
    },
    end: (e) => client.end(e),
    flush: () => client.flush(),
    drained: () => client.drained(),
    onStop: (cb) => client.onStop(cb),
    get stopped() {
      return client.stopped;
    },
    get stats() {
      return client.stats;
    },
    close: () => client.close(),
  };
  return { client: wrapped, seen, times };
}

function expectedLines(count: number, tail: boolean) {
  const out: StoredLine[] = [];
  const err: StoredLine[] = [];
  for (let i = 0; i < count; i++) (stderrOf(i) ? err : out).push({ line: lineOf(i), stderr: stderrOf(i) });
  if (tail) out.push({ line: TAIL as string, stderr: false });
  return { out, err };
}

async function stored(requestId: string): Promise<StoredLine[]> {
  return (await logs.read(requestId, 0, Number.MAX_SAFE_INTEGER)).map((l) => ({
    line: l.line,
    stderr: l.stderr,
    ...(l.marker ? { marker: true } : {}),
  }));
}

function resultsOf(requestId: string) {
  return queue.results.filter((r) => r.requestId === requestId);
}

describe("runJob through a real server", () => {
  it("streams 100,000 interleaved stdout/stderr lines in order, then exactly one result", async () => {
    const count = 100_000;
    const { requestId, client: real } = newClient(server.url);
    const { client, seen } = recording(real);
    const exitCode = await runJob(client, {
      command: process.execPath,
      args: [LINES_FIXTURE, String(count), "3", "--tail"],
      repoUrl: "https://git.example.com/app.git",
      commitSha: "abc123",
    });
    await real.close();
    expect(exitCode).toBe(3);

    const log = await stored(requestId);
    const { out, err } = expectedLines(count, true);
    // Within one pipe the order is the byte order the fixture wrote, so each stream must
    // match exactly. Across the two pipes no order can be guaranteed: the kernel buffers
    // each pipe separately and the agent reads whichever is readable first, so a stderr
    // line written after a stdout line may be read before it. What the agent can and
    // must guarantee is that the store holds exactly the order the agent observed.
    expect(log.length).toBe(count + 1);
    expect(log.filter((l) => !l.stderr)).toEqual(out);
    expect(log.filter((l) => l.stderr)).toEqual(err);
    expect(log).toEqual(seen);
    expect(log.some((l) => l.marker)).toBe(false);

    const results = resultsOf(requestId);
    expect(results).toHaveLength(1);
    expect(results[0]).toMatchObject({
      outcome: "finished",
      exitCode: 3,
      success: false,
      repoUrl: "https://git.example.com/app.git",
      commitSha: "abc123",
      lines: { stdout: out.length, stderr: err.length },
      logTruncated: false,
    });
  });

  it("survives a proxy cutting the connection at 50 random points: no line lost or duplicated, one result", async () => {
    const count = 20_000;
    // The frames of the job's items are a lower bound of the bytes the client must send,
    // so every cut point below it is reached before the job can end.
    const enc = createLogItemEncoder(randomUUID());
    let payload = 0;
    for (let i = 0; i < count; i++) payload += enc.logFrameSize(lineOf(i), utf8Length(lineOf(i)), stderrOf(i));
    const seed = Math.floor(Math.random() * 2 ** 31);
    const rand = mulberry32(seed);
    const points = Array.from({ length: 50 }, () => Math.floor(rand() * payload * 0.9)).sort((a, b) => a - b);
    // One cut in four drops the server's next bytes instead (a lost Ack or SETTINGS frame).
    const downCuts = new Set(points.filter(() => rand() < 0.25));
    const proxy = await startCuttingProxy(server.port, points, downCuts);
    try {
      const { requestId, client: real } = newClient(`http://127.0.0.1:${proxy.port}`, {
        maxCallBytes: 32 * 1024,
        backoff: { initialMs: 1, maxMs: 20 },
      });
      const { client, seen, times } = recording(real);
      const exitCode = await runJob(client, { command: process.execPath, args: [LINES_FIXTURE, String(count), "0"] });
      await real.close();
      // Every line kept the stamp the agent gave it when it read it from the pipe, through every replay.
      const kept = await logs.read(requestId, 0, Number.MAX_SAFE_INTEGER);
      expect(times.every((t) => t !== undefined && t > 0)).toBe(true);
      expect(
        kept.map((l) => [l.time, l.serverTime]),
        `seed ${seed}`,
      ).toEqual(times.map((t) => [t, undefined]));
      expect(exitCode, `seed ${seed}`).toBe(0);
      expect(proxy.cuts, `seed ${seed}`).toBe(50);
      expect(real.stats.retries, `seed ${seed}`).toBeGreaterThanOrEqual(50);

      const log = await stored(requestId);
      const { out, err } = expectedLines(count, false);
      expect(log.length, `seed ${seed}`).toBe(count);
      expect(log, `seed ${seed}`).toEqual(seen);
      expect(log.filter((l) => !l.stderr)).toEqual(out);
      expect(log.filter((l) => l.stderr)).toEqual(err);
      const results = resultsOf(requestId);
      expect(results).toHaveLength(1);
      expect(results[0]).toMatchObject({
        outcome: "finished",
        exitCode: 0,
        success: true,
        lines: { stdout: out.length, stderr: err.length },
      });
    } finally {
      await proxy.close();
    }
  });

  it("kills the job with SIGTERM when the host cancels it (Ack ok = false), and sends no end", async () => {
    const { requestId, client } = newClient(server.url, { maxCallMs: 30 });
    const job = runJob(client, { command: process.execPath, args: [BEHAVE_FIXTURE, "slow"], killGraceMs: 10_000 });
    await waitForCommitted(requestId, 5);
    await runner.cancelJob(requestId, "user pressed cancel");
    const exitCode = await job;
    expect(exitCode).toBe(128 + os.constants.signals.SIGTERM);
    expect(await client.stopped).toEqual({ reason: "cancelled" });
    await client.close();
    const results = resultsOf(requestId);
    expect(results).toHaveLength(1);
    expect(results[0]).toMatchObject({ outcome: "cancelled", exitCode: -1, success: false });
    const log = await stored(requestId);
    expect(log.length).toBeGreaterThanOrEqual(5);
    log.forEach((l, i) => expect(l).toEqual({ line: `tick ${i}`, stderr: false }));
  });

  it("escalates to SIGKILL when the job ignores SIGTERM", async () => {
    const { requestId, client } = newClient(server.url, { maxCallMs: 30 });
    const job = runJob(client, { command: process.execPath, args: [BEHAVE_FIXTURE, "stubborn"], killGraceMs: 300 });
    await waitForCommitted(requestId, 5);
    await runner.cancelJob(requestId);
    expect(await job).toBe(128 + os.constants.signals.SIGKILL);
    await client.close();
    expect(resultsOf(requestId)).toHaveLength(1);
  });

  it("reports 128 + signal number for a process killed by a signal", async () => {
    const { requestId, client } = newClient(server.url);
    const exitCode = await runJob(client, { command: process.execPath, args: [BEHAVE_FIXTURE, "self-kill"] });
    await client.close();
    expect(exitCode).toBe(128 + os.constants.signals.SIGKILL);
    expect(resultsOf(requestId)[0]).toMatchObject({ outcome: "finished", exitCode: 137, success: false });
    expect(await stored(requestId)).toEqual([{ line: "about to die", stderr: false }]);
  });

  it("onOutput echoes every line as stored, in bytes the caller may keep after the pipe's next read", async () => {
    const { requestId, client } = newClient(server.url);
    // ~490 KiB on stdout, a pipe read at a time (the reader's 64 KiB buffer is taken by each next read), and a line
    // on stderr; the buffers are read only once the job is over.
    const script = `for (let i = 0; i < 20000; i++) process.stdout.write("echo " + i + " " + "e".repeat(i % 40) + "\\n");
      console.error("to stderr");`;
    const kept: [Buffer, boolean][] = [];
    const exitCode = await runJob(client, {
      command: process.execPath,
      args: ["-e", script],
      onOutput: (bytes, stderr) => kept.push([bytes, stderr]),
    });
    expect(exitCode).toBe(0);
    await client.close();
    const log = await stored(requestId);
    const text = (err: boolean) =>
      kept
        .filter(([, stderr]) => stderr === err)
        .map(([b]) => b.toString("utf8"))
        .join("");
    expect(text(false)).toBe(
      log
        .filter((l) => !l.stderr)
        .map((l) => `${l.line}\n`)
        .join(""),
    );
    expect(text(true)).toBe("to stderr\n");
    expect(log.filter((l) => !l.stderr)).toHaveLength(20000);
    // Fewer calls than lines: a pipe read's lines come in one.
    expect(kept.length).toBeLessThan(1000);
  });

  it("replaces invalid UTF-8 with U+FFFD and passes valid text through", async () => {
    const { requestId, client } = newClient(server.url);
    expect(await runJob(client, { command: process.execPath, args: [BEHAVE_FIXTURE, "invalid-utf8"] })).toBe(0);
    await client.close();
    const decode = (bytes: number[]) => new TextDecoder().decode(Buffer.from(bytes));
    const log = await stored(requestId);
    const outLines = log.filter((l) => !l.stderr).map((l) => l.line);
    const errLines = log.filter((l) => l.stderr).map((l) => l.line);
    expect(outLines).toEqual([
      decode([0x66, 0x6f, 0xff, 0xfe, 0x6f]),
      decode([0xe2, 0x82, 0x21]),
      decode([0xc3, 0x28]),
    ]);
    expect(outLines[0]).toBe("fo\ufffd\ufffdo");
    expect(errLines).toEqual(["ok", decode([0xed, 0xa0, 0x80])]);
    for (const l of log) expect(Buffer.from(l.line, "utf8").toString("utf8")).toBe(l.line);
  });

  it("splits a line over the 64 KiB limit at a character boundary; the server stores no truncation marker", async () => {
    const { requestId, client } = newClient(server.url);
    expect(await runJob(client, { command: process.execPath, args: [BEHAVE_FIXTURE, "long-line"] })).toBe(0);
    await client.close();
    const original = "é😀abc".repeat(25_000);
    const log = await stored(requestId);
    expect(log.at(-1)).toEqual({ line: "after", stderr: false });
    const pieces = log.slice(0, -1);
    expect(pieces.length).toBe(Math.ceil(Buffer.byteLength(original) / (64 * 1024)));
    expect(pieces.map((p) => p.line).join("")).toBe(original);
    for (const p of pieces) {
      expect(p.marker).toBeUndefined();
      expect(Buffer.byteLength(p.line)).toBeLessThanOrEqual(64 * 1024);
    }
    expect(resultsOf(requestId)[0]!.lines).toEqual({ stdout: pieces.length + 1, stderr: 0 });
  });

  it("streams what a background process prints after the job's process exits, before the end", async () => {
    // The pipes are read by readPipe, not through the child's close: the end must still wait for every writer.
    const { requestId, client } = newClient(server.url);
    const command = "echo first; (sleep 0.3; echo late; sleep 0.1; echo late-err >&2) &";
    expect(await runJob(client, { command: "sh", args: ["-c", command] })).toBe(0);
    await client.close();
    expect(await stored(requestId)).toEqual([
      { line: "first", stderr: false },
      { line: "late", stderr: false },
      { line: "late-err", stderr: true },
    ]);
  });

  it("a command that cannot start ends with 127 and says why on stderr", async () => {
    const { requestId, client } = newClient(server.url);
    expect(await runJob(client, { command: path.join(fixtures, "no-such-program") })).toBe(127);
    await client.close();
    const log = await stored(requestId);
    expect(log).toHaveLength(1);
    expect(log[0]!.stderr).toBe(true);
    expect(log[0]!.line).toMatch(/cannot start .*no-such-program: .*ENOENT/);
    expect(resultsOf(requestId)[0]).toMatchObject({ exitCode: 127, success: false });
  });

  it("kills the job and rejects when the client gives up (wrong token: PERMISSION_DENIED)", async () => {
    const requestId = randomUUID();
    const client = createRunnerClient({
      endpoint: server.url,
      requestId,
      token: mintJobToken("other-secret", requestId),
    });
    await expect(
      runJob(client, { command: process.execPath, args: [BEHAVE_FIXTURE, "slow"], killGraceMs: 5000 }),
    ).rejects.toMatchObject({
      code: "PERMISSION_DENIED",
    });
    await client.close();
    expect(await logs.get(requestId)).toBeNull();
    expect(resultsOf(requestId)).toHaveLength(0);
  });
});

async function waitForCommitted(requestId: string, n: number) {
  for (;;) {
    const state = await logs.get(requestId);
    if (state && state.committed >= n) return;
    await new Promise((r) => setTimeout(r, 10));
  }
}

function mulberry32(seed: number) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * A TCP proxy that forwards to `targetPort` and cuts every connection (both sockets
 * destroyed) when the client-to-server byte count passes the next point; for points in
 * `downCuts` it instead drops the next server-to-client chunk and cuts there.
 */
async function startCuttingProxy(targetPort: number, points: number[], downCuts: Set<number>) {
  const pending = [...points];
  let upBytes = 0;
  let armed = 0;
  let cuts = 0;
  const sockets = new Set<net.Socket>();
  const server = net.createServer((down) => {
    const up = net.connect(targetPort, "127.0.0.1");
    sockets.add(down).add(up);
    const kill = () => {
      down.destroy();
      up.destroy();
    };
    down.on("data", (chunk: Buffer) => {
      if (pending.length > 0 && upBytes + chunk.length > pending[0]!) {
        const point = pending.shift()!;
        if (downCuts.has(point)) {
          armed++;
        } else {
          const keep = Math.max(0, point - upBytes);
          upBytes += keep;
          cuts++;
          up.write(chunk.subarray(0, keep));
          kill();
          return;
        }
      }
      upBytes += chunk.length;
      up.write(chunk);
    });
    up.on("data", (chunk: Buffer) => {
      if (armed > 0) {
        armed--;
        cuts++;
        kill();
        return;
      }
      down.write(chunk);
    });
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
    get cuts() {
      return cuts;
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}
