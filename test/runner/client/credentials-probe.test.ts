/**
 * The agent's credentials check (docs/decisions/runner-client.md): one StreamLogs call
 * of one item without an event, against a real runner server over HTTP/2. Wrong or
 * missing tokens and unknown jobs are refused; good credentials pass; nothing is stored
 * and the job's later calls are unaffected.
 */
import { randomUUID } from "node:crypto";
import { createServer } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { checkJobCredentials, mintJobToken } from "../../../src/runner/index.js";
import { startHostileServer } from "../../fixtures/hostile-runner-server.js";
import { line, send, startHarness, type Harness } from "../../fixtures/runner-service.js";

const secret = "credentials-check-secret";
let h: Harness;

beforeAll(async () => {
  h = await startHarness({ secret, requireKnownJobs: true, memoryStore: true });
});
afterAll(async () => {
  await h?.close();
});

describe("checkJobCredentials", () => {
  it("passes good credentials and stores nothing; the job's first call then starts at 0", async () => {
    const id = randomUUID();
    await h.runner.expectJob(id);
    const token = mintJobToken(secret, id);
    expect(await checkJobCredentials({ endpoint: h.server.url, requestId: id, token })).toEqual({
      status: "ok",
      committed: 0,
    });
    expect(await h.logs.get(id)).toMatchObject({ committed: 0, storedLines: 0, status: "open" });
    expect(await send(h.client, [line(id, "a"), line(id, "b")], { token })).toMatchObject({ ok: true, committed: "2" });
    // Mid-job the check reports what the server holds, and the next call continues from there.
    expect(await checkJobCredentials({ endpoint: h.server.url, requestId: id.toUpperCase(), token })).toEqual({
      status: "ok",
      committed: 2,
    });
    expect(await send(h.client, [line(id, "c")], { token, offset: 2 })).toMatchObject({ ok: true, committed: "3" });
    expect((await h.logs.read(id)).map((l) => l.line)).toEqual(["a", "b", "c"]);
  });

  it("refuses a wrong token (PERMISSION_DENIED) and a missing one (UNAUTHENTICATED)", async () => {
    const id = randomUUID();
    await h.runner.expectJob(id);
    const wrong = await checkJobCredentials({
      endpoint: h.server.url,
      requestId: id,
      token: mintJobToken("another secret", id),
    });
    expect(wrong.status).toBe("refused");
    expect(wrong.status === "refused" && wrong.error.code).toBe("PERMISSION_DENIED");
    const missing = await checkJobCredentials({ endpoint: h.server.url, requestId: id });
    expect(missing.status === "refused" && missing.error.code).toBe("UNAUTHENTICATED");
    // A token of another job is wrong for this one.
    const other = await checkJobCredentials({
      endpoint: h.server.url,
      requestId: id,
      token: mintJobToken(secret, randomUUID()),
    });
    expect(other.status === "refused" && other.error.code).toBe("PERMISSION_DENIED");
    expect(await h.logs.get(id)).toMatchObject({ committed: 0, storedLines: 0 });
  });

  it("refuses a job the server does not expect (NOT_FOUND under requireKnownJobs)", async () => {
    const id = randomUUID();
    const unknown = await checkJobCredentials({
      endpoint: h.server.url,
      requestId: id,
      token: mintJobToken(secret, id),
    });
    expect(unknown.status === "refused" && unknown.error.code).toBe("NOT_FOUND");
  });

  it("passes on an open server without a token", async () => {
    const open = await startHarness({ memoryStore: true });
    try {
      expect(await checkJobCredentials({ endpoint: open.server.url, requestId: randomUUID() })).toEqual({
        status: "ok",
        committed: 0,
      });
    } finally {
      await open.close();
    }
  });

  it("says unreachable (not refused) when nothing answers, so the agent can still run and retry", async () => {
    const probe = createServer();
    await new Promise<void>((r) => probe.listen(0, "127.0.0.1", r));
    const port = (probe.address() as { port: number }).port;
    await new Promise((r) => probe.close(r));
    const result = await checkJobCredentials({
      endpoint: `http://127.0.0.1:${port}`,
      requestId: randomUUID(),
      token: "t",
    });
    expect(result.status).toBe("unreachable");
    expect(result.status === "unreachable" && result.error.message).toBe(
      `cannot reach http://127.0.0.1:${port}: connection refused (ECONNREFUSED): nothing listens there`,
    );
    // Issue 29 item 10: nothing answered, so the agent waits for the runner rather than running the job.
    expect(result.status === "unreachable" && result.answered).toBe(false);
  });

  it("tells a server that never answers (not answered) from one that answers badly (answered)", async () => {
    const stall = await startHostileServer({ kind: "stall" });
    const flood = await startHostileServer({ kind: "stream-forever", maxBytes: 1024 * 1024 });
    try {
      const silent = await checkJobCredentials({ endpoint: stall.url, requestId: randomUUID(), timeoutMs: 300 });
      expect(silent).toMatchObject({ status: "unreachable", answered: false });
      expect(silent.status === "unreachable" && silent.error.message).toMatch(/no answer within 300 ms/);
      expect(stall.calls).toBe(1);
      // 200 application/grpc, then more body than an Ack: reached, and broken.
      const broken = await checkJobCredentials({ endpoint: flood.url, requestId: randomUUID() });
      expect(broken).toMatchObject({ status: "unreachable", answered: true });
      expect(broken.status === "unreachable" && broken.error.message).toMatch(/the answer is over 65536 bytes/);
    } finally {
      await stall.close();
      await flood.close();
    }
  });
});
