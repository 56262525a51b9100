/**
 * The item rules' bounds on what a job stores (issue 31): a JobEnd's repo_url and
 * commit_sha (item 9), sent as raw gRPC frames over a real HTTP/2 socket.
 */
import { randomUUID } from "node:crypto";
import { Code } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { createRunnerService, mintJobToken, startRunnerServer } from "../../../../src/runner/index.js";
import { createMemoryQueue } from "../../../../src/adapters/memory/index.js";
import { end, line } from "../../../fixtures/runner-service.js";
import { connect, frame, openCall } from "../../../fixtures/runner-raw-calls.js";

const SECRET = "item-rules-secret-0123456789abcdef";

describe("runner item rules: JobEnd strings are bounded (issue 31, item 9)", () => {
  it("a 1 MiB repo_url or a 129-byte commit_sha ends INVALID_ARGUMENT and is neither published nor stored; 2 048 / 128 bytes are accepted", async () => {
    const queue = createMemoryQueue();
    const runner = createRunnerService(queue, { secret: SECRET });
    const server = await startRunnerServer(runner, { port: 0 });
    const session = connect(server.url);
    try {
      const huge = randomUUID();
      const call = openCall(session, "grpc", mintJobToken(SECRET, huge));
      call.stream.end(
        Buffer.concat([frame(line(huge, "x")), frame(end(huge, 0, true, "u".repeat(1024 * 1024 - 100)))]),
      );
      const status = await call.status;
      expect(status.code).toBe(Code.InvalidArgument);
      expect(status.message).toMatch(/repo_url is 1048476 bytes, over the 2048-byte limit/);

      const longSha = randomUUID();
      const shaCall = openCall(session, "grpc", mintJobToken(SECRET, longSha));
      shaCall.stream.end(frame(end(longSha, 0, true, "https://example.test/repo", "f".repeat(129))));
      expect((await shaCall.status).code).toBe(Code.InvalidArgument);

      const fits = randomUUID();
      const okCall = openCall(session, "grpc", mintJobToken(SECRET, fits));
      okCall.stream.end(frame(end(fits, 0, true, "r".repeat(2048), "c".repeat(128))));
      expect((await okCall.status).code).toBe(0);

      expect(queue.results.map((r) => r.requestId)).toEqual([fits]);
      expect((await runner.logs.get(huge))?.status).not.toBe("finished");
      const listed = JSON.stringify(await runner.listJobs({ limit: 50 }));
      expect(listed.length).toBeLessThan(20_000);
    } finally {
      session.destroy();
      await server.close();
      await runner.close();
    }
  });
});
