/**
 * The runner client's runs of lines (docs/runner-protocol.md §2, "Runs of lines") against a scripted server over a
 * real HTTP/2 socket: the client sends a frame a line until an answer says `runner-accepts: runs`, then a `LogRun` a
 * pipe read's lines; it resumes at the first line of the run holding `runner-committed`; and when a call carrying
 * runs is refused INVALID_ARGUMENT (an older server behind the same endpoint), it sends every line not yet stored
 * again a frame each, and never runs again. The real server's side is in test/runner/server/runs.test.ts.
 */
import { randomUUID } from "node:crypto";
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { fromBinary } from "@bufbuild/protobuf";
import { afterEach, describe, expect, it } from "vitest";
import { LogItemSchema, type LogItem } from "../../../src/gen/runner/v1/runner_pb.js";
import { createRunnerClient, type RunnerClient } from "../../../src/runner/client/runner-client.js";
import { createMemoryLogStore } from "../../../src/adapters/memory/log-store.js";
import { createMemoryQueue } from "../../../src/adapters/memory/index.js";
import { createRunnerService } from "../../../src/runner/index.js";
import { startRunnerServer } from "../../../src/runner/server/start-server.js";
import { mintJobToken } from "../../../src/runner/protocol/token.js";
import { runJob } from "../../../src/runner/agent/run-job.js";

/** One call as the scripted server saw it. */
interface SeenCall {
  offset: number;
  items: LogItem[];
}

/** What the script answers a call with: a gRPC status, `runner-committed`, and whether to say it takes runs. */
interface Answer {
  status: number;
  committed: number;
  accepts?: boolean;
}

const open: Array<{ close(): Promise<void> }> = [];
afterEach(async () => {
  for (const x of open.splice(0).reverse()) await x.close();
});

/** A node:http2 server that reads each call whole, decodes its items with protobuf-es and answers as `script` says. */
async function scriptedServer(script: (call: SeenCall, index: number) => Answer) {
  const calls: SeenCall[] = [];
  const server = http2.createServer();
  const sessions = new Set<http2.ServerHttp2Session>();
  server.on("session", (s) => {
    sessions.add(s);
    s.on("close", () => sessions.delete(s));
  });
  server.on("stream", (stream, headers) => {
    const chunks: Buffer[] = [];
    stream.on("data", (d: Buffer) => chunks.push(d));
    stream.on("end", () => {
      const body = Buffer.concat(chunks);
      const items: LogItem[] = [];
      for (let at = 0; at < body.length;) {
        const len = body.readUInt32BE(at + 1);
        items.push(fromBinary(LogItemSchema, body.subarray(at + 5, at + 5 + len)));
        at += 5 + len;
      }
      const call = { offset: Number(headers["runner-offset"]), items };
      const answer = script(call, calls.push(call) - 1);
      const meta: http2.OutgoingHttpHeaders = {
        "grpc-status": String(answer.status),
        "runner-committed": String(answer.committed),
      };
      if (answer.status !== 0) meta["grpc-message"] = "refused by the script";
      if (answer.accepts === true) meta["runner-accepts"] = "runs";
      stream.respond({ ":status": 200, "content-type": "application/grpc" }, { waitForTrailers: true });
      stream.on("wantTrailers", () => stream.sendTrailers(meta));
      stream.end(answer.status === 0 ? Buffer.from([0, 0, 0, 0, 2, 0x08, 0x01]) : undefined);
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const handle = {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    calls,
    async close() {
      for (const s of sessions) s.destroy();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
  open.push(handle);
  return handle;
}

function track(client: RunnerClient): RunnerClient {
  open.push(client);
  return client;
}

/** The lines a call carried, item by item (a run's lines each an item), with the kind of frame each came in. */
function linesOf(call: SeenCall): { line: string; run: boolean }[] {
  return call.items.flatMap((item): { line: string; run: boolean }[] =>
    item.event.case === "log"
      ? [{ line: item.event.value.line, run: false }]
      : item.event.case === "run"
        ? item.event.value.lines.map((line) => ({ line, run: true }))
        : [],
  );
}

/** `n` lines from `from` on, each ended by a newline, as one pipe read. */
function read(from: number, n: number): Buffer {
  return Buffer.from(Array.from({ length: n }, (_, i) => `line ${from + i}\n`).join(""));
}

/** Items a call covers: its lines and its end. */
const itemsOf = (call: SeenCall) => linesOf(call).length + (call.items.some((i) => i.event.case === "end") ? 1 : 0);

describe("runs of lines, on the client", () => {
  it("sends a frame a line until the server says it takes runs, then a run a pipe read", async () => {
    const server = await scriptedServer((call) => ({
      status: 0,
      committed: call.offset + itemsOf(call),
      accepts: true,
    }));
    const client = track(createRunnerClient({ endpoint: server.url, requestId: randomUUID() }));
    const first = read(0, 5);
    expect(client.logLines!(first, 0, first.length, true, 1_700_000_000_123).next).toBe(first.length);
    await client.flush();
    const second = read(5, 300);
    client.logLines!(second, 0, second.length, true, 1_700_000_000_456);
    await client.end({ exitCode: 0, success: true });
    expect(server.calls).toHaveLength(2);
    expect(linesOf(server.calls[0]!).every((l) => !l.run)).toBe(true);
    expect(server.calls[1]!.offset).toBe(5);
    // One pipe read of 300 short lines: one run (a 64 KiB chunk holds them), then the end.
    expect(server.calls[1]!.items.map((i) => i.event.case)).toEqual(["run", "end"]);
    const run = server.calls[1]!.items[0]!.event;
    if (run.case !== "run") throw new Error("not a run");
    expect(run.value.stderr).toBe(true);
    expect(run.value.timeUnixNano).toBe(1_700_000_000_456_000_000n);
    const all = server.calls.flatMap((c) => linesOf(c).map((l) => l.line));
    expect(all).toEqual(Array.from({ length: 305 }, (_, i) => `line ${i}`));
  });

  it("keeps a job's first call short until a server has answered, so runs start within a few ms", async () => {
    for (const runs of [true, false]) {
      const server = await scriptedServer((call) => ({
        status: 0,
        committed: call.offset + itemsOf(call),
        accepts: true,
      }));
      const client = track(createRunnerClient({ endpoint: server.url, requestId: randomUUID(), runs }));
      // 2,000 frames of ~155 bytes (~310 KB) queued at once: one call of the default 4 MiB, unless the first is short.
      const first = Buffer.from(`${"x".repeat(99)}\n`.repeat(2000));
      client.logLines!(first, 0, first.length);
      await client.flush();
      const lines = server.calls.map((c) => linesOf(c).length);
      if (runs) {
        // 64 KiB of frames of 155 bytes: 422 fit, and a call always takes one more frame past what fits.
        expect(lines).toEqual([423, 1577]);
      } else expect(lines).toEqual([2000]);
      await client.end({ exitCode: 0, success: true });
    }
  });

  it("never sends runs with `runs: false`, nor to a server that does not say it takes them", async () => {
    for (const [accepts, runs] of [
      [true, false],
      [false, true],
    ] as const) {
      const server = await scriptedServer((call) => ({ status: 0, committed: call.offset + itemsOf(call), accepts }));
      const client = track(createRunnerClient({ endpoint: server.url, requestId: randomUUID(), runs }));
      for (let k = 0; k < 3; k++) {
        const buf = read(k * 50, 50);
        client.logLines!(buf, 0, buf.length);
        await client.flush();
      }
      await client.end({ exitCode: 0, success: true });
      expect(server.calls.length).toBeGreaterThanOrEqual(3);
      expect(server.calls.flatMap((c) => c.items).some((i) => i.event.case === "run")).toBe(false);
      expect(server.calls.flatMap((c) => linesOf(c).map((l) => l.line))).toEqual(
        Array.from({ length: 150 }, (_, i) => `line ${i}`),
      );
    }
  });

  it("resumes at the first line of the run holding runner-committed, the whole run again", async () => {
    // Call 0 (a frame a line) is stored; call 1 (a run of lines 3–102, the end not yet sent) fails UNAVAILABLE with
    // 40 of its lines stored; call 2 must start at 3 and carry the whole run again.
    const server = await scriptedServer((call, index) =>
      index === 1
        ? { status: 14, committed: 43, accepts: true }
        : { status: 0, committed: call.offset + itemsOf(call), accepts: true },
    );
    const client = track(
      createRunnerClient({ endpoint: server.url, requestId: randomUUID(), backoff: { initialMs: 1, maxMs: 5 } }),
    );
    const first = read(0, 3);
    client.logLines!(first, 0, first.length);
    await client.flush();
    const second = read(3, 100);
    client.logLines!(second, 0, second.length);
    await client.flush();
    await client.end({ exitCode: 0, success: true });
    expect(server.calls.map((c) => c.offset)).toEqual([0, 3, 3, 103]);
    expect(linesOf(server.calls[2]!).map((l) => l.line)).toEqual(
      Array.from({ length: 100 }, (_, i) => `line ${3 + i}`),
    );
    expect(server.calls[2]!.items.map((i) => i.event.case)).toEqual(["run"]);
    expect(server.calls[3]!.items.map((i) => i.event.case)).toEqual(["end"]);
  });

  it("re-splits after RESOURCE_EXHAUSTED from inside a run without sending the run's stored lines again", async () => {
    // A model store: the item at position p is stored when p is the next to store. With a line limit of 2,048 the
    // client's runs hold 6 lines of 300 bytes: 3–8, 9–14, … Call 1 (the runs of lines 3–22) stores up to 13 and fails;
    // call 2 (from 9, the start of the run holding 13) is refused RESOURCE_EXHAUSTED: the client re-encodes from 13
    // on, in runs held to the halved limit (1,024 bytes: at most 3 lines a run), and sends nothing before 13 again.
    const stored: string[] = [];
    const server = await scriptedServer((call, index) => {
      let pos = call.offset;
      const upTo = index === 1 ? 13 : index === 2 ? 0 : Infinity;
      for (const l of linesOf(call)) {
        if (pos >= upTo) break;
        if (pos === stored.length) stored.push(l.line);
        pos++;
      }
      const status = index === 1 ? 14 : index === 2 ? 8 : 0;
      return { status, committed: stored.length, accepts: true };
    });
    const client = track(
      createRunnerClient({
        endpoint: server.url,
        requestId: randomUUID(),
        maxLineBytes: 2048,
        backoff: { initialMs: 1, maxMs: 5 },
      }),
    );
    const line = (i: number) => `L${i} `.padEnd(300, "x");
    for (const lines of [
      Array.from({ length: 3 }, (_, i) => line(i)),
      Array.from({ length: 20 }, (_, i) => line(3 + i)),
    ]) {
      const buf = Buffer.from(lines.map((l) => `${l}\n`).join(""));
      client.logLines!(buf, 0, buf.length);
      await client.flush();
    }
    expect(server.calls.map((c) => c.offset)).toEqual([0, 3, 9, 13]);
    const runs = server.calls[3]!.items.map((i) => (i.event.case === "run" ? i.event.value.lines.length : 0));
    // Old runs 9–14 (from 13 on), 15–20 and 21–22, each re-framed on its own: 2, 3 + 3, 2 lines.
    expect(runs).toEqual([2, 3, 3, 2]);
    expect(linesOf(server.calls[3]!).map((l) => l.line)).toEqual(Array.from({ length: 10 }, (_, i) => line(13 + i)));
    expect(stored).toEqual(Array.from({ length: 23 }, (_, i) => line(i)));
  });

  it("goes back to a frame a line for good when a call with runs is refused INVALID_ARGUMENT", async () => {
    // An older replica takes call 1: it stores nothing of a run and refuses it, as a server without LogRun does.
    const server = await scriptedServer((call, index) =>
      index === 1
        ? { status: 3, committed: call.offset }
        : { status: 0, committed: call.offset + itemsOf(call), accepts: true },
    );
    const client = track(
      createRunnerClient({ endpoint: server.url, requestId: randomUUID(), backoff: { initialMs: 1, maxMs: 5 } }),
    );
    const first = read(0, 4);
    client.logLines!(first, 0, first.length);
    await client.flush();
    const second = read(4, 20);
    client.logLines!(second, 0, second.length);
    await client.flush();
    const third = read(24, 6);
    client.logLines!(third, 0, third.length);
    await client.end({ exitCode: 0, success: true });
    expect(server.calls[1]!.items.some((i) => i.event.case === "run")).toBe(true);
    // Every call after the refusal: a frame a line, though the server still says it takes runs.
    for (const call of server.calls.slice(2)) expect(call.items.some((i) => i.event.case === "run")).toBe(false);
    expect(server.calls[2]!.offset).toBe(4);
    const stored = [server.calls[0]!, ...server.calls.slice(2)].flatMap((c) => linesOf(c).map((l) => l.line));
    expect(stored).toEqual(Array.from({ length: 30 }, (_, i) => `line ${i}`));
  });

  const EMPTIES = 60_000;

  /**
   * A job of 4 lines, then 60,000 empty ones (2 bytes a line in runs, ~50 a frame a line) and `tail`, against a server
   * that stores 1,000 of the empty lines from call 1 (inside a run) and refuses it INVALID_ARGUMENT, as an older
   * replica refuses a run; `answer` may answer a later call otherwise. `spool`: the client's spool bytes when call
   * `sampleAt` arrived; `held`: before the empty lines.
   */
  async function refusedRunsJob(sampleAt: number, answer: (index: number, call: SeenCall) => Answer | null, tail = "") {
    let spool = -1;
    let client!: RunnerClient;
    const server = await scriptedServer((call, index) => {
      if (index === sampleAt) spool = client.stats.spoolBytes;
      if (index === 1) return { status: 3, committed: call.offset + 1_000 };
      return answer(index, call) ?? { status: 0, committed: call.offset + itemsOf(call), accepts: true };
    });
    client = track(
      createRunnerClient({ endpoint: server.url, requestId: randomUUID(), backoff: { initialMs: 1, maxMs: 5 } }),
    );
    const first = read(0, 4);
    client.logLines!(first, 0, first.length);
    await client.flush();
    const held = client.stats.spoolBytes;
    const rest = Buffer.concat([Buffer.alloc(EMPTIES, 0x0a), Buffer.from(tail)]);
    client.logLines!(rest, 0, rest.length);
    await client.end({ exitCode: 0, success: true });
    return { server, held, spool };
  }

  it("after runs are refused, sends a run's lines a frame each without growing the spool, from the stored one on", async () => {
    const { server, held, spool } = await refusedRunsJob(2, () => null);
    expect(linesOf(server.calls[1]!).every((l) => l.run)).toBe(true);
    // Every call after the refusal starts at the item stored last (inside a run) and sends a frame a line.
    expect(server.calls[2]!.offset).toBe(4 + 1_000);
    const after = server.calls.slice(2).flatMap((c) => linesOf(c));
    expect(after.every((l) => !l.run && l.line === "")).toBe(true);
    expect(after).toHaveLength(EMPTIES - 1_000);
    expect(server.calls.at(-1)!.items.at(-1)!.event.case).toBe("end");
    // The spool kept its runs (~2 bytes a line), not ~50 a line re-encoded: 60,000 lines are ~120 KB, not ~3 MB.
    expect(spool).toBeGreaterThan(held);
    expect(spool).toBeLessThan(4 * EMPTIES);
  });

  it("keeps refused runs as runs when RESOURCE_EXHAUSTED then halves the line limit", async () => {
    // As above, then call 2 (the first a frame a line) is refused RESOURCE_EXHAUSTED: the re-split keeps the runs
    // (split as sent), so the spool stays ~2 bytes an empty line rather than ~50.
    const resourceExhausted = (index: number, call: SeenCall) =>
      index === 2 ? { status: 8, committed: call.offset } : null;
    const { server, spool } = await refusedRunsJob(3, resourceExhausted, "line 1\nline 2\nline 3\n");
    expect(server.calls.map((c) => c.offset).slice(0, 4)).toEqual([0, 4, 1_004, 1_004]);
    const after = server.calls.slice(3).flatMap((c) => linesOf(c));
    expect(after.every((l) => !l.run)).toBe(true);
    expect(after.map((l) => l.line)).toEqual([
      ...Array<string>(EMPTIES - 1_000).fill(""),
      "line 1",
      "line 2",
      "line 3",
    ]);
    expect(spool).toBeGreaterThan(0);
    expect(spool).toBeLessThan(4 * EMPTIES);
  });
});

describe("runs of lines, the agent to the real server", () => {
  const SECRET = "runs-test-secret";
  const TOKEN = "tok_9f8e7d6c5b4a39281706";

  /** A real server on the memory store; runs taken unless `acceptRuns` is false (an older server's behaviour). */
  async function realServer(acceptRuns: boolean) {
    const logs = createMemoryLogStore();
    const queue = createMemoryQueue();
    const runner = createRunnerService(queue, { secret: SECRET, logs, acceptRuns });
    const server = await startRunnerServer(runner, { port: 0 });
    open.push({ close: () => server.close() });
    return { runner, server, logs, queue };
  }

  it("stores a job's every line once, in order, masked, whether the lines went in runs or a frame each", async () => {
    // 20,000 lines over many pipe reads and many calls of 64 KiB; every 5,000th line holds the job's declared secret (from it on, its pipe read goes a line at a time).
    const lines = 20_000;
    const script = `i=0; while [ $i -lt ${lines} ]; do if [ $((i % 5000)) -eq 0 ]; then echo "line $i key=${TOKEN}"; else echo "line $i"; fi; i=$((i+1)); done`;
    const want = Array.from({ length: lines }, (_, i) => (i % 5000 === 0 ? `line ${i} key=***` : `line ${i}`));
    for (const acceptRuns of [true, false]) {
      const { runner, server, logs, queue } = await realServer(acceptRuns);
      const requestId = randomUUID();
      await runner.expectJob(requestId, { secrets: [TOKEN] });
      const client = track(
        createRunnerClient({
          endpoint: server.url,
          requestId,
          token: mintJobToken(SECRET, requestId),
          maxCallBytes: 64 * 1024,
        }),
      );
      // The agent masks too; the service's own masking is what an agent that does not is held to (below).
      expect(await runJob(client, { command: "sh", args: ["-c", script], secrets: [TOKEN] })).toBe(0);
      const stored = await logs.read(requestId, 0, Number.MAX_SAFE_INTEGER);
      expect(stored.map((l) => l.line)).toEqual(want);
      expect(stored.every((l) => (l.time ?? 0) > 0 && l.serverTime !== true)).toBe(true);
      // Several calls (the job's lines: ~240 KB in runs, ~1.3 MB a frame a line; calls of 64 KiB).
      expect(client.stats.calls).toBeGreaterThanOrEqual(acceptRuns ? 4 : 15);
      if (acceptRuns) {
        // The first call went a frame a line; every later one in runs.
        expect(client.stats.linesInRuns).toBeGreaterThan(lines / 2);
        expect(client.stats.linesInRuns).toBeLessThan(lines);
      } else expect(client.stats.linesInRuns).toBe(0);
      expect(queue.results.find((r) => r.requestId === requestId)).toMatchObject({ lines: { stdout: lines } });
    }
  });

  it("the service masks lines of runs from an agent that does not mask", async () => {
    const { runner, server, logs } = await realServer(true);
    const requestId = randomUUID();
    await runner.expectJob(requestId, { secrets: [TOKEN] });
    const client = track(
      createRunnerClient({ endpoint: server.url, requestId, token: mintJobToken(SECRET, requestId) }),
    );
    const first = Buffer.from("warm-up line\n");
    client.logLines!(first, 0, first.length);
    await client.flush();
    // The secret whole in a line, and split across two lines of one run (the masker's multi-line rule is per value).
    const read = Buffer.from(`a ${TOKEN} b\nplain\n${TOKEN}${TOKEN}\n`);
    client.logLines!(read, 0, read.length);
    await client.end({ exitCode: 0, success: true });
    expect(client.stats.linesInRuns).toBe(3);
    const stored = (await logs.read(requestId, 0, 100)).map((l) => l.line);
    expect(stored).toEqual(["warm-up line", "a *** b", "plain", "***"]);
  });

  it("shrinks its runs with the line limit for a server with a small message limit", async () => {
    // A server that takes messages of 4 KiB at most: a 64 KiB run is refused RESOURCE_EXHAUSTED, and the client halves
    // its line limit, which caps its runs too, until they fit.
    const logs = createMemoryLogStore();
    const runner = createRunnerService(createMemoryQueue(), { secret: SECRET, logs, limits: { messageBytes: 4096 } });
    const server = await startRunnerServer(runner, { port: 0 });
    open.push({ close: () => server.close() });
    for (const runs of [false, true]) {
      const requestId = randomUUID();
      const client = track(
        createRunnerClient({
          endpoint: server.url,
          requestId,
          token: mintJobToken(SECRET, requestId),
          runs,
          backoff: { initialMs: 1, maxMs: 5 },
        }),
      );
      const want: string[] = [];
      for (let k = 0; k < 12; k++) {
        const lines = Array.from({ length: 100 }, (_, i) => `line ${k * 100 + i} `.padEnd(60, "x"));
        want.push(...lines);
        const buf = Buffer.from(lines.map((l) => `${l}\n`).join(""));
        client.logLines!(buf, 0, buf.length);
        await client.flush();
      }
      await client.end({ exitCode: 0, success: true });
      expect((await logs.read(requestId, 0, 10_000)).map((l) => l.line)).toEqual(want);
      if (runs) expect(client.stats.linesInRuns).toBeGreaterThan(600);
    }
  });
});
