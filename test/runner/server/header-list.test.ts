/**
 * HPACK amplification (issue 31, item 6): a caller without a valid token puts one 4 KB
 * header in the HPACK dynamic table and references it again and again; startRunnerServer
 * advertises SETTINGS_MAX_HEADER_LIST_SIZE and resets such a stream before any handler runs.
 */
import * as http2 from "node:http2";
import { randomUUID } from "node:crypto";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { describe, expect, it } from "vitest";
import { Runner } from "../../../src/gen/runner/v1/runner_pb.js";
import { createRunnerService, mintJobToken, startRunnerServer } from "../../../src/runner/index.js";
import { createMemoryQueue } from "../../../src/adapters/memory/index.js";
import { end, line, send } from "../../fixtures/runner-service.js";
import { connect, frame, openCall } from "../../fixtures/runner-raw-calls.js";

const SECRET = "header-list-secret-0123456789abcdef";

describe("runner server: the decoded header list is bounded (issue 31, item 6)", () => {
  it("advertises maxHeaderListSize 16 384; a stream whose headers decode to 48 KB is reset unserved, a normal call is served", async () => {
    const runner = createRunnerService(createMemoryQueue(), { secret: SECRET });
    const server = await startRunnerServer(runner, { port: 0 });
    const session = connect(server.url);
    try {
      await new Promise<void>((resolve) => session.once("remoteSettings", () => resolve()));
      // The same 4 KB value 12 times (48 KB decoded, under Node's own 64 KiB): after the first, each is a one-byte HPACK index.
      const big = "x".repeat(4000);
      const extra: Record<string, string | string[]> = { "x-pad": Array.from({ length: 12 }, () => big) };
      const id = randomUUID();
      const call = openCall(session, "grpc", "made-up-token", extra as Record<string, string>);
      call.stream.end(frame(line(id, "hello")));
      const status = await call.status;
      // Before the bound the call was served (PERMISSION_DENIED for the made-up token); now
      // the server resets it (ENHANCE_YOUR_CALM, from Node's header accounting) with no response at all.
      expect(status.code).toBeNull();
      expect(call.stream.rstCode).toBe(http2.constants.NGHTTP2_ENHANCE_YOUR_CALM);
      expect(session.remoteSettings.maxHeaderListSize).toBe(16_384);
      const out = await send(
        createClient(Runner, createGrpcTransport({ baseUrl: server.url })),
        [line(id, "hello"), end(id)],
        { token: mintJobToken(SECRET, id) },
      );
      expect(out.ok).toBe(true);
    } finally {
      session.destroy();
      await server.close();
      await runner.close();
    }
  });
});
