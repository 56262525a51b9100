/**
 * Every limit of the runner contract, provoked with small configured values through a
 * real gRPC client: message size, line size (cut + marker), job-log cap (marker,
 * counted lines, logTruncated) and the idle deadline.
 */
import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  controlledStream,
  end,
  line,
  send,
  startHarness,
  storedTexts,
  until,
  type Harness,
} from "../../fixtures/runner-service.js";
import { cutUtf8 } from "../../../src/runner/agent/line-splitter.js";
import { LINE_RECORD_OVERHEAD } from "../../../src/runner/service/log-cap.js";
import { connect, frame, openCall } from "../../fixtures/runner-raw-calls.js";

describe("runner limits", () => {
  // The size limits' server keeps the default idle bound (60 s): a call of these tests
  // waiting a few hundred ms for its next item on a loaded CI machine (late timers, a
  // stalled process) must not be cut by a bound they are not about. The idle tests get a
  // server of their own with a short one.
  let h: Harness;
  let idle: Harness;
  beforeAll(async () => {
    h = await startHarness({ limits: { messageBytes: 2048, lineBytes: 16, jobLogBytes: 192, tailBytes: 0 } });
    idle = await startHarness({ limits: { idleMs: 1_000 } });
  });
  afterAll(async () => {
    await h.close();
    await idle.close();
  });

  it("RESOURCE_EXHAUSTED for a message over messageBytes; items before it stay stored, committed says how many", async () => {
    const id = randomUUID();
    const out = await send(h.client, [line(id, "a"), line(id, "b"), line(id, "x".repeat(4000)), line(id, "c")]);
    expect(out).toMatchObject({ code: "ResourceExhausted", committed: "2" });
    expect(await storedTexts(h.logs, id)).toEqual(["a", "b"]);
    // The agent splits the line and goes on from committed.
    expect(await send(h.client, [line(id, "x".repeat(10)), end(id)], { offset: 2 })).toMatchObject({
      ok: true,
      committed: "4",
    });
  });

  it("RESOURCE_EXHAUSTED with committed also for a message far over the limit (refused by the wire decoder)", async () => {
    const id = randomUUID();
    await send(h.client, [line(id, "a")]);
    const out = await send(h.client, [line(id, "b"), line(id, "y".repeat(100_000))], { offset: 1 });
    expect(out.code).toBe("ResourceExhausted");
    // Whatever was stored is reported; nothing stored is lost.
    const committed = Number(out.committed);
    expect(committed).toBeGreaterThanOrEqual(1);
    expect(await storedTexts(h.logs, id)).toEqual(["a", "b"].slice(0, committed));
  });

  it("a line over lineBytes is cut at a UTF-8 character boundary and followed by a separate marker line", async () => {
    const id = randomUUID();
    // 15 ASCII bytes then a 3-byte character straddling the 16-byte limit.
    const long = "abcdefghijklmno€tail";
    const out = await send(h.client, [line(id, long, true), line(id, "short")]);
    expect(out).toMatchObject({ ok: true, committed: "2" });
    const stored = await h.logs.read(id);
    expect(stored).toHaveLength(3);
    // The items carry no time: each line gets the server's receive time, marked; the marker its line's.
    expect(stored[0]).toEqual({ line: "abcdefghijklmno", stderr: true, time: expect.any(Number), serverTime: true });
    expect(stored[1]).toMatchObject({ marker: true, stderr: true, time: stored[0]!.time, serverTime: true });
    expect(stored[1]!.line).toContain("truncated");
    expect(stored[2]).toEqual({ line: "short", stderr: false, time: expect.any(Number), serverTime: true });
    // Offsets count items, not stored lines.
    // Each stored line counts toward the cap, the marker too (log-cap.ts).
    expect(await h.logs.get(id)).toMatchObject({
      committed: 2,
      storedLines: 3,
      storedBytes: LINE_RECORD_OVERHEAD * 3 + 15 + Buffer.byteLength(stored[1]!.line) + 5,
    });
  });

  it("cutUtf8 never splits a character (1-, 2-, 3- and 4-byte characters at every limit)", () => {
    const text = "aé€😀b";
    for (let max = 0; max <= Buffer.byteLength(text); max++) {
      const cut = cutUtf8(text, max);
      expect(cut.bytes).toBeLessThanOrEqual(max);
      expect(Buffer.byteLength(cut.text)).toBe(cut.bytes);
      expect(text.startsWith(cut.text)).toBe(true);
      expect(cut.text).not.toContain("\ufffd");
    }
  });

  it("past jobLogBytes lines are counted, not stored; one marker; logTruncated in the result; the job does not fail", async () => {
    const id = randomUUID();
    // 8 lines of 10 bytes, each counting 16 + 10: 7 fit in 192 bytes, the 8th hits the cap.
    const items = Array.from({ length: 8 }, (_, i) => line(id, `line-${String(i).padStart(5, "0")}`, i === 7));
    expect(await send(h.client, items)).toMatchObject({ ok: true, committed: "8" });
    // A later call of the same job: still counted, still not stored, no second marker.
    expect(
      await send(h.client, [line(id, "more-stdout"), line(id, "more-stderr", true), end(id, 0)], { offset: 8 }),
    ).toMatchObject({
      ok: true,
      committed: "11",
    });
    const stored = await h.logs.read(id);
    expect(stored.filter((l) => !l.marker).map((l) => l.line)).toEqual(
      Array.from({ length: 7 }, (_, i) => `line-0000${i}`),
    );
    expect(stored.filter((l) => l.marker)).toHaveLength(1);
    expect(stored.at(-1)!.line).toContain("log truncated");
    const state = await h.logs.get(id);
    expect(state).toMatchObject({ storedBytes: 7 * (LINE_RECORD_OVERHEAD + 10), logTruncated: true, committed: 11 });
    const result = h.queue.results.find((r) => r.requestId === id)!;
    expect(result).toMatchObject({
      outcome: "finished",
      success: true,
      logTruncated: true,
      lines: { stdout: 8, stderr: 2 },
    });
  });

  it("DEADLINE_EXCEEDED when no item arrives for idleMs; what came before is stored and committed", async () => {
    const id = randomUUID();
    const stream = controlledStream();
    const pending = send(idle.client, stream.items);
    // Pushed together: b is 1 s of idle bound behind a, slack for a stalled process.
    stream.push(line(id, "a"));
    stream.push(line(id, "b"));
    const out = await pending;
    expect(out).toMatchObject({ code: "DeadlineExceeded", committed: "2" });
    expect(await storedTexts(idle.logs, id)).toEqual(["a", "b"]);
    stream.close();
  });

  it("DEADLINE_EXCEEDED for a call that never sends its first item (no job known, no committed)", async () => {
    const stream = controlledStream();
    const out = await send(idle.client, stream.items);
    expect(out.code).toBe("DeadlineExceeded");
    expect(out.committed).toBeNull();
    stream.close();
  });

  it("DEADLINE_EXCEEDED with committed when the call's own grpc-timeout passes (a raw client that does not cancel itself sees the server's answer)", async () => {
    const session = connect(h.server.url);
    try {
      const id = randomUUID();
      // A long idle bound on this server: only the call's deadline can end it.
      const call = openCall(session, "grpc", "any", { "grpc-timeout": "1S" });
      call.stream.write(frame(line(id, "a")));
      const status = await call.status;
      expect(status).toMatchObject({ code: 4, committed: "1" });
      expect(status.message).toContain("grpc-timeout");
      expect(await storedTexts(h.logs, id)).toEqual(["a"]);
    } finally {
      session.destroy();
    }
  });

  it("a call that keeps sending within idleMs is not cut, however long it lasts", async () => {
    // Its own server with a 2 s idle bound: gaps of 250 ms leave 1.75 s of slack for a
    // loaded CI machine's late timers, and 12 gaps make the call outlast the bound.
    const slow = await startHarness({ limits: { idleMs: 2_000 } });
    try {
      const id = randomUUID();
      const stream = controlledStream();
      const pending = send(slow.client, stream.items);
      const started = Date.now();
      for (let i = 0; i < 12; i++) {
        stream.push(line(id, `l${i}`));
        await until(async () => (await slow.logs.get(id))?.committed === i + 1, `line ${i}`);
        await new Promise((r) => setTimeout(r, 250));
      }
      stream.close();
      expect(await pending).toMatchObject({ ok: true, committed: "12" });
      expect(Date.now() - started).toBeGreaterThan(2_000);
    } finally {
      await slow.close();
    }
  });
});

describe("runner limits: configuration", () => {
  it("rejects non-positive limits", async () => {
    const { createRunnerService } = await import("../../../src/runner/index.js");
    const { createMemoryQueue } = await import("../../../src/adapters/memory/index.js");
    expect(() => createRunnerService(createMemoryQueue(), { limits: { lineBytes: 0 } })).toThrow(RangeError);
  });
});
