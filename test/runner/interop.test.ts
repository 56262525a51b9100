/**
 * An independent gRPC implementation (@grpc/grpc-js with @grpc/proto-loader, loading
 * proto/runner/v1/runner.proto) streams to the server: Ack, trailers, status codes. The same
 * implementation built from the seed's proto (no `time_unix_nano`) stands for an older client.
 */
import { randomUUID } from "node:crypto";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { mintJobToken } from "../../src/runner/index.js";
import { MAX_MICROS } from "../../src/runner/protocol/line-time.js";
import { startHarness, storedTexts, type Harness } from "../fixtures/runner-service.js";
import { SEED_PROTO } from "../fixtures/seed-proto.js";

type RunnerPackage = {
  runner: {
    v1: {
      Runner: new (address: string, credentials: grpc.ChannelCredentials) => grpc.Client & Record<string, Function>;
    };
  };
};
const protoPath = fileURLToPath(new URL("../../proto/runner/v1/runner.proto", import.meta.url));
const definition = protoLoader.loadSync(protoPath, { keepCase: true, defaults: true, oneofs: true, longs: String });
const pkg = grpc.loadPackageDefinition(definition) as unknown as RunnerPackage;

interface GrpcOutcome {
  ok: boolean | null;
  code: number;
  details: string;
  trailers: Record<string, unknown>;
}

/** One StreamLogs call with grpc-js; resolves with the Ack (if any) and the final status metadata. */
function stream(
  client: grpc.Client & Record<string, Function>,
  items: object[],
  metadata: Record<string, string> = {},
): Promise<GrpcOutcome> {
  return new Promise((resolve) => {
    const md = new grpc.Metadata();
    for (const [k, v] of Object.entries(metadata)) md.set(k, v);
    let ack: { ok: boolean } | null = null;
    let error: grpc.ServiceError | null = null;
    const call = client.StreamLogs(md, (err: grpc.ServiceError | null, response: { ok: boolean }) => {
      error = err;
      ack = response ?? null;
    }) as grpc.ClientWritableStream<object>;
    // grpc-js reports the trailers on the 'status' event.
    call.on("status", (status: grpc.StatusObject) => {
      setImmediate(() =>
        resolve({
          ok: ack?.ok ?? null,
          code: status.code,
          details: error?.details ?? status.details,
          trailers: status.metadata.getMap(),
        }),
      );
    });
    for (const item of items) call.write(item);
    call.end();
  });
}

describe("interop: @grpc/grpc-js client", () => {
  const secret = "interop-secret";
  let h: Harness;
  let client: grpc.Client & Record<string, Function>;
  beforeAll(async () => {
    h = await startHarness({ secret });
    client = new pkg.runner.v1.Runner(h.server.url.replace("http://", ""), grpc.credentials.createInsecure());
  });
  afterAll(async () => {
    client.close();
    await h.close();
  });

  it("streams lines and the end; gets Ack ok and the runner-committed trailer; the result is published", async () => {
    const id = randomUUID();
    const items = [
      { request_id: id, log: { line: "hello", stderr: false } },
      { request_id: id, log: { line: "wörld ✓", stderr: true } },
      {
        request_id: id,
        end: { exit_code: 2, success: false, repo_url: "https://git.example/x.git", commit_sha: "abc" },
      },
    ];
    const out = await stream(client, items, { authorization: `Bearer ${mintJobToken(secret, id)}` });
    expect(out).toMatchObject({ ok: true, code: grpc.status.OK });
    expect(out.trailers["runner-committed"]).toBe("3");
    expect(await storedTexts(h.logs, id)).toEqual(["hello", "wörld ✓"]);
    expect(h.queue.results.find((r) => r.requestId === id)).toMatchObject({
      exitCode: 2,
      success: false,
      repoUrl: "https://git.example/x.git",
      lines: { stdout: 1, stderr: 1 },
    });
  });

  it("sees error codes with runner-committed in the trailers, and ok=false with runner-reason", async () => {
    const id = randomUUID();
    const auth = { authorization: `Bearer ${mintJobToken(secret, id)}` };
    await stream(client, [{ request_id: id, log: { line: "a" } }], auth);
    const gap = await stream(client, [{ request_id: id, log: { line: "z" } }], { ...auth, "runner-offset": "5" });
    expect(gap.code).toBe(grpc.status.FAILED_PRECONDITION);
    expect(gap.trailers["runner-committed"]).toBe("1");
    const wrong = await stream(client, [{ request_id: id, log: { line: "z" } }], {
      authorization: `Bearer ${mintJobToken("nope", id)}`,
    });
    expect(wrong.code).toBe(grpc.status.PERMISSION_DENIED);
    const missing = await stream(client, [{ request_id: id, log: { line: "z" } }]);
    expect(missing.code).toBe(grpc.status.UNAUTHENTICATED);
    await h.runner.cancelJob(id);
    const cancelled = await stream(client, [{ request_id: id, log: { line: "b" } }], { ...auth, "runner-offset": "1" });
    expect(cancelled).toMatchObject({ ok: false, code: grpc.status.OK });
    expect(cancelled.trailers["runner-reason"]).toBe("cancelled");
    expect(cancelled.trailers["runner-committed"]).toBe("1");
    expect(await storedTexts(h.logs, id)).toEqual(["a"]);
  });

  it("status texts reach grpc-js decoded: ':' and ';' as sent, '%' and non-ASCII intact (grpc-message percent-encoded per the gRPC spec)", async () => {
    const id = randomUUID();
    const auth = { authorization: `Bearer ${mintJobToken(secret, id)}` };
    await stream(client, [{ request_id: id, log: { line: "a" } }], auth);
    const gap = await stream(client, [{ request_id: id, log: { line: "z" } }], { ...auth, "runner-offset": "5" });
    expect(gap.code).toBe(grpc.status.FAILED_PRECONDITION);
    expect(gap.details).toBe("offset 5 is past the 1 items stored; resend from 1");
    const odd = "100%: é; /x";
    const bad = await stream(client, [{ request_id: odd, log: { line: "z" } }], auth);
    expect(bad.code).toBe(grpc.status.INVALID_ARGUMENT);
    expect(bad.details).toBe(`request_id is not a UUID: ${JSON.stringify(odd)}`);
  });
});

describe("interop: per-line time (LogChunk.time_unix_nano)", () => {
  const secret = "interop-time-secret";
  let h: Harness;
  let seedDir: string;
  let current: grpc.Client & Record<string, Function>;
  let older: grpc.Client & Record<string, Function>;
  beforeAll(async () => {
    h = await startHarness({ secret });
    const address = h.server.url.replace("http://", "");
    current = new pkg.runner.v1.Runner(address, grpc.credentials.createInsecure());
    seedDir = mkdtempSync(join(tmpdir(), "runner-depot-seed-proto-"));
    writeFileSync(join(seedDir, "runner.proto"), SEED_PROTO);
    const seed = protoLoader.loadSync(join(seedDir, "runner.proto"), { keepCase: true, defaults: true, oneofs: true });
    const seedPkg = grpc.loadPackageDefinition(seed) as unknown as RunnerPackage;
    older = new seedPkg.runner.v1.Runner(address, grpc.credentials.createInsecure());
  });
  afterAll(async () => {
    current.close();
    older.close();
    await h.close();
    rmSync(seedDir, { recursive: true, force: true });
  });

  it("an older client built from the seed's proto still streams, and its lines get the server's receive time, marked", async () => {
    const id = randomUUID();
    const before = Date.now();
    const out = await stream(
      older,
      [
        { request_id: id, log: { line: "old one", stderr: false } },
        { request_id: id, log: { line: "old two", stderr: true } },
        { request_id: id, end: { exit_code: 0, success: true } },
      ],
      { authorization: `Bearer ${mintJobToken(secret, id)}` },
    );
    const after = Date.now();
    expect(out).toMatchObject({ ok: true, code: grpc.status.OK });
    const stored = await h.logs.read(id);
    expect(stored.map((l) => [l.line, l.stderr, l.serverTime])).toEqual([
      ["old one", false, true],
      ["old two", true, true],
    ]);
    for (const l of stored) {
      expect(l.time).toBeGreaterThanOrEqual(before);
      expect(l.time).toBeLessThanOrEqual(after + 1);
    }
    // follow() yields the same lines, times and marks (the job has ended: to its end, then done).
    const followed = [];
    for await (const l of h.runner.follow(id)) followed.push(l);
    expect(followed).toEqual(stored);
  });

  it("a client that sends time_unix_nano gets it stored to the microsecond, not marked as the server's", async () => {
    const id = randomUUID();
    // 2021-03-04T05:06:07.123456789Z: the nanoseconds below the microsecond are dropped.
    const out = await stream(
      current,
      [
        { request_id: id, log: { line: "stamped", stderr: false, time_unix_nano: "1614834367123456789" } },
        { request_id: id, log: { line: "unstamped", stderr: false } },
      ],
      { authorization: `Bearer ${mintJobToken(secret, id)}` },
    );
    expect(out).toMatchObject({ ok: true, code: grpc.status.OK });
    const [stamped, unstamped] = await h.logs.read(id);
    expect(stamped).toEqual({ line: "stamped", stderr: false, time: 1614834367123.456 });
    expect(unstamped).toMatchObject({ line: "unstamped", serverTime: true });
  });

  it("the largest time_unix_nano a hostile client can send is kept as the latest time kept, and the log still reads", async () => {
    const id = randomUUID();
    const out = await stream(
      current,
      [
        { request_id: id, log: { line: "far", stderr: false, time_unix_nano: "18446744073709551615" } },
        { request_id: id, log: { line: "near", stderr: false, time_unix_nano: "1000" } },
      ],
      { authorization: `Bearer ${mintJobToken(secret, id)}` },
    );
    expect(out).toMatchObject({ ok: true, code: grpc.status.OK });
    expect(await h.logs.read(id)).toEqual([
      { line: "far", stderr: false, time: MAX_MICROS / 1000 },
      { line: "near", stderr: false, time: 0.001 },
    ]);
  });
});
