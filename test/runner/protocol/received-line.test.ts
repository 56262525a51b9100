/**
 * A line the gRPC fast path keeps as bytes (runner/protocol/received-line.ts) keeps its request chunk alive
 * until it is stored, and a chunk is a view of the connection's whole socket read, which
 * may hold other streams' frames. Through a real HTTP/2 socket, a call's small lines share
 * reads with another stream's 15 KB frames: what the lines handed to the store pin stays
 * within 8 times the bytes the call sent (without the copy, ~16 KB a 130-byte line).
 */
import * as http2 from "node:http2";
import { randomUUID } from "node:crypto";
import { toBinary } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { LogItemSchema, type LogItem } from "../../../src/gen/runner/v1/runner_pb.js";
import { createMemoryLogStore, createMemoryQueue } from "../../../src/adapters/memory/index.js";
import { createRunnerService, startRunnerServer } from "../../../src/runner/index.js";
import type { JobLogStore } from "../../../src/runner/ports.js";
import { ReceivedLine, readsLineEntries } from "../../../src/runner/protocol/received-line.js";
import { EnvelopeSplitter } from "../../../src/runner/protocol/envelope-splitter.js";
import { end, line } from "../../fixtures/runner-service.js";

const PATH = "/runner.v1.Runner/StreamLogs";
const LINES = 200;

function frame(item: LogItem): Buffer {
  const bytes = toBinary(LogItemSchema, item);
  const out = Buffer.alloc(5 + bytes.length);
  out.writeUInt32BE(bytes.length, 1);
  out.set(bytes, 5);
  return out;
}

function open(session: http2.ClientHttp2Session) {
  const req = session.request({ ":method": "POST", ":path": PATH, "content-type": "application/grpc", te: "trailers" });
  req.on("error", () => undefined);
  let trailers: http2.IncomingHttpHeaders | null = null;
  req.on("trailers", (t) => (trailers = t));
  req.resume();
  const closed = new Promise<http2.IncomingHttpHeaders | null>((resolve) => req.once("close", () => resolve(trailers)));
  return { req, closed };
}

describe("runner fast path: what received lines pin", () => {
  it("lines sharing socket reads with another stream's frames pin at most 8x the bytes their call sent", async () => {
    const memory = createMemoryLogStore();
    const quietId = randomUUID();
    const pinned = new Set<ArrayBufferLike>();
    let handed = 0;
    // The memory store, noting the buffers behind the quiet call's lines as they are handed over.
    const logs: JobLogStore = Object.create(memory) as JobLogStore;
    logs.append = (requestId, at, entries, now) => {
      for (const entry of entries) {
        for (const stored of entry.stored) {
          if (requestId === quietId && stored instanceof ReceivedLine) {
            pinned.add(stored.buf.buffer);
            handed++;
          }
        }
      }
      return memory.append(requestId, at, entries, now);
    };
    // It reads entries by their fields only, like the memory store: marked, so it is handed
    // received lines (an unmarked store gets plain lines, which pin nothing).
    readsLineEntries(logs);
    const runner = createRunnerService(createMemoryQueue(), { logs });
    const server = await startRunnerServer(runner, { port: 0 });
    const session = http2.connect(server.url);
    session.on("error", () => undefined);
    try {
      const loudId = randomUUID();
      const quiet = open(session);
      const loud = open(session);
      let sent = 0;
      for (let i = 0; i < LINES; i++) {
        const small = frame(line(quietId, `quiet line ${i} ${"q".repeat(60)}`));
        sent += small.length;
        quiet.req.write(small);
        loud.req.write(frame(line(loudId, `${i} ${"l".repeat(15_000)}`)));
        // Let both writes go out together, as one read on the server.
        await new Promise((resolve) => setImmediate(resolve));
      }
      quiet.req.end(frame(end(quietId)));
      loud.req.end(frame(end(loudId)));
      expect(await quiet.closed).toMatchObject({ "grpc-status": "0", "runner-committed": String(LINES + 1) });
      expect(await loud.closed).toMatchObject({ "grpc-status": "0" });
      expect(handed).toBe(LINES);
      let pinnedBytes = 0;
      for (const buffer of pinned) pinnedBytes += buffer.byteLength;
      expect(pinnedBytes).toBeLessThanOrEqual(8 * sent);
    } finally {
      session.destroy();
      await server.close();
      await runner.close();
    }
  }, 60_000);

  it("a message split across reads is put together in a buffer of its own, not a slice of Node's shared 8 KiB pool", () => {
    // A 130-byte line cut in two: the splitter holds it; the emitted envelope's buffer is
    // what a ReceivedLine keeps alive until the line is stored.
    const whole = frame(line(randomUUID(), "y".repeat(90)));
    const splitter = new EnvelopeSplitter(1 << 20, 1 << 20);
    const emitted: Buffer[] = [];
    for (const part of [whole.subarray(0, 3), whole.subarray(3, 60), whole.subarray(60)]) {
      splitter.push(Buffer.from(part), (buf, start, end) => {
        expect(buf.subarray(start, end)).toEqual(whole);
        emitted.push(buf);
      });
    }
    expect(emitted).toHaveLength(1);
    // At most the splitter's smallest hold (256 bytes) or twice the envelope: never a pool slab.
    expect(emitted[0]!.buffer.byteLength).toBeLessThanOrEqual(Math.max(256, 2 * whole.length));
  });
});
