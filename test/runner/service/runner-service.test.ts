/**
 * The runner service through a real gRPC client (connect-node) over a real h2c socket:
 * the happy path, every row of the contract's status-code table, ok=false, resume.
 */
import { randomUUID } from "node:crypto";
import { create } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { LogItemSchema, Runner } from "../../../src/gen/runner/v1/runner_pb.js";
import { mintJobToken } from "../../../src/runner/index.js";
import type { JobResult } from "../../../src/runner/ports.js";
import {
  controlledStream,
  empty,
  end,
  line,
  send,
  startHarness,
  storedTexts,
  until,
  type Harness,
} from "../../fixtures/runner-service.js";

const lines = (id: string, from: number, to: number, stderr = false) =>
  Array.from({ length: to - from }, (_, i) => line(id, `line ${from + i}`, stderr));
const texts = (from: number, to: number) => Array.from({ length: to - from }, (_, i) => `line ${from + i}`);

describe("runner service over gRPC (open service, fs log store)", () => {
  let h: Harness;
  beforeAll(async () => {
    // A 2 s publish bound: the refuse-twice test's two retries must fit in it, which 300 ms
    // did not guarantee on a loaded machine (each retry waits on a timer).
    h = await startHarness({ publishRetry: { maxMs: 2_000, initialDelayMs: 10, maxDelayMs: 50 } });
  });
  afterAll(async () => {
    await h.close();
  });

  it("happy path: lines stored in order in the fs store, result on the queue, Ack ok, runner-committed", async () => {
    const id = randomUUID();
    await h.runner.expectJob(id, { repoUrl: "https://git.example/app.git" });
    const items = [
      ...lines(id, 0, 500),
      line(id, "oops", true),
      ...lines(id, 501, 1000),
      end(id, 3, false, "", "abc123"),
    ];
    const out = await send(h.client, items);
    expect(out).toMatchObject({ ok: true, code: null, committed: "1001", reason: null });
    expect(await storedTexts(h.logs, id)).toEqual([...texts(0, 500), "oops", ...texts(501, 1000)]);
    expect((await h.logs.read(id, 500, 1))[0]).toEqual({
      line: "oops",
      stderr: true,
      time: expect.any(Number),
      serverTime: true,
    });
    const result = h.queue.results.find((r) => r.requestId === id)!;
    expect(result).toMatchObject({
      requestId: id,
      outcome: "finished",
      exitCode: 3,
      success: false,
      // The runner's empty repo_url falls back to what expectJob said; commit_sha is the runner's.
      repoUrl: "https://git.example/app.git",
      commitSha: "abc123",
      lines: { stdout: 999, stderr: 1 },
      logTruncated: false,
    });
    expect(result.startedAt).toMatch(/Z$/);
    expect(Date.parse(result.endedAt)).toBeGreaterThanOrEqual(Date.parse(result.startedAt!));
    expect(await h.logs.get(id)).toMatchObject({ status: "finished", committed: 1001 });
  });

  it("exit_code and success are published exactly as sent (never inferred)", async () => {
    const id = randomUUID();
    expect((await send(h.client, [end(id, 0, false)])).ok).toBe(true);
    const id2 = randomUUID();
    expect((await send(h.client, [end(id2, 7, true)])).ok).toBe(true);
    const byId = (x: string) => h.queue.results.find((r) => r.requestId === x)!;
    expect(byId(id)).toMatchObject({ exitCode: 0, success: false, lines: { stdout: 0, stderr: 0 } });
    expect(byId(id2)).toMatchObject({ exitCode: 7, success: true });
  });

  it("a request ID in upper case is the same job, stored lower-case", async () => {
    const id = randomUUID();
    expect((await send(h.client, [line(id.toUpperCase(), "a")])).committed).toBe("1");
    expect((await send(h.client, [line(id, "b")], { offset: 1 })).committed).toBe("2");
    expect(await storedTexts(h.logs, id)).toEqual(["a", "b"]);
    expect((await h.logs.get(id))?.requestId).toBe(id);
  });

  it("nil and max UUIDs are accepted", async () => {
    for (const id of ["00000000-0000-0000-0000-000000000000", "FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF"]) {
      expect(await send(h.client, [line(id, "x")])).toMatchObject({ ok: true, committed: "1" });
    }
  });

  it("a call with zero items answers ok = true", async () => {
    expect((await send(h.client, [])).ok).toBe(true);
  });

  it("a call without end keeps the job open; later calls continue at runner-offset", async () => {
    const id = randomUUID();
    expect(await send(h.client, lines(id, 0, 3))).toMatchObject({ ok: true, committed: "3" });
    expect(await send(h.client, lines(id, 3, 6), { offset: 3 })).toMatchObject({ ok: true, committed: "6" });
    expect(await send(h.client, [end(id)], { offset: 6 })).toMatchObject({ ok: true, committed: "7" });
    expect(await storedTexts(h.logs, id)).toEqual(texts(0, 6));
  });

  describe("INVALID_ARGUMENT", () => {
    it.each([
      ["not-a-uuid"],
      ["{" + "12345678-1234-1234-1234-123456789abc" + "}"],
      ["urn:uuid:12345678-1234-1234-1234-123456789abc"],
      ["12345678123412341234123456789abc"],
      ["12345678-1234-1234-1234-123456789abg"],
      [""],
    ])("bad UUID %j: refused, nothing stored", async (bad) => {
      const out = await send(h.client, [line(bad, "x")]);
      expect(out.code).toBe("InvalidArgument");
      // Raised before the job is known: no runner-committed to give.
      expect(out.committed).toBeNull();
    });

    it("mixed IDs: items before stay stored, nothing after is, committed says so", async () => {
      const id = randomUUID();
      const other = randomUUID();
      const out = await send(h.client, [line(id, "a"), line(id, "b"), line(other, "c"), line(id, "d")]);
      expect(out).toMatchObject({ code: "InvalidArgument", committed: "2" });
      expect(await storedTexts(h.logs, id)).toEqual(["a", "b"]);
      expect(await h.logs.get(other)).toBeNull();
    });

    it("empty item: refused with committed; items before it stored", async () => {
      const id = randomUUID();
      expect(await send(h.client, [empty(id)])).toMatchObject({ code: "InvalidArgument", committed: "0" });
      const out = await send(h.client, [line(id, "a"), empty(id), line(id, "b")]);
      expect(out).toMatchObject({ code: "InvalidArgument", committed: "1" });
      expect(await storedTexts(h.logs, id)).toEqual(["a"]);
    });

    it("item after end: the end is published (it came first), the extra item is refused", async () => {
      const id = randomUUID();
      const out = await send(h.client, [line(id, "a"), end(id, 0), line(id, "late")]);
      expect(out).toMatchObject({ code: "InvalidArgument", committed: "2" });
      expect(await storedTexts(h.logs, id)).toEqual(["a"]);
      expect(h.queue.results.filter((r) => r.requestId === id)).toHaveLength(1);
    });

    it.each([["-1"], ["abc"], ["1.5"], ["1, 2"], ["+3"], [""], ["99999999999999999999"]])(
      "malformed runner-offset %j: refused, nothing stored",
      async (offset) => {
        const id = randomUUID();
        await send(h.client, [line(id, "a")]);
        const out = await send(h.client, [line(id, "b")], { offset });
        expect(out).toMatchObject({ code: "InvalidArgument", committed: "1" });
        expect(await storedTexts(h.logs, id)).toEqual(["a"]);
      },
    );
  });

  it("FAILED_PRECONDITION on an offset gap, with committed; nothing stored", async () => {
    const id = randomUUID();
    await send(h.client, lines(id, 0, 3));
    const out = await send(h.client, lines(id, 5, 7), { offset: 5 });
    expect(out).toMatchObject({ code: "FailedPrecondition", committed: "3" });
    expect(await storedTexts(h.logs, id)).toEqual(texts(0, 3));
    // An unknown job with an offset: a gap too, and the job is not created.
    const fresh = randomUUID();
    expect(await send(h.client, [line(fresh, "x")], { offset: 2 })).toMatchObject({
      code: "FailedPrecondition",
      committed: "0",
    });
    expect(await h.logs.get(fresh)).toBeNull();
  });

  it("resume: duplicates are skipped (not compared), new items appended, no line lost or doubled", async () => {
    const id = randomUUID();
    await send(h.client, lines(id, 0, 5));
    // The runner lost the Ack and replays from 3; items 3 and 4 are duplicates.
    const replay = [line(id, "DIFFERENT 3"), line(id, "DIFFERENT 4"), ...lines(id, 5, 8)];
    expect(await send(h.client, replay, { offset: 3 })).toMatchObject({ ok: true, committed: "8" });
    expect(await storedTexts(h.logs, id)).toEqual(texts(0, 8));
    // A call of duplicates only.
    expect(await send(h.client, lines(id, 0, 8), { offset: 0 })).toMatchObject({ ok: true, committed: "8" });
    expect(await storedTexts(h.logs, id)).toEqual(texts(0, 8));
  });

  it("a replayed end publishes once and answers ok = true again", async () => {
    const id = randomUUID();
    expect(await send(h.client, [...lines(id, 0, 2), end(id)])).toMatchObject({ ok: true, committed: "3" });
    expect(await send(h.client, [...lines(id, 0, 2), end(id)])).toMatchObject({ ok: true, committed: "3" });
    expect(await send(h.client, [end(id)], { offset: 2 })).toMatchObject({ ok: true, committed: "3" });
    expect(h.queue.results.filter((r) => r.requestId === id)).toHaveLength(1);
  });

  it("ok = false, reason ended: a new item or an offset past the end of an ended job; nothing stored", async () => {
    const id = randomUUID();
    await send(h.client, [line(id, "a"), end(id)]);
    expect(await send(h.client, [line(id, "more")], { offset: 2 })).toMatchObject({
      ok: false,
      reason: "ended",
      committed: "2",
    });
    // Item 1 was the end (a duplicate); item 2 is new.
    expect(await send(h.client, [line(id, "dup"), line(id, "more")], { offset: 1 })).toMatchObject({
      ok: false,
      reason: "ended",
      committed: "2",
    });
    expect(await send(h.client, [line(id, "x")], { offset: 9 })).toMatchObject({
      ok: false,
      reason: "ended",
      committed: "2",
    });
    expect(await storedTexts(h.logs, id)).toEqual(["a"]);
    expect(h.queue.results.filter((r) => r.requestId === id)).toHaveLength(1);
  });

  it("cancelJob publishes outcome cancelled at once; the runner's next call gets ok = false, reason cancelled", async () => {
    const id = randomUUID();
    await h.runner.expectJob(id, { repoUrl: "https://git.example/r.git", commitSha: "c0ffee" });
    await send(h.client, [line(id, "a"), line(id, "b", true)]);
    const result = await h.runner.cancelJob(id, "operator pressed stop");
    expect(result).toMatchObject({
      requestId: id,
      outcome: "cancelled",
      exitCode: -1,
      success: false,
      repoUrl: "https://git.example/r.git",
      commitSha: "c0ffee",
      lines: { stdout: 1, stderr: 1 },
    });
    expect(result!.startedAt).not.toBeNull();
    const out = await send(h.client, [line(id, "c")], { offset: 2 });
    expect(out).toMatchObject({ ok: false, reason: "cancelled", committed: "2" });
    // The host's reason text is not sent to the runner.
    expect(JSON.stringify(out)).not.toContain("operator");
    expect(await storedTexts(h.logs, id)).toEqual(["a", "b"]);
    expect(h.queue.results.filter((r) => r.requestId === id)).toEqual([result]);
    // Cancelling again, or after the end, publishes nothing.
    expect(await h.runner.cancelJob(id)).toBeNull();
    expect(h.queue.results.filter((r) => r.requestId === id)).toHaveLength(1);
  });

  it("cancelJob on an ID never seen still publishes a result (startedAt null, empty repo)", async () => {
    const id = randomUUID();
    const result = await h.runner.cancelJob(id);
    expect(result).toMatchObject({
      requestId: id,
      outcome: "cancelled",
      exitCode: -1,
      success: false,
      repoUrl: "",
      commitSha: "",
      startedAt: null,
    });
    expect(h.queue.results.filter((r) => r.requestId === id)).toHaveLength(1);
  });

  it("cancellation takes effect in a call in flight at its next item; later items are not stored", async () => {
    const id = randomUUID();
    const stream = controlledStream();
    const pending = send(h.client, stream.items);
    stream.push(line(id, "a"));
    await until(async () => (await h.logs.get(id))?.committed === 1, "first line stored");
    await h.runner.cancelJob(id);
    stream.push(line(id, "b"));
    stream.push(line(id, "c"));
    stream.close();
    expect(await pending).toMatchObject({ ok: false, reason: "cancelled", committed: "1" });
    expect(await storedTexts(h.logs, id)).toEqual(["a"]);
  });

  it("ABORTED: a newer call of the same job wins; the older ends at once with committed", async () => {
    const id = randomUUID();
    const older = controlledStream();
    const olderOut = send(h.client, older.items);
    older.push(line(id, "a"));
    await until(async () => (await h.logs.get(id))?.committed === 1, "older call stored its line");
    // The older call is still open (its runner has not finished sending).
    const newer = await send(h.client, [line(id, "a"), line(id, "b")], { offset: 0 });
    expect(newer).toMatchObject({ ok: true, committed: "2" });
    const out = await olderOut;
    expect(out.code).toBe("Aborted");
    expect(Number(out.committed)).toBeGreaterThanOrEqual(1);
    // Whatever the older call still sends is not stored.
    older.push(line(id, "from the older call"));
    older.close();
    expect(await storedTexts(h.logs, id)).toEqual(["a", "b"]);
  });

  it("UNAVAILABLE while the queue is down: the end is not counted; the replayed end publishes once", async () => {
    const id = randomUUID();
    h.queue.down = true;
    let out;
    try {
      out = await send(h.client, [...lines(id, 0, 3), end(id, 0)]);
    } finally {
      h.queue.down = false;
    }
    expect(out).toMatchObject({ code: "Unavailable", committed: "3" });
    expect(await storedTexts(h.logs, id)).toEqual(texts(0, 3));
    expect(h.queue.results.filter((r) => r.requestId === id)).toHaveLength(0);
    expect(await h.logs.get(id)).toMatchObject({ status: "open", committed: 3 });
    // The agent replays from committed: the end is appended and published once.
    expect(await send(h.client, [end(id, 0)], { offset: 3 })).toMatchObject({ ok: true, committed: "4" });
    expect(h.queue.results.filter((r) => r.requestId === id)).toHaveLength(1);
  });

  it("a queue that refuses a couple of times within the retry bound still yields ok = true and one result", async () => {
    const id = randomUUID();
    h.queue.failNext(2);
    expect(await send(h.client, [line(id, "a"), end(id)])).toMatchObject({ ok: true, committed: "2" });
    expect(h.queue.results.filter((r) => r.requestId === id)).toHaveLength(1);
  });

  it("follow() replays stored lines, then tails new ones until the job ends", async () => {
    const id = randomUUID();
    await send(h.client, lines(id, 0, 3));
    const seen: string[] = [];
    const following = (async () => {
      for await (const l of h.runner.follow(id)) seen.push(l.line);
    })();
    await until(() => seen.length === 3, "replayed lines");
    await send(h.client, [...lines(id, 3, 6), end(id)], { offset: 3 });
    await following;
    expect(seen).toEqual(texts(0, 6));
  });

  it("the Connect protocol on the same port: Ack and runner-committed in trailers and error metadata", async () => {
    const client = createClient(Runner, createConnectTransport({ baseUrl: h.server.url, httpVersion: "2" }));
    const id = randomUUID();
    expect(await send(client, [line(id, "a"), line(id, "b")])).toMatchObject({ ok: true, committed: "2" });
    expect(await send(client, [line(id, "z")], { offset: 7 })).toMatchObject({
      code: "FailedPrecondition",
      committed: "2",
    });
    expect(await send(client, [line(id, "c"), end(id)], { offset: 2 })).toMatchObject({ ok: true, committed: "4" });
    expect(await send(client, [line(id, "d")], { offset: 4 })).toMatchObject({
      ok: false,
      reason: "ended",
      committed: "4",
    });
  });

  it("the trailer appears exactly once in gRPC error trailers (not doubled)", async () => {
    const id = randomUUID();
    await send(h.client, [line(id, "a")]);
    const out = await send(h.client, [line(id, "x")], { offset: 4 });
    expect(out.committed).toBe("1");
  });
});

describe("runner service: tokens", () => {
  const secret = "s3cret-key";
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness({ secret, memoryStore: true });
  });
  afterAll(async () => {
    await h.close();
  });

  it("mintJobToken is base64url HMAC-SHA256 over the lower-case ID, without padding", async () => {
    const { createHmac } = await import("node:crypto");
    const id = "ABCDEF01-2345-6789-ABCD-EF0123456789";
    const expected = createHmac("sha256", Buffer.from(secret))
      .update(id.toLowerCase())
      .digest("base64")
      .replace(/\+/g, "-")
      .replace(/\//g, "_")
      .replace(/=+$/, "");
    expect(mintJobToken(secret, id)).toBe(expected);
    expect(mintJobToken(new TextEncoder().encode(secret), id)).toBe(expected);
    expect(mintJobToken(secret, id)).not.toMatch(/[=+/]/);
  });

  it("the right token streams; an upper-case ID with the lower-case token too", async () => {
    const id = randomUUID();
    expect(
      await send(h.client, [line(id.toUpperCase(), "a"), end(id)], { token: mintJobToken(secret, id) }),
    ).toMatchObject({ ok: true, committed: "2" });
  });

  it.each([
    ["missing", undefined],
    ["another scheme", "Basic dXNlcjpwYXNz"],
    ["bare word", "Bearer"],
    ["two words", "Bearer a b"],
  ])("UNAUTHENTICATED when authorization is %s; nothing stored", async (_name, value) => {
    const id = randomUUID();
    const out = await send(h.client, [line(id, "a")], value === undefined ? {} : { headers: { authorization: value } });
    expect(out.code).toBe("Unauthenticated");
    expect(await h.logs.get(id)).toBeNull();
  });

  it("PERMISSION_DENIED for a token of another job or another secret; nothing stored", async () => {
    const id = randomUUID();
    expect((await send(h.client, [line(id, "a")], { token: mintJobToken(secret, randomUUID()) })).code).toBe(
      "PermissionDenied",
    );
    expect((await send(h.client, [line(id, "a")], { token: mintJobToken("other", id) })).code).toBe("PermissionDenied");
    expect((await send(h.client, [line(id, "a")], { token: "short" })).code).toBe("PermissionDenied");
    expect(await h.logs.get(id)).toBeNull();
  });

  it("check order: a malformed token beats a bad UUID; a bad UUID beats a wrong token", async () => {
    expect((await send(h.client, [line("nope", "a")])).code).toBe("Unauthenticated");
    expect((await send(h.client, [line("nope", "a")], { token: mintJobToken(secret, randomUUID()) })).code).toBe(
      "InvalidArgument",
    );
  });

  it("a newer call with a wrong token does not abort the job's call in flight", async () => {
    const id = randomUUID();
    const token = mintJobToken(secret, id);
    const stream = controlledStream();
    const pending = send(h.client, stream.items, { token });
    stream.push(line(id, "a"));
    await until(async () => (await h.logs.get(id))?.committed === 1, "line stored");
    expect((await send(h.client, [line(id, "evil")], { token: mintJobToken(secret, randomUUID()) })).code).toBe(
      "PermissionDenied",
    );
    stream.push(line(id, "b"));
    stream.close();
    expect(await pending).toMatchObject({ ok: true, committed: "2" });
  });
});

describe("runner service: authorize hook, known jobs, lost jobs", () => {
  it("an authorize hook replaces the token check and sees the request ID and headers", async () => {
    const seen: string[] = [];
    const h = await startHarness({
      memoryStore: true,
      authorize: ({ requestId, headers }) => {
        seen.push(requestId);
        if (headers.get("x-fleet") !== "blue") throw new Error("wrong fleet");
      },
    });
    try {
      const id = randomUUID();
      expect(await send(h.client, [line(id, "a")], { headers: { "x-fleet": "blue" } })).toMatchObject({
        ok: true,
        committed: "1",
      });
      expect((await send(h.client, [line(id, "b")], { headers: { "x-fleet": "red" }, offset: 1 })).code).toBe(
        "PermissionDenied",
      );
      expect(seen).toEqual([id, id]);
      expect(h.runner.acceptsAnyCaller).toBe(false);
    } finally {
      await h.close();
    }
  });

  it("NOT_FOUND for an unknown job with requireKnownJobs; expectJob lets it in", async () => {
    const h = await startHarness({ memoryStore: true, requireKnownJobs: true });
    try {
      const id = randomUUID();
      expect((await send(h.client, [line(id, "a")])).code).toBe("NotFound");
      expect(await h.logs.get(id)).toBeNull();
      await h.runner.expectJob(id);
      expect(await send(h.client, [line(id, "a")])).toMatchObject({ ok: true, committed: "1" });
    } finally {
      await h.close();
    }
  });

  it("a silent job is declared lost: outcome lost published once; the runner then gets ok = false, reason lost", async () => {
    const h = await startHarness({ memoryStore: true, lostAfterMs: 200, sweepIntervalMs: 20 });
    try {
      const quiet = randomUUID();
      const talking = randomUUID();
      await h.runner.expectJob(quiet, { repoUrl: "https://git.example/q.git" });
      await send(h.client, [line(talking, "a", true)]);
      const results: JobResult[] = [await h.queue.next(), await h.queue.next()];
      const byId = (x: string) => results.find((r) => r.requestId === x)!;
      expect(byId(quiet)).toMatchObject({
        outcome: "lost",
        exitCode: -1,
        success: false,
        repoUrl: "https://git.example/q.git",
        startedAt: null,
      });
      expect(byId(talking)).toMatchObject({
        outcome: "lost",
        exitCode: -1,
        success: false,
        lines: { stdout: 0, stderr: 1 },
      });
      expect(byId(talking).startedAt).not.toBeNull();
      expect(await send(h.client, [line(talking, "b")], { offset: 1 })).toMatchObject({
        ok: false,
        reason: "lost",
        committed: "1",
      });
      expect(await send(h.client, [end(quiet)])).toMatchObject({ ok: false, reason: "lost", committed: "0" });
      expect(h.queue.results).toHaveLength(2);
    } finally {
      await h.close();
    }
  });

  it("a lost or cancelled result is retried until the queue accepts it", async () => {
    const h = await startHarness({ memoryStore: true, publishRetry: { initialDelayMs: 5, maxDelayMs: 20 } });
    try {
      const id = randomUUID();
      h.queue.down = true;
      const cancelled = h.runner.cancelJob(id);
      await until(() => h.queue.attempts >= 3, "several refused attempts");
      // Meanwhile the job is already treated as cancelled.
      expect(await send(h.client, [line(id, "a")])).toMatchObject({ ok: false, reason: "cancelled" });
      h.queue.down = false;
      expect(await cancelled).toMatchObject({ outcome: "cancelled" });
      expect(h.queue.results).toHaveLength(1);
    } finally {
      await h.close();
    }
  });

  it("retention: an ended job is forgotten by the sweep once retentionMs (at least lostAfterMs) has passed", async () => {
    const h = await startHarness({ memoryStore: true, lostAfterMs: 60, retentionMs: 1_500, sweepIntervalMs: 20 });
    try {
      const id = randomUUID();
      expect(await send(h.client, [line(id, "a"), end(id)])).toMatchObject({ ok: true, committed: "2" });
      expect(await h.logs.get(id)).toMatchObject({ status: "finished" });
      await until(async () => (await h.logs.get(id)) === null, "the job pruned");
      expect(h.queue.results.filter((r) => r.requestId === id)).toHaveLength(1);
    } finally {
      await h.close();
    }
  });

  it("hooks: onLog sees stored lines, onEnd the result", async () => {
    const logged: string[] = [];
    const ended: JobResult[] = [];
    const h = await startHarness({
      memoryStore: true,
      onLog: ({ lines: l }) => logged.push(...l.map((x) => x.line)),
      onEnd: (r) => ended.push(r),
    });
    try {
      const id = randomUUID();
      await send(h.client, [line(id, "a"), line(id, "b"), end(id)]);
      expect(logged).toEqual(["a", "b"]);
      expect(ended.map((r) => r.requestId)).toEqual([id]);
    } finally {
      await h.close();
    }
  });

  it("an item built by hand with an ID that differs only in case is not a mixed ID", async () => {
    const h = await startHarness({ memoryStore: true });
    try {
      const id = randomUUID();
      const items = [
        line(id, "a"),
        create(LogItemSchema, {
          requestId: id.toUpperCase(),
          event: { case: "log", value: { line: "b", stderr: false } },
        }),
      ];
      expect(await send(h.client, items)).toMatchObject({ ok: true, committed: "2" });
    } finally {
      await h.close();
    }
  });
});
