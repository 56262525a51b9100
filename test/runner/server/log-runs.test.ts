/**
 * Runs of lines (`LogRun`, docs/runner-protocol.md §2, "Runs of lines") over a real HTTP/2
 * socket: each line is an item for positions (§4), stored exactly as if sent as a LogChunk;
 * a call may resume mid-run; an empty run and one over MAX_RUN_LINES are refused with the
 * items before kept; every answer carries `runner-accepts: runs` unless `acceptRuns` is
 * false, which plays a server built from the seed's proto; declared secrets are masked in a
 * run's lines; the connect path (Connect protocol, gzip gRPC) stores a run the same.
 */
import { randomUUID } from "node:crypto";
import * as http2 from "node:http2";
import { create, toBinary } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { compressionGzip, createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { LogItemSchema, Runner, type LogItem } from "../../../src/gen/runner/v1/runner_pb.js";
import { MAX_RUN_LINES } from "../../../src/runner/protocol/received-run.js";
import { msToNanos } from "../../../src/runner/protocol/line-time.js";
import { mintJobToken } from "../../../src/runner/protocol/token.js";
import { ACCEPTS_HEADER } from "../../../src/runner/service/runner-service.js";
import { end, line, send, startHarness, type Harness } from "../../fixtures/runner-service.js";

function run(requestId: string, lines: string[], stderr = false, time = 0): LogItem {
  return create(LogItemSchema, {
    requestId,
    event: { case: "run", value: { lines, stderr, timeUnixNano: msToNanos(time) } },
  });
}

const numbered = (from: number, to: number) => Array.from({ length: to - from }, (_, i) => `line ${from + i}`);

/** Sends `items` and returns the outcome with the answer's `runner-accepts` (trailer, or header when trailers-only). */
async function sendSeeing(
  h: Harness,
  items: LogItem[],
  options: { token?: string; offset?: number } = {},
): Promise<{ code: string | null; committed: string | null; accepts: string | null; message: string | null }> {
  let header: Headers | undefined;
  let trailer: Headers | undefined;
  const headers: Record<string, string> = {};
  if (options.token !== undefined) headers.authorization = `Bearer ${options.token}`;
  if (options.offset !== undefined) headers["runner-offset"] = String(options.offset);
  try {
    await h.client.streamLogs(
      (async function* () {
        yield* items;
      })(),
      { headers, onHeader: (x) => (header = x), onTrailer: (x) => (trailer = x) },
    );
    return {
      code: null,
      committed: trailer?.get("runner-committed") ?? null,
      accepts: accepts(header, trailer),
      message: null,
    };
  } catch (e) {
    const { ConnectError, Code } = await import("@connectrpc/connect");
    const error = ConnectError.from(e);
    return {
      code: Code[error.code]!,
      committed: error.metadata.get("runner-committed"),
      accepts: accepts(header, trailer) ?? error.metadata.get(ACCEPTS_HEADER),
      message: error.rawMessage,
    };
  }
}

function accepts(header?: Headers, trailer?: Headers): string | null {
  return trailer?.get(ACCEPTS_HEADER) ?? header?.get(ACCEPTS_HEADER) ?? null;
}

describe("runs of lines over a real socket", () => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness({ memoryStore: true });
  });
  afterAll(async () => h.close());

  it("a run is stored exactly: text, order, stream and times; time 0 gets the server's receive time, marked", async () => {
    const id = randomUUID();
    const texts = ["héllo wörld € 😀", "", 'say "hi"', "tab\tand\0nul", "x".repeat(300)];
    const before = Date.now();
    const first = await send(h.client, [run(id, texts, true, 1_700_000_000_123.456)]);
    expect(first).toMatchObject({ ok: true, committed: "5" });
    const second = await send(h.client, [run(id, ["a", "b"])], { offset: 5 });
    expect(second).toMatchObject({ ok: true, committed: "7" });
    const stored = await h.logs.read(id);
    expect(stored.map((l) => l.line)).toEqual([...texts, "a", "b"]);
    expect(stored.slice(0, 5).every((l) => l.stderr && l.time === 1_700_000_000_123.456 && !l.serverTime)).toBe(true);
    for (const l of stored.slice(5)) {
      expect(l.stderr).toBe(false);
      expect(l.serverTime).toBe(true);
      expect(l.time).toBeGreaterThanOrEqual(before);
      expect(l.time).toBeLessThanOrEqual(Date.now());
    }
  });

  it("a job mixing single LogChunks and runs stores every line in order, then its end", async () => {
    const id = randomUUID();
    const items = [
      line(id, "one"),
      run(id, ["two", "three"], true, 1_000),
      line(id, "four", false, 2_000),
      run(id, numbered(5, 105)),
      line(id, "last"),
      end(id, 0),
    ];
    const outcome = await send(h.client, items);
    expect(outcome).toMatchObject({ ok: true, committed: "106" });
    const stored = await h.logs.read(id);
    expect(stored.map((l) => l.line)).toEqual(["one", "two", "three", "four", ...numbered(5, 105), "last"]);
    expect(stored.map((l) => l.stderr).slice(0, 4)).toEqual([false, true, true, false]);
    expect(stored[1]!.time).toBe(1_000);
    expect(stored[3]!.time).toBe(2_000);
    expect(h.queue.results.some((r) => r.requestId === id)).toBe(true);
  });

  it("resume mid-run: a run of lines 5..14 at offset 5 after 10 stored skips 5..9 and stores 10..14", async () => {
    const id = randomUUID();
    expect(await send(h.client, [run(id, numbered(0, 10))])).toMatchObject({ ok: true, committed: "10" });
    const resumed = await send(h.client, [run(id, numbered(5, 15)), line(id, "line 15")], { offset: 5 });
    expect(resumed).toMatchObject({ ok: true, committed: "16" });
    expect((await h.logs.read(id)).map((l) => l.line)).toEqual(numbered(0, 16));
  });

  it("a gap (offset past the committed count) is still FAILED_PRECONDITION", async () => {
    const id = randomUUID();
    await send(h.client, [run(id, numbered(0, 3))]);
    const gap = await send(h.client, [run(id, numbered(4, 8))], { offset: 4 });
    expect(gap).toMatchObject({ code: "FailedPrecondition", committed: "3" });
    expect((await h.logs.read(id)).map((l) => l.line)).toEqual(numbered(0, 3));
  });

  it("an empty run and one over MAX_RUN_LINES are INVALID_ARGUMENT, the items before them kept", async () => {
    for (const [lines, why] of [
      [[], "a run must hold at least one line"],
      [numbered(0, MAX_RUN_LINES + 1), `a run of ${MAX_RUN_LINES + 1} lines is over the ${MAX_RUN_LINES}-line limit`],
    ] as const) {
      const id = randomUUID();
      const outcome = await sendSeeing(h, [
        line(id, "kept"),
        run(id, ["kept too"]),
        run(id, [...lines]),
        line(id, "never"),
      ]);
      expect(outcome).toMatchObject({ code: "InvalidArgument", committed: "2", accepts: "runs" });
      expect(outcome.message).toContain(why);
      expect((await h.logs.read(id)).map((l) => l.line)).toEqual(["kept", "kept too"]);
    }
    // A run of exactly MAX_RUN_LINES is taken; as a first item too (an empty first run is refused as well).
    const id = randomUUID();
    expect(await send(h.client, [run(id, numbered(0, MAX_RUN_LINES))])).toMatchObject({
      ok: true,
      committed: `${MAX_RUN_LINES}`,
    });
    const emptyFirst = await send(h.client, [run(randomUUID(), [])]);
    expect(emptyFirst).toMatchObject({ code: "InvalidArgument", committed: "0" });
  });

  it("every answer carries runner-accepts: runs (an Ack, an error, a call of no items)", async () => {
    const id = randomUUID();
    expect(await sendSeeing(h, [run(id, ["a"])])).toMatchObject({ code: null, accepts: "runs" });
    expect(await sendSeeing(h, [])).toMatchObject({ code: null, accepts: "runs" });
    expect(await sendSeeing(h, [line("not-a-uuid", "a")])).toMatchObject({ code: "InvalidArgument", accepts: "runs" });
  });

  it("a run of raw frames in odd encodings (left to protobuf-es) is stored the same; two runs in one frame burst", async () => {
    const id = randomUUID();
    const idField = Buffer.concat([Buffer.from([0x0a, 36]), Buffer.from(id)]);
    // Time repeated (protobuf-es: the last wins) and lines after stderr: the fast decoder declines it.
    const time = Buffer.alloc(8);
    time.writeBigUInt64LE(msToNanos(5_000));
    const inner = Buffer.concat([
      Buffer.from([0x19]),
      Buffer.alloc(8),
      Buffer.from([0x10, 1, 0x0a, 1, 0x61, 0x19]),
      time,
      Buffer.from([0x0a, 0]),
      Buffer.from([0x0a, 2, 0xc3, 0xa9]),
    ]);
    const odd = Buffer.concat([idField, Buffer.from([0x22, inner.length]), inner]);
    const plain = Buffer.from(toBinary(LogItemSchema, run(id, ["d", "e"])));
    const frames = Buffer.concat([odd, plain].map((m) => Buffer.concat([Buffer.from([0, 0, 0, 0, m.length]), m])));
    const session = http2.connect(h.server.url);
    try {
      const req = session.request({
        ":method": "POST",
        ":path": "/runner.v1.Runner/StreamLogs",
        "content-type": "application/grpc",
        te: "trailers",
      });
      let trailers: http2.IncomingHttpHeaders = {};
      req.on("trailers", (t) => (trailers = t));
      req.resume();
      const closed = new Promise((r) => req.once("close", r));
      req.end(frames);
      await closed;
      expect(trailers).toMatchObject({ "grpc-status": "0", "runner-committed": "5", "runner-accepts": "runs" });
    } finally {
      session.destroy();
    }
    const stored = await h.logs.read(id);
    expect(stored.map((l) => [l.line, l.stderr, l.time])).toEqual([
      ["a", true, 5_000],
      ["", true, 5_000],
      ["é", true, 5_000],
      ["d", false, stored[3]!.time],
      ["e", false, stored[4]!.time],
    ]);
    expect(stored[3]!.serverTime).toBe(true);
  });

  it("through the connect path (Connect protocol, gzip-compressed gRPC) a run is stored the same", async () => {
    const transports = {
      connect: createConnectTransport({ baseUrl: h.server.url, httpVersion: "2" }),
      gzip: createGrpcTransport({ baseUrl: h.server.url, sendCompression: compressionGzip, compressMinBytes: 0 }),
    };
    for (const [name, transport] of Object.entries(transports)) {
      const client = createClient(Runner, transport);
      const id = randomUUID();
      const texts = ["héllo", "", "x".repeat(2_000), "last"];
      expect(await send(client, [line(id, "first"), run(id, texts, true, 7_000)]), name).toMatchObject({
        ok: true,
        committed: "5",
      });
      const resumed = await send(client, [run(id, ["last", "new"], false, 8_000)], { offset: 4 });
      expect(resumed, name).toMatchObject({ ok: true, committed: "6" });
      // After a first item: refused with the items before it stored.
      const tooMany = await send(client, [line(id, "kept"), run(id, numbered(0, MAX_RUN_LINES + 1))], { offset: 6 });
      expect(tooMany, name).toMatchObject({ code: "InvalidArgument", committed: "7" });
      // As the first message: uncompressed, refused as it arrives, before protobuf-es makes a string a line and before
      // the call is authenticated, so no job is named yet (no runner-committed), as for any first message refused so;
      // compressed, its token is checked before it is inflated (firstMessageGate), so the service refuses it.
      const first = await send(client, [run(id, numbered(0, MAX_RUN_LINES + 1))], { offset: 7 });
      expect(first, name).toMatchObject({ code: "InvalidArgument", committed: name === "gzip" ? "7" : null });
      expect(String(first.error), name).toContain(`over the ${MAX_RUN_LINES}-line limit`);
      const stored = await h.logs.read(id);
      expect(
        stored.map((l) => l.line),
        name,
      ).toEqual(["first", ...texts, "new", "kept"]);
      expect(
        stored.slice(1, 5).every((l) => l.stderr && l.time === 7_000),
        name,
      ).toBe(true);
      expect([stored[5]!.stderr, stored[5]!.time], name).toEqual([false, 8_000]);
    }
  });
});

describe("runs: the answer on an error before the job is known, and declared secrets", () => {
  const secret = "log-runs-secret";
  const TOKEN = "ghp_declaredSecretValue0123456789";
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness({ memoryStore: true, secret });
  });
  afterAll(async () => h.close());

  it("no token (UNAUTHENTICATED) and a wrong one (PERMISSION_DENIED): the answer still says runner-accepts: runs", async () => {
    const id = randomUUID();
    const wrong = await sendSeeing(h, [run(id, ["a", "b"])], { token: mintJobToken("another-key", id) });
    expect(wrong.code).toBe("PermissionDenied");
    expect(wrong.accepts).toBe("runs");
    const none = await sendSeeing(h, [run(id, ["a"])]);
    expect(none.code).toBe("Unauthenticated");
    expect(none.accepts).toBe("runs");
    expect(await h.logs.read(id)).toEqual([]);
  });

  it("a secret declared for the job is masked in the lines of a run", async () => {
    const id = randomUUID();
    await h.runner.expectJob(id, { secrets: [TOKEN] });
    const outcome = await send(h.client, [run(id, [`token=${TOKEN}`, "plain", `${TOKEN} and ${TOKEN}`])], {
      token: mintJobToken(secret, id),
    });
    expect(outcome).toMatchObject({ ok: true, committed: "3" });
    expect((await h.logs.read(id)).map((l) => l.line)).toEqual(["token=***", "plain", "*** and ***"]);
  });
});

describe("acceptRuns: false plays a server built from the seed's proto", () => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness({ memoryStore: true, acceptRuns: false });
  });
  afterAll(async () => h.close());

  it("no runner-accepts; a run is INVALID_ARGUMENT as an item with no event, the items before it stored", async () => {
    const id = randomUUID();
    const ok = await sendSeeing(h, [line(id, "a")]);
    expect(ok).toMatchObject({ code: null, committed: "1", accepts: null });
    const refused = await sendSeeing(h, [line(id, "b"), run(id, ["c", "d"]), line(id, "e")], { offset: 1 });
    expect(refused).toMatchObject({ code: "InvalidArgument", committed: "2", accepts: null });
    expect(refused.message).toBe("an item must carry a log line or the job end");
    const first = await sendSeeing(h, [run(id, ["c"])], { offset: 2 });
    expect(first).toMatchObject({ code: "InvalidArgument", committed: "2", accepts: null });
    expect((await h.logs.read(id)).map((l) => l.line)).toEqual(["a", "b"]);
  });
});
