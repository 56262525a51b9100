/**
 * The runner client against hostile servers over real sockets (issue 31, items 2, 5 and 10):
 * an answer streamed without end, a server that takes the call and stops reading, a
 * `runner-committed` beyond what was sent, and TLS certificates that cannot be trusted.
 */
import { randomUUID } from "node:crypto";
import type http2 from "node:http2";
import fc from "fast-check";
import { afterEach, describe, expect, it } from "vitest";
import { checkJobCredentials } from "../../../src/runner/client/credentials-probe.js";
import { createRunnerClient, type RunnerClient } from "../../../src/runner/client/runner-client.js";
import { runJob } from "../../../src/runner/agent/run-job.js";
import { MAX_ANSWER_BYTES, readOutcome } from "../../../src/runner/client/outcome.js";
import { selfSignedCertificate, startHostileServer, type HostileServer } from "../../fixtures/hostile-runner-server.js";

const open: Array<{ close(): Promise<void> }> = [];
afterEach(async () => {
  for (const x of open.splice(0).reverse()) await x.close();
});

async function hostile(...args: Parameters<typeof startHostileServer>): Promise<HostileServer> {
  const server = await startHostileServer(...args);
  open.push(server);
  return server;
}

function track(client: RunnerClient): RunnerClient {
  open.push(client);
  return client;
}

/** `p`'s outcome, or "unsettled" if it has not settled after `ms` (a bound far above the one under test). */
async function settled<T>(p: Promise<T>, ms: number): Promise<{ value?: T; error?: unknown } | "unsettled"> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<"unsettled">((r) => (timer = setTimeout(() => r("unsettled"), ms)));
  try {
    return await Promise.race([
      p.then(
        (value) => ({ value }),
        (error: unknown) => ({ error }),
      ),
      late,
    ]);
  } finally {
    clearTimeout(timer);
  }
}

describe("an answer streamed without end (item 2)", () => {
  it("cuts the call at MAX_ANSWER_BYTES as a protocol error, retries, and holds no more of it", async () => {
    const maxBytes = 128 * 1024 * 1024;
    const server = await hostile({ kind: "stream-forever", maxBytes });
    const retries: string[] = [];
    const client = track(
      createRunnerClient({
        endpoint: server.url,
        requestId: randomUUID(),
        maxCallMs: 500,
        responseTimeoutMs: 500,
        deadlineMs: 2_000,
        backoff: { initialMs: 10, maxMs: 50 },
        onRetry: (e) => retries.push(`${e.code}: ${e.message}`),
      }),
    );
    global.gc?.();
    const base = process.memoryUsage();
    const peak = { rss: base.rss, arrayBuffers: base.arrayBuffers };
    const sampler = setInterval(() => {
      const m = process.memoryUsage();
      peak.rss = Math.max(peak.rss, m.rss);
      peak.arrayBuffers = Math.max(peak.arrayBuffers, m.arrayBuffers);
    }, 10);
    client.log("a line, so that a call starts");
    const flushed = await settled(client.flush(), 60_000);
    clearInterval(sampler);
    const mib = (n: number) => (n / 1024 / 1024).toFixed(1);
    console.log(
      `stream-forever: ${server.calls} calls, answer bytes the server wrote per call ≤ ${mib(Math.max(...server.answerBytes))} MiB; ` +
        `peak growth: arrayBuffers +${mib(peak.arrayBuffers - base.arrayBuffers)} MiB, rss +${mib(peak.rss - base.rss)} MiB`,
    );
    expect(flushed).toMatchObject({ error: { code: "INTERNAL" } });
    expect(retries.length).toBeGreaterThan(0);
    expect(retries[0]).toMatch(new RegExp(`INTERNAL: .*the answer is over ${MAX_ANSWER_BYTES} bytes`));
    // Past the cap the client resets the stream: the server gets no further than the cap plus
    // what HTTP/2 flow control let it have in flight (the client's 64 KiB window, its own buffer).
    for (const bytes of server.answerBytes) expect(bytes).toBeLessThan(1024 * 1024);
    // Before the bound the client kept all 128 MiB of the first answer in memory.
    expect(peak.arrayBuffers - base.arrayBuffers).toBeLessThan(32 * 1024 * 1024);
  });
});

describe("a compressed Ack that inflates far beyond an Ack (item 2)", () => {
  it("refuses it as a bad Ack (INTERNAL, retried) instead of inflating it", async () => {
    const inflatedBytes = 32 * 1024 * 1024;
    const server = await hostile({ kind: "ack-bomb", committed: "0", inflatedBytes });
    const retries: string[] = [];
    const client = track(
      createRunnerClient({
        endpoint: server.url,
        requestId: randomUUID(),
        deadlineMs: 3_000,
        backoff: { initialMs: 10, maxMs: 50 },
        onRetry: (e) => retries.push(`${e.code}: ${e.message}`),
      }),
    );
    client.log("x");
    const flushed = await settled(client.flush(), 30_000);
    console.log(`ack-bomb: ${inflatedBytes} bytes inflated from a ${server.answerBytes[0]}-byte answer`);
    // Before: each answer inflated to 32 MiB and decoded as Ack ok = true, so every call
    // "succeeded" and the client called again at once, for ever: flush() never settled.
    expect(server.answerBytes[0]).toBeLessThan(MAX_ANSWER_BYTES);
    expect(flushed).toMatchObject({ error: { code: "INTERNAL" } });
    expect(retries[0]).toMatch(/^INTERNAL: bad Ack: .*(maxOutputLength|larger than)/);
  });
});

describe("a server that accepts the call and stops reading (item 5)", () => {
  it("abandons the stalled call and honours the deadline: end() settles DEADLINE_EXCEEDED", async () => {
    const server = await hostile({ kind: "stall" });
    const client = track(
      createRunnerClient({
        endpoint: server.url,
        requestId: randomUUID(),
        deadlineMs: 2_000,
        // PINGs are answered by the stalled server: keep-alive alone never notices.
        keepaliveMs: 200,
        backoff: { initialMs: 10, maxMs: 50 },
      }),
    );
    // ~1 MiB of lines: more than the server's 64 KiB windows take.
    for (let i = 0; i < 10_000; i++) client.log(`line ${i} ${"x".repeat(100)}`);
    const t0 = performance.now();
    const ended = await settled(
      client.end({ exitCode: 0, success: true }),
      // Twenty times the deadline: a bound on the test, not on the client.
      40_000,
    );
    console.log(`stall: end() settled after ${Math.round(performance.now() - t0)} ms (deadlineMs 2000)`);
    expect(ended).not.toBe("unsettled");
    expect(ended).toMatchObject({ error: { code: "DEADLINE_EXCEEDED" } });
    expect((ended as { error: Error }).error.message).toMatch(/no write progress|no progress for the deadline/);
    expect((await client.stopped).reason).toBe("failed");
    expect(client.stats.committed).toBe(0);
  });

  it("retries a call that made no write progress for stallTimeoutMs, on a new stream each time", async () => {
    const server = await hostile({ kind: "stall" });
    const retries: string[] = [];
    const client = track(
      createRunnerClient({
        endpoint: server.url,
        requestId: randomUUID(),
        stallTimeoutMs: 200,
        deadlineMs: 3_000,
        keepaliveMs: 200,
        backoff: { initialMs: 10, maxMs: 50 },
        onRetry: (e) => retries.push(e.message),
      }),
    );
    for (let i = 0; i < 10_000; i++) client.log(`line ${i} ${"x".repeat(100)}`);
    const flushed = await settled(client.flush(), 60_000);
    expect(flushed).toMatchObject({ error: { code: "DEADLINE_EXCEEDED" } });
    expect(retries.length).toBeGreaterThan(1);
    expect(retries[0]).toMatch(/no write progress for 200 ms: the server stopped reading/);
    expect(server.calls).toBe(client.stats.calls);
    expect(server.calls).toBeGreaterThan(1);
  });
});

describe("a runner-committed beyond what was sent (item 10)", () => {
  it("is a protocol error, never applied: end() is not acknowledged and runJob fails instead of exiting 0", async () => {
    const server = await hostile({ kind: "lying-committed", committed: "999999999" });
    const retries: string[] = [];
    const client = track(
      createRunnerClient({
        endpoint: server.url,
        requestId: randomUUID(),
        deadlineMs: 1_000,
        backoff: { initialMs: 10, maxMs: 50 },
        onRetry: (e) => retries.push(`${e.code}: ${e.message}`),
      }),
    );
    const run = await settled(
      runJob(client, { command: process.execPath, args: ["-e", "console.log('one'); console.log('two')"] }),
      60_000,
    );
    // Before: runner-committed was clamped to what the spool held, the end counted as
    // acknowledged and runJob resolved 0 — the agent exited 0 with nothing stored.
    expect(run).toMatchObject({ error: { code: "INTERNAL" } });
    expect(retries[0]).toMatch(/INTERNAL: runner-committed 999999999 is beyond the 3 items sent/);
    expect(client.stats.committed).toBe(0);
    expect(server.calls).toBeGreaterThan(1);
  });

  it("whatever runner-committed and status an answer carries, the outcome never reports more than was sent", () => {
    const digits = fc.stringMatching(/^\d{1,25}$/);
    fc.assert(
      fc.property(
        fc.oneof(digits, fc.string({ maxLength: 30 })),
        fc.constantFrom("0", "1", "3", "9", "13", undefined),
        fc.boolean(),
        fc.nat({ max: 2 ** 40 }),
        (committed, status, inTrailers, sent) => {
          const fields = { "runner-committed": committed, ...(status === undefined ? {} : { "grpc-status": status }) };
          const outcome = readOutcome(
            {
              headers: { ":status": "200", ...(inTrailers ? {} : fields) } as http2.IncomingHttpHeaders,
              trailers: inTrailers ? fields : undefined,
              data: [Buffer.from([0, 0, 0, 0, 2, 0x08, 0x01])],
            },
            sent,
          );
          if (outcome.committed !== undefined) expect(outcome.committed).toBeLessThanOrEqual(sent);
          if (/^\d+$/.test(committed) && Number(committed) > sent) {
            expect([outcome.code, outcome.committed, outcome.ok]).toEqual([13, undefined, undefined]);
          }
        },
      ),
      { numRuns: 2000 },
    );
  });

  it("an over-long runner-committed is shown cut short, and is refused the same way", async () => {
    const server = await hostile({ kind: "lying-committed", committed: "9".repeat(400) });
    const client = track(
      createRunnerClient({
        endpoint: server.url,
        requestId: randomUUID(),
        deadlineMs: 300,
        backoff: { initialMs: 10, maxMs: 20 },
      }),
    );
    client.log("x");
    const flushed = await settled(client.flush(), 60_000);
    expect(flushed).toMatchObject({ error: { code: "INTERNAL" } });
    expect((flushed as { error: Error }).error.message).toMatch(/^runner-committed 9{20} is beyond the 1 items sent/);
  });
});

describe("an Ack ok = true whose runner-committed does not reach the call's items", () => {
  for (const [what, committed] of [
    ["runner-committed 0", "0"],
    ["no runner-committed", ""],
  ] as const) {
    it(`${what}: a protocol error, retried with back-off until the deadline, so flush() settles`, async () => {
      const server = await hostile({ kind: "lying-committed", committed });
      const retries: string[] = [];
      const client = track(
        createRunnerClient({
          endpoint: server.url,
          requestId: randomUUID(),
          deadlineMs: 500,
          backoff: { initialMs: 50, maxMs: 100 },
          onRetry: (e) => retries.push(`${e.code}: ${e.message}`),
        }),
      );
      client.log("one");
      client.log("two");
      // Before: ok = true reset the failures and started the next call at once, with no progress ever made: a new
      // call each round trip (thousands a second), forever, and flush() never settled.
      const flushed = await settled(client.flush(), 15_000);
      expect(flushed).toMatchObject({ error: { code: "INTERNAL" } });
      expect(retries[0]).toMatch(
        /^INTERNAL: an Ack ok = true with (runner-committed 0|no runner-committed) falls short of 2, the end of the items/,
      );
      // Back-off of 50–100 ms within a 500 ms deadline: a handful of calls.
      expect(server.calls).toBeLessThan(30);
      expect(client.stats.committed).toBe(0);
    });
  }
});

describe("a TLS certificate the client cannot trust (item 10)", () => {
  for (const [what, san, trust, expired, tlsError] of [
    ["an unknown CA (self-signed, no tls.ca)", "IP:127.0.0.1", false, false, "DEPTH_ZERO_SELF_SIGNED_CERT"],
    ["a host name the certificate does not name", "DNS:other.example", true, false, "ERR_TLS_CERT_ALTNAME_INVALID"],
    ["an expired certificate", "IP:127.0.0.1", true, true, "CERT_HAS_EXPIRED"],
  ] as const) {
    it(`${what}: fails at once, without retrying, and says why`, async () => {
      const cert = await selfSignedCertificate("runner", san, { expired });
      const server = await hostile({ kind: "lying-committed", committed: "0" }, cert);
      const retries: string[] = [];
      const client = track(
        createRunnerClient({
          endpoint: server.url,
          requestId: randomUUID(),
          tls: trust ? { ca: cert.cert } : undefined,
          deadlineMs: 5_000,
          backoff: { initialMs: 10, maxMs: 50 },
          onRetry: (e) => retries.push(e.message),
        }),
      );
      client.log("x");
      const flushed = await settled(client.flush(), 60_000);
      expect(flushed).toMatchObject({ error: { code: "UNAVAILABLE", details: { tlsError } } });
      expect((flushed as { error: Error }).error.message).toMatch(
        /TLS certificate is not trusted .*retrying cannot fix this/,
      );
      expect(retries).toEqual([]);
      expect(server.calls).toBe(0);

      const check = await checkJobCredentials({
        endpoint: server.url,
        requestId: randomUUID(),
        tls: trust ? { ca: cert.cert } : undefined,
      });
      expect(check).toMatchObject({ status: "refused", error: { code: "UNAVAILABLE", details: { tlsError } } });
    });
  }
});
