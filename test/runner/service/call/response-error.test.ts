/**
 * What an agent is told when the log store fails (issue 31, item 10): the code, a generic
 * line; the driver's own text (addresses, ports) goes to the server's onError only. Real
 * PostgreSQL behind a TCP proxy that is cut, a real gRPC call.
 */
import { randomUUID } from "node:crypto";
import pg from "pg";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { describe, expect, it } from "vitest";
import { Runner } from "../../../../src/gen/runner/v1/runner_pb.js";
import { createRunnerService, mintJobToken, startRunnerServer } from "../../../../src/runner/index.js";
import { createMemoryQueue } from "../../../../src/adapters/memory/index.js";
import { createPostgresLogStore } from "../../../../src/adapters/postgres/index.js";
import { POSTGRES_URL, createTestSchema, startProxyFor } from "../../../fixtures/backends.js";
import { line, send } from "../../../fixtures/runner-service.js";

const SECRET = "response-error-secret-0123456789abcdef";

describe("runner call errors: no driver text reaches the agent (issue 31, item 10)", () => {
  it("PostgreSQL cut mid-job: the call ends UNAVAILABLE with a generic message; the raw error goes to onError", async () => {
    const db = await createTestSchema();
    const proxy = await startProxyFor(POSTGRES_URL, 5432);
    const pool = new pg.Pool({ connectionString: proxy.url(POSTGRES_URL), max: 4 });
    pool.on("error", () => undefined);
    const errors: unknown[] = [];
    const runner = createRunnerService(createMemoryQueue(), {
      secret: SECRET,
      logs: createPostgresLogStore({ pool, schema: db.schema }),
      onError: (e) => errors.push(e),
    });
    const server = await startRunnerServer(runner, { port: 0 });
    try {
      const client = createClient(Runner, createGrpcTransport({ baseUrl: server.url }));
      const id = randomUUID();
      const token = mintJobToken(SECRET, id);
      expect((await send(client, [line(id, "one")], { token })).ok).toBe(true);
      await proxy.break();
      const out = await send(client, [line(id, "two")], { token, offset: 1 });
      expect(out.code).toBe("Unavailable");
      // Before: "PostgreSQL: connect ECONNREFUSED 127.0.0.1:<port>" (or the reset's text).
      expect(out.error!.rawMessage).toBe("the server's log store is unavailable; retry the call later");
      expect(out.error!.rawMessage).not.toMatch(/127\.0\.0\.1|PostgreSQL|ECONN/);
      expect(errors.map((e) => String(e))).toContainEqual(expect.stringMatching(/PostgreSQL: /));
    } finally {
      await server.close();
      await runner.close();
      await pool.end().catch(() => undefined);
      await proxy.close();
      await db.drop();
    }
  });
});
