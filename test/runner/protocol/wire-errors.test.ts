/**
 * Issue 9, runner items 3 and 4: what a hostile sender's malformed requests are answered with,
 * on every protocol (raw node:http2 calls): the documented code, one line of text, and
 * nothing for the host's onError (a sender must not be able to flood the host's logs).
 */
import { randomUUID } from "node:crypto";
import { Code } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  createRunnerService,
  startRunnerServer,
  type RunnerServer,
  type RunnerService,
} from "../../../src/runner/index.js";
import { createMemoryQueue } from "../../../src/adapters/memory/index.js";
import { line, until } from "../../fixtures/runner-service.js";
import { connect, frame, openCall, PROTOCOLS } from "../../fixtures/runner-raw-calls.js";

/** A frame around raw message bytes, with flags. */
function rawFrame(payload: number[], flags = 0): Buffer {
  const out = Buffer.alloc(5 + payload.length);
  out[0] = flags;
  out.writeUInt32BE(payload.length, 1);
  out.set(payload, 5);
  return out;
}

const CASES: Array<{ name: string; bytes: (id: string) => Buffer; code: Code; text: RegExp }> = [
  {
    name: "a compressed flag without an encoding",
    bytes: (id) => Buffer.from(frame(line(id, "zipped?")).map((b, i) => (i === 0 ? 1 : b))),
    code: Code.InvalidArgument,
    text: /flagged compressed but the call names no encoding/,
  },
  // request_id (field 1, length-delimited) whose length varint never ends.
  {
    name: "a truncated varint",
    bytes: () => rawFrame([0x0a, 0x80]),
    code: Code.InvalidArgument,
    text: /^not a valid runner\.v1\.LogItem: /,
  },
  // log (field 2, a message) sent as a varint.
  {
    name: "a wrong wire type",
    bytes: () => rawFrame([0x12 & ~0x07, 0x01]),
    code: Code.InvalidArgument,
    text: /^not a valid runner\.v1\.LogItem: /,
  },
  {
    name: "invalid UTF-8",
    bytes: () => rawFrame([0x12, 0x04, 0x0a, 0x02, 0xff, 0x41]),
    code: Code.InvalidArgument,
    text: /^not a valid runner\.v1\.LogItem: /,
  },
];

/** A frame of `item` followed by an unknown field (number 15, length-delimited) of `size` bytes. */
function withUnknownField(item: Buffer, size: number): Buffer {
  const head: number[] = [(15 << 3) | 2];
  for (let v = size; ; v = Math.floor(v / 128)) {
    if (v < 0x80) {
      head.push(v);
      break;
    }
    head.push((v & 0x7f) | 0x80);
  }
  const message = Buffer.concat([item.subarray(5), Buffer.from(head), Buffer.alloc(size, 0x61)]);
  const out = Buffer.alloc(5);
  out.writeUInt32BE(message.length, 1);
  return Buffer.concat([out, message]);
}

describe("runner wire errors (issue 9, runner 4)", () => {
  const errors: unknown[] = [];
  let runner: RunnerService;
  let server: RunnerServer;
  beforeAll(async () => {
    runner = createRunnerService(createMemoryQueue(), { onError: (e) => errors.push(e) });
    server = await startRunnerServer(runner, { port: 0 });
  });
  afterAll(async () => {
    await server.close();
    await runner.close();
  });

  for (const protocol of Object.keys(PROTOCOLS)) {
    it(`${protocol}: a client that resets its stream mid-call is no fault of the server's: nothing for onError`, async () => {
      const session = connect(server.url);
      try {
        const id = randomUUID();
        const call = openCall(session, protocol, "any");
        call.stream.write(frame(line(id, "kept")));
        // Half a frame too, so the reader is holding bytes when the reset comes.
        call.stream.write(frame(line(id, "cut short")).subarray(0, 7));
        await until(async () => (await runner.logs.get(id))?.committed === 1, "the first item stored");
        call.stream.close(0x8 /* CANCEL */);
        await call.status;
        await until(() => runner.activeCalls === 0 && server.heldBytes === 0, "the call over");
        expect(errors).toEqual([]);
      } finally {
        session.destroy();
      }
    });

    for (const c of CASES) {
      it(`${protocol}: ${c.name} after a stored item → ${Code[c.code]}, one line, committed 1, nothing for onError`, async () => {
        const session = connect(server.url);
        try {
          const id = randomUUID();
          const call = openCall(session, protocol, "any");
          call.stream.write(frame(line(id, "kept")));
          await until(async () => (await runner.logs.get(id))?.committed === 1, "the first item stored");
          call.stream.end(c.bytes(id));
          const status = await call.status;
          expect(status.code).toBe(c.code);
          expect(status.message).toMatch(c.text);
          expect(status.message).not.toMatch(/[\r\n]/);
          expect(status.message.length).toBeLessThanOrEqual(250);
          expect(status.committed).toBe("1");
          expect((await runner.logs.read(id)).map((l) => l.line)).toEqual(["kept"]);
          expect(errors).toEqual([]);
        } finally {
          session.destroy();
        }
      });
    }

    it(`${protocol}: the message limit counts unknown fields (issue 9, runner 3): a valid item plus a 2 MiB unknown field → RESOURCE_EXHAUSTED, committed 1`, async () => {
      const session = connect(server.url);
      try {
        const id = randomUUID();
        const call = openCall(session, protocol, "any");
        // A small unknown field is skipped, as protobuf says; the item counts.
        call.stream.write(withUnknownField(frame(line(id, "kept")), 100));
        await until(async () => (await runner.logs.get(id))?.committed === 1, "the first item stored");
        call.stream.end(withUnknownField(frame(line(id, "smuggled")), 2 * 1024 * 1024));
        const status = await call.status;
        expect(status.code).toBe(Code.ResourceExhausted);
        expect(status.message).not.toMatch(/[\r\n]/);
        expect(status.committed).toBe("1");
        expect((await runner.logs.read(id)).map((l) => l.line)).toEqual(["kept"]);
        expect(errors).toEqual([]);
      } finally {
        session.destroy();
      }
    });

    it(`${protocol}: an encoding the server does not support (zstd) → UNIMPLEMENTED naming the supported ones, nothing for onError`, async () => {
      const session = connect(server.url);
      try {
        const id = randomUUID();
        const header = protocol === "connect" ? "connect-content-encoding" : "grpc-encoding";
        const call = openCall(session, protocol, "any", { [header]: "zstd" });
        call.stream.end(frame(line(id, "x")));
        const status = await call.status;
        expect(status.code).toBe(Code.Unimplemented);
        expect(status.message).toMatch(/zstd/);
        expect(status.message).not.toMatch(/[\r\n]/);
        expect(errors).toEqual([]);
      } finally {
        session.destroy();
      }
    });
  }
});
