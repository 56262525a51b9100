/**
 * The DATA frame floor (issue 31): one-byte DATA frames cost the server ~40× the CPU per byte
 * of 16 KiB frames, so past a call's first 1 024 frames they must carry 32 bytes on average,
 * else the stream is reset with ENHANCE_YOUR_CALM (gRPC: RESOURCE_EXHAUSTED) at once.
 * Raw HTTP/2 through a proxy that splits the client's DATA frames (node's client coalesces
 * small writes); a client sending one item per frame is served in full.
 */
import { randomUUID } from "node:crypto";
import * as http2 from "node:http2";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createMemoryQueue } from "../../../src/adapters/memory/index.js";
import {
  createRunnerService,
  mintJobToken,
  startRunnerServer,
  type RunnerServer,
  type RunnerService,
} from "../../../src/runner/index.js";
import { startFrameSplittingProxy, type FrameSplittingProxy } from "../../fixtures/h2-frame-splitter-proxy.js";
import { connect, frame, openCall, type Status } from "../../fixtures/runner-raw-calls.js";
import { end, line, until } from "../../fixtures/runner-service.js";

const SECRET = "data-frames-secret-0123456789abcdef";

let runner: RunnerService;
const errors: unknown[] = [];
let server: RunnerServer;
let oneByte: FrameSplittingProxy;
/** Frames of 45 bytes: an empty line's whole item per frame, the smallest an agent sends. */
let itemSized: FrameSplittingProxy;

beforeAll(async () => {
  runner = createRunnerService(createMemoryQueue(), { secret: SECRET, onError: (e) => errors.push(e) });
  server = await startRunnerServer(runner, { port: 0 });
  oneByte = await startFrameSplittingProxy(server.port, 1);
  itemSized = await startFrameSplittingProxy(server.port, 45);
});
afterAll(async () => {
  await oneByte.close();
  await itemSized.close();
  await server.close();
  await runner.close();
});

/** One call through `url` with `token`: `body` written at once, then the end of the stream; its status and reset code. */
async function callWith(url: string, token: string, body: Buffer): Promise<Status & { rstCode: number | undefined }> {
  const session = connect(url);
  try {
    const call = openCall(session, "grpc", token);
    call.stream.end(body);
    const status = await call.status;
    return { ...status, rstCode: call.stream.rstCode };
  } finally {
    session.close();
  }
}

const ENHANCE_YOUR_CALM = http2.constants.NGHTTP2_ENHANCE_YOUR_CALM;

describe("the DATA frame floor", () => {
  it("an authenticated call in one-byte DATA frames is reset ENHANCE_YOUR_CALM after about 1 024 of them; what came whole is stored", async () => {
    const id = randomUUID();
    // 2,000 empty lines (90 KB): 90,000 one-byte frames through the proxy.
    const items = Array.from({ length: 2000 }, () => frame(line(id, "")));
    const before = oneByte.dataFrames;
    const status = await callWith(oneByte.url, mintJobToken(SECRET, id), Buffer.concat([...items, frame(end(id))]));
    // Before: ok, all 2,001 items stored, 90,000+ frames read one by one.
    expect(status).toMatchObject({ code: null, rstCode: ENHANCE_YOUR_CALM });
    // 1,024 free frames hold 22 whole items of 45 bytes; the floor stops the call right after.
    await until(async () => (await runner.logs.get(id))?.committed !== undefined, "the items before the cut stored");
    const committed = (await runner.logs.get(id))!.committed;
    expect(committed).toBeGreaterThanOrEqual(20);
    expect(committed).toBeLessThan(40);
    expect(errors.map(String).join("\n")).not.toMatch(/DATA frames/);
    expect(oneByte.dataFrames - before).toBeGreaterThan(1024);
  });

  it("a made-up token's first message in one-byte frames is cut by the floor, before its token is ever checked", async () => {
    const id = randomUUID();
    // A 60 KB first line: read whole before (60,000 frames), then PERMISSION_DENIED.
    const status = await callWith(oneByte.url, "made-up-token", frame(line(id, "x".repeat(60_000))));
    expect(status).toMatchObject({ code: null, rstCode: ENHANCE_YOUR_CALM });
  });

  it("a client sending one item per DATA frame (45 bytes each, 3,001 frames) is served in full", async () => {
    const id = randomUUID();
    const items = Array.from({ length: 3000 }, () => frame(line(id, "")));
    expect(items[0]!.length).toBe(45);
    const before = itemSized.dataFrames;
    const status = await callWith(itemSized.url, mintJobToken(SECRET, id), Buffer.concat([...items, frame(end(id))]));
    expect(status).toMatchObject({ code: 0, committed: "3001" });
    expect(itemSized.dataFrames - before).toBeGreaterThanOrEqual(3001);
  });
});
