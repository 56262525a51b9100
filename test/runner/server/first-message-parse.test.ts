/**
 * What a first message costs the server before its call is authenticated, when protobuf-es decodes it (an encoding the
 * fast decoder leaves to it, or the connect path), over real HTTP/2 sockets: unknown fields are dropped as read (each
 * kept was an object: ~10 MB of heap for 128 KiB of them, held while a slow `authorize` hook ran), and a run over
 * MAX_RUN_LINES is refused before it is parsed (a string a line). docs/runner-protocol.md §7.
 */
import { randomUUID } from "node:crypto";
import * as http2 from "node:http2";
import v8 from "node:v8";
import vm from "node:vm";
import { afterEach, describe, expect, it } from "vitest";
import { fromBinary } from "@bufbuild/protobuf";
import { LogItemSchema } from "../../../src/gen/runner/v1/runner_pb.js";
import { MAX_RUN_LINES } from "../../../src/runner/protocol/received-run.js";
import { startHarness, type Harness } from "../../fixtures/runner-service.js";

v8.setFlagsFromString("--expose-gc");
const gc = vm.runInNewContext("gc") as () => void;

const open: Harness[] = [];
afterEach(async () => {
  for (const h of open.splice(0)) await h.close();
});

/** A gRPC frame of a LogItem: the request ID, then `body` (its other fields, as bytes). */
function frame(requestId: string, body: Buffer): Buffer {
  const msg = Buffer.concat([Buffer.from([0x0a, requestId.length]), Buffer.from(requestId), body]);
  const prefix = Buffer.alloc(5);
  prefix.writeUInt32BE(msg.length, 1);
  return Buffer.concat([prefix, msg]);
}

/** A gRPC frame of a LogItem in JSON (`application/grpc+json`). */
function jsonFrame(item: object): Buffer {
  const msg = Buffer.from(JSON.stringify(item));
  const prefix = Buffer.alloc(5);
  prefix.writeUInt32BE(msg.length, 1);
  return Buffer.concat([prefix, msg]);
}

/**
 * Opens a StreamLogs call with a made-up token and sends `data`, ending the request when `end`; resolves, once the call
 * closes, with the answer's metadata (headers and trailers merged).
 */
function call(
  session: http2.ClientHttp2Session,
  data: Buffer,
  end = false,
  contentType = "application/grpc",
): Promise<http2.IncomingHttpHeaders> {
  const req = session.request({
    ":method": "POST",
    ":path": "/runner.v1.Runner/StreamLogs",
    "content-type": contentType,
    te: "trailers",
    authorization: "Bearer made-up",
  });
  const meta: http2.IncomingHttpHeaders = {};
  req.on("response", (x) => Object.assign(meta, x));
  req.on("trailers", (x) => Object.assign(meta, x));
  req.on("error", () => undefined);
  req.resume();
  if (end) req.end(data);
  else req.write(data);
  return new Promise((resolve) => req.once("close", () => resolve(meta)));
}

/** A server whose `authorize` hook holds every call until `release()`; `waiting()`: calls the hook holds. */
async function heldHarness(): Promise<{ h: Harness; waiting: () => number; release: () => void }> {
  let waiting = 0;
  let release!: () => void;
  const released = new Promise<void>((r) => (release = r));
  const h = await startHarness({
    memoryStore: true,
    authorize: async () => {
      waiting++;
      await released;
      throw new Error("refused");
    },
  });
  open.push(h);
  return { h, waiting: () => waiting, release };
}

/** The answer to a first message of `body` (after a request ID) with a made-up token, on a server of its own. */
async function answerTo(body: Buffer): Promise<http2.IncomingHttpHeaders> {
  const h = await startHarness({ memoryStore: true, secret: "first-message-secret" });
  open.push(h);
  const session = http2.connect(h.server.url);
  try {
    return await call(session, frame(randomUUID(), body), true);
  } finally {
    session.destroy();
  }
}

describe("a first message decoded by protobuf-es, before its call is authenticated", () => {
  it("holds no object per unknown field while a slow authorize hook runs", async () => {
    const { h, waiting, release } = await heldHarness();
    // 120 KiB of unknown varint fields (field 5, value 0): 61,440 of them, then no event.
    const unknown = frame(randomUUID(), Buffer.alloc(120 * 1024, 0).fill(Buffer.from([0x28, 0x00])));
    const calls = 100;
    const session = http2.connect(h.server.url);
    try {
      gc();
      const before = process.memoryUsage().heapUsed;
      const statuses = Array.from({ length: calls }, () => call(session, unknown));
      for (let i = 0; i < 500 && waiting() < calls; i++) await new Promise((r) => setTimeout(r, 20));
      expect(waiting()).toBe(calls);
      gc();
      const grown = process.memoryUsage().heapUsed - before;
      // Kept as objects, the fields were ~9.6 MB a call (~960 MB here); dropped, the call holds its bytes (off-heap).
      console.log(`heap held by ${calls} calls waiting on the hook: ${(grown / 1e6).toFixed(1)} MB`);
      expect(grown).toBeLessThan(calls * 400 * 1024);
      release();
      // PERMISSION_DENIED (7): the hook's refusal, each call answered.
      expect(new Set((await Promise.all(statuses)).map((m) => m["grpc-status"]))).toEqual(new Set(["7"]));
    } finally {
      release();
      session.destroy();
    }
  });

  it("refuses a run over the line bound in an encoding left to protobuf-es before it parses it", async () => {
    // 5,000 empty lines with the stream flag repeated (the fast decoder declines it: protobuf-es's, last one wins).
    const lines = Buffer.alloc((MAX_RUN_LINES + 904) * 2).fill(Buffer.from([0x0a, 0x00]));
    const inner = Buffer.concat([Buffer.from([0x10, 1, 0x10, 0]), lines]);
    const varint = [(inner.length & 0x7f) | 0x80, inner.length >> 7];
    const meta = await answerTo(Buffer.concat([Buffer.from([0x22, ...varint]), inner]));
    // INVALID_ARGUMENT (3) before the token is looked at (a wrong one would be PERMISSION_DENIED).
    expect(meta["grpc-status"]).toBe("3");
    expect(decodeURIComponent(String(meta["grpc-message"]))).toContain(
      `a run of 5000 lines is over the ${MAX_RUN_LINES}-line limit`,
    );
    expect(meta["runner-committed"]).toBeUndefined();
  });

  it("refuses runs whose lines run on past their run (which protobuf-es would read) before it parses them", async () => {
    // 10,000 runs of 2 bytes, each a line field whose length (2) runs on past its run into the next 2 bytes:
    // protobuf-es reads a line from each and merges the runs (10,000 strings); the strict count refuses it unparsed.
    const body = Buffer.alloc(10_000 * 6).fill(Buffer.from([0x22, 0x02, 0x0a, 0x02, 0x41, 0x41]));
    expect(fromBinary(LogItemSchema, body).event).toMatchObject({ case: "run", value: { lines: { length: 10_000 } } });
    const meta = await answerTo(body);
    expect(meta["grpc-status"]).toBe("3");
    expect(decodeURIComponent(String(meta["grpc-message"]))).toContain("a field runs on past the end of its message");
  });

  it("refuses lines hidden from the count by a wire type protobuf-es does not check, before the token is looked at", async () => {
    // protobuf-es reads a known field as its declared kind whatever wire type its tag names; a count that trusted the
    // tag walked those bytes otherwise, and 10,000 lines reached the token check (and a slow hook) uncounted.
    const lines = Buffer.alloc(10_000 * 2).fill(Buffer.from([0x0a, 0x00]));
    const lengthOf = (n: number): number[] => (n < 0x80 ? [n] : [(n & 0x7f) | 0x80, ...lengthOf(n >>> 7)]);
    const inRun = (inner: Buffer) => Buffer.concat([Buffer.from([0x22, ...lengthOf(inner.length)]), inner]);
    // A LogChunk whose line runs 4 bytes past it, over an unknown field's tag and length (0x2a, [0xc2, 0xa0, 0x01]:
    // 20,546 bytes; as text "*", U+00A0, U+0001), so protobuf-es lands on the run that unknown field holds.
    const hidden = inRun(Buffer.alloc(20_546 - 4).fill(Buffer.from([0x0a, 0x00])));
    const bodies = {
      "lines tagged as varints": inRun(Buffer.alloc(10_000 * 2).fill(Buffer.from([0x08, 0x00]))),
      "the run tagged as a varint": Buffer.concat([Buffer.from([0x20, ...lengthOf(lines.length)]), lines]),
      "lines inside a stderr tagged as length-delimited": inRun(
        Buffer.concat([Buffer.from([0x12, ...lengthOf(lines.length)]), lines]),
      ),
      "a run behind a log line that runs past its LogChunk": Buffer.concat([
        Buffer.from([0x12, 0x02, 0x0a, 0x04, 0x2a, 0xc2, 0xa0, 0x01]),
        hidden,
      ]),
    };
    for (const [what, body] of Object.entries(bodies)) {
      const item = fromBinary(LogItemSchema, Buffer.concat([Buffer.from([0x0a, 36]), Buffer.from(randomUUID()), body]));
      expect(item.event.case === "run" && item.event.value.lines.length, what).toBeGreaterThan(MAX_RUN_LINES);
      const meta = await answerTo(body);
      // INVALID_ARGUMENT (3) on its bytes; the token was never looked at (a made-up one is PERMISSION_DENIED, 7).
      expect(meta["grpc-status"], what).toBe("3");
      expect(decodeURIComponent(String(meta["grpc-message"])), what).toContain("not a valid runner.v1.LogItem");
      expect(meta["runner-committed"], what).toBeUndefined();
    }
  });

  it("refuses a JSON message with more values than a run's lines before it parses it, and holds nothing", async () => {
    const { h, waiting, release } = await heldHarness();
    // 24,000 distinct two-character lines in 120 KiB: parsed, a string a line (~325 KB of heap a call, held while
    // the hook ran).
    const lines = Array.from({ length: 24_000 }, (_, i) => (i % 1000).toString(36).padStart(2, "0"));
    const big = jsonFrame({ requestId: randomUUID(), run: { lines } });
    const calls = 40;
    const session = http2.connect(h.server.url);
    try {
      gc();
      const before = process.memoryUsage().heapUsed;
      let answered = 0;
      // Half of them spell the content type in capitals, which connect reads as JSON too.
      const pending = Array.from({ length: calls }, (_, i) =>
        call(session, big, false, i % 2 === 0 ? "application/grpc+json" : "application/grpc+JSON").finally(
          () => answered++,
        ),
      );
      // Until every call is answered, or the hook holds them all (as it did: parsed, each held its lines).
      for (let i = 0; i < 250 && answered + waiting() < calls; i++) await new Promise((r) => setTimeout(r, 20));
      gc();
      const grown = process.memoryUsage().heapUsed - before;
      console.log(`heap with ${calls} JSON runs of 24,000 lines sent: ${(grown / 1e6).toFixed(1)} MB`);
      // Refused INVALID_ARGUMENT (3) on their bytes: the hook never saw them, and nothing of them is held.
      expect(waiting()).toBe(0);
      expect(grown).toBeLessThan(calls * 100 * 1024);
      const answers = await Promise.all(pending);
      expect(new Set(answers.map((m) => m["grpc-status"]))).toEqual(new Set(["3"]));
      expect(decodeURIComponent(String(answers[0]!["grpc-message"]))).toContain(
        `(a run at most ${MAX_RUN_LINES} lines)`,
      );
      expect(answers[0]!["runner-committed"]).toBeUndefined();
      // A run of MAX_RUN_LINES lines in JSON passes the count: it reaches the hook (PERMISSION_DENIED once released).
      const full = jsonFrame({ requestId: randomUUID(), run: { lines: lines.slice(0, MAX_RUN_LINES), stderr: true } });
      const answer = call(session, full, false, "application/grpc+json");
      for (let i = 0; i < 250 && waiting() < 1; i++) await new Promise((r) => setTimeout(r, 20));
      expect(waiting()).toBe(1);
      release();
      expect((await answer)["grpc-status"]).toBe("7");
    } finally {
      release();
      session.destroy();
    }
  });
});
