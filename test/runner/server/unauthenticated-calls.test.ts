/**
 * Streams that never send their first message (issue 31, item 1): HEADERS with a made-up
 * token and no DATA, on several connections. The server counts calls not yet authenticated
 * (`readLimits.unauthenticatedCalls`) and gives each `firstByteMs` from its start to send.
 */
import { randomUUID } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import { Code, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { describe, expect, it } from "vitest";
import { Runner } from "../../../src/gen/runner/v1/runner_pb.js";
import { createRunnerService, mintJobToken, startRunnerServer } from "../../../src/runner/index.js";
import { createMemoryQueue } from "../../../src/adapters/memory/index.js";
import { end, line, send } from "../../fixtures/runner-service.js";
import { connect, openCall, type RawCall, type Status } from "../../fixtures/runner-raw-calls.js";

const SECRET = "unauthenticated-calls-secret-0123456789";

/** The statuses of `calls`, or null for those still open after `ms` (the test's bound, not an assertion on time). */
function statusesWithin(calls: RawCall[], ms: number): Promise<Array<Status | null>> {
  const cutoff = sleep(ms, null, { ref: false });
  return Promise.all(calls.map((c) => Promise.race([c.status, cutoff])));
}

describe("runner server: calls that send no first message (issue 31, item 1)", () => {
  it("past unauthenticatedCalls across connections a call is refused UNAVAILABLE; the rest end DEADLINE_EXCEEDED after firstByteMs; a normal call is served", async () => {
    const runner = createRunnerService(createMemoryQueue(), { secret: SECRET });
    const server = await startRunnerServer(runner, {
      port: 0,
      readLimits: { unauthenticatedCalls: 100, firstByteMs: 1000 },
    });
    const sessions = [connect(server.url), connect(server.url), connect(server.url)];
    try {
      const calls: RawCall[] = [];
      // 3 connections × 60 streams: HEADERS only, never a DATA frame.
      for (const session of sessions)
        for (let i = 0; i < 60; i++) calls.push(openCall(session, i % 2 ? "grpc" : "connect", "made-up-token"));
      // Before: every stream stayed open for the 60 s idle limit.
      const statuses = await statusesWithin(calls, 20_000);
      const codes = statuses.map((st) => st?.code ?? null);
      expect(codes.filter((c) => c === null)).toHaveLength(0);
      expect(codes.filter((c) => c === Code.Unavailable)).toHaveLength(80);
      expect(codes.filter((c) => c === Code.DeadlineExceeded)).toHaveLength(100);
      expect(statuses.find((st) => st?.code === Code.Unavailable)?.message).toMatch(
        /100 calls waiting for their first message/,
      );
      expect(statuses.find((st) => st?.code === Code.DeadlineExceeded)?.message).toMatch(
        /first message did not arrive within 1000 ms of the call's start/,
      );
      const id = randomUUID();
      const out = await send(
        createClient(Runner, createGrpcTransport({ baseUrl: server.url })),
        [line(id, "hello"), end(id)],
        { token: mintJobToken(SECRET, id) },
      );
      expect(out.ok).toBe(true);
    } finally {
      for (const session of sessions) session.destroy();
      await server.close();
      await runner.close();
    }
  }, 60_000);
});
