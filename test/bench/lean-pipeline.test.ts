import { randomUUID } from "node:crypto";
import { once } from "node:events";
import http2 from "node:http2";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { leanJob, leanRunsJob, runFramer, transportJob } from "../../bench/lean-agents.js";
import { LeanCall, startLeanServer } from "../../bench/lean-pipeline.js";
import { createLogItemEncoder } from "../../src/runner/protocol/encoder.js";
import { chunksOf } from "../fixtures/chunks.js";

/** The frames the agent's encoder makes of `lines` (ASCII, under 117 bytes), each with its own time, back to back. */
function frames(requestId: string, lines: { text: string; time: number }[]): Buffer {
  const enc = createLogItemEncoder(requestId);
  const buf = Buffer.alloc(lines.length * 200 + 64);
  let pos = 0;
  for (const { text, time } of lines) {
    const src = Buffer.from(text, "latin1");
    pos = enc.writeLogFrameBytes(buf, pos, src, 0, src.length, false, time);
  }
  return buf.subarray(0, pos);
}

const asciiLine = fc.string({
  unit: fc.integer({ min: 0x20, max: 0x7e }).map((c) => String.fromCharCode(c)),
  maxLength: 110,
});
const asciiLine300 = fc.string({
  unit: fc.integer({ min: 0x20, max: 0x7e }).map((c) => String.fromCharCode(c)),
  maxLength: 300,
});
// A time to the µs between 2020 and 2040, in ms.
const time = fc.integer({ min: 1_577_836_800_000_000, max: 2_208_988_800_000_000 }).map((us) => us / 1000);

/** The call kept exactly `lines`, in order, each with its time to the µs. */
function expectKept(call: LeanCall, lines: { text: string; time: number }[]): void {
  expect(call.count).toBe(lines.length);
  lines.forEach((line, i) => {
    const kept = call.line(i);
    expect(kept.text).toBe(line.text);
    expect(Math.abs(kept.time - line.time)).toBeLessThan(0.0005);
  });
}

describe("the lean pipeline's server (bench/lean-pipeline.ts)", () => {
  it("reads every frame the encoder makes, its line and time, however the body is cut and across blocks", () => {
    fc.assert(
      fc.property(
        fc.array(fc.record({ text: asciiLine, time }), { maxLength: 60 }),
        fc.array(fc.nat(), { maxLength: 20 }),
        fc.integer({ min: 64, max: 1024 }),
        (lines, at, blockBytes) => {
          // Blocks of 64 bytes to 1 KiB: most frames are carried into a new block, many split across chunks too.
          const call = new LeanCall("template", blockBytes);
          for (const chunk of chunksOf(frames(randomUUID(), lines), at)) call.push(chunk);
          expectKept(call, lines);
        },
      ),
      { numRuns: 300 },
    );
  });

  it("reads every line of runs in both layouts, their time, however the body is cut and across blocks", () => {
    fc.assert(
      fc.property(
        fc.constantFrom("joined", "fields"),
        // Each run a pipe read's whole lines (at least one, maybe empty); lines up to 300 bytes take two-byte varints.
        fc.array(fc.record({ lines: fc.array(asciiLine300, { minLength: 1, maxLength: 30 }), time }), {
          maxLength: 12,
        }),
        fc.array(fc.nat(), { maxLength: 20 }),
        fc.integer({ min: 64, max: 4096 }),
        (layout, runs, at, blockBytes) => {
          const framer = runFramer(layout, Buffer.from(randomUUID(), "latin1"));
          const parts = runs.map(({ lines, time }) => {
            const text = Buffer.from(lines.join("\n"), "latin1");
            const frame = Buffer.alloc(framer.size(text, 0, text.length));
            expect(framer.write(frame, 0, text, 0, text.length, time)).toBe(frame.length);
            return frame;
          });
          const call = new LeanCall(layout === "joined" ? "runs" : "fields", blockBytes);
          for (const chunk of chunksOf(Buffer.concat(parts), at)) call.push(chunk);
          expectKept(
            call,
            runs.flatMap(({ lines, time }) => lines.map((text) => ({ text, time }))),
          );
        },
      ),
      { numRuns: 300 },
    );
  });

  it("refuses each frame outside the template with its reason", () => {
    const at = { time: 1_764_480_000_000 };
    const id = randomUUID();
    const refusal = (frame: Buffer) => () => new LeanCall("template").push(frame);
    // A non-ASCII byte past the first 16-byte word, so the word loop is what must see it.
    expect(refusal(frames(id, [{ text: `${"x".repeat(20)}\u00e9${"x".repeat(20)}`, ...at }]))).toThrow(
      /^lean: not ASCII$/,
    );
    // A request_id that is not 36 bytes (the encoder leaves an empty one out).
    expect(refusal(frames("", [{ text: "x", ...at }]))).toThrow(/^lean: not a 36-byte request_id$/);
    // A line of 120 bytes: its length takes two varint bytes, outside the template.
    expect(refusal(frames(id, [{ text: "x".repeat(120), ...at }]))).toThrow(/^lean: layout$/);
    // A stderr flag after the line.
    const enc = createLogItemEncoder(id);
    const stderr = Buffer.alloc(200);
    const end = enc.writeLogFrameBytes(stderr, 0, Buffer.from("err"), 0, 3, true, at.time);
    expect(refusal(stderr.subarray(0, end))).toThrow(/^lean: trailing fields$/);
  });

  it("refuses another request_id, a line that is not ASCII, and a flagged frame", () => {
    const at = { time: 1_764_480_000_000 };
    const call = new LeanCall("template");
    call.push(frames("6f1c1a3e-9b7d-4c55-8f0e-2a1b3c4d5e6f", [{ text: "first", ...at }]));
    expect(() => call.push(frames("6f1c1a3e-9b7d-4c55-8f0e-2a1b3c4d5e70", [{ text: "second", ...at }]))).toThrow(
      /^lean: request_id$/,
    );
    expect(() => new LeanCall("template").push(frames(randomUUID(), [{ text: "caf\u00e9", ...at }]))).toThrow(
      /^lean: not ASCII$/,
    );
    const flagged = frames(randomUUID(), [{ text: "x", ...at }]);
    flagged[0] = 1;
    expect(() => new LeanCall("frames").push(flagged)).toThrow(/^lean: a flagged frame$/);
  });

  it("keeps every line of a job larger than its read-ahead, in order, split across pipe reads, in every layout", async () => {
    // 700,000 numbered lines (~4.6 MB of text, ~35 MB of frames a line): past the agent's 4 MiB read-ahead, so
    // its pause and resume run; lines cut across pipe reads are joined.
    const jobs = [
      ["template", (session: http2.ClientHttp2Session) => leanJob(session, "seq", ["1", "700000"])],
      ["runs", (session: http2.ClientHttp2Session) => leanRunsJob(session, "seq", ["1", "700000"], "joined")],
      ["fields", (session: http2.ClientHttp2Session) => leanRunsJob(session, "seq", ["1", "700000"], "fields")],
    ] as const;
    for (const [mode, job] of jobs) {
      let kept: LeanCall | null = null;
      const server = await startLeanServer(mode, (call) => (kept = call));
      const session = http2.connect(`http://127.0.0.1:${server.port}`);
      try {
        await once(session, "connect");
        expect(await job(session)).toBe(700_000);
        const call = kept as LeanCall | null;
        expect(call).not.toBeNull();
        for (let i = 0; i < 700_000; i++)
          if (call!.line(i).text !== String(i + 1)) expect(call!.line(i).text).toBe(String(i + 1));
      } finally {
        session.close();
        await server.close();
      }
    }
  });

  it("keeps empty lines, a read that is one newline, and frames larger than a chunk, in both run layouts", async () => {
    // Pauses make the pipe reads: "a" | "\n" (ends a tail) | "\n" (a read that is one empty line) | "\n\nb" | "\n" |
    // a 300,000-byte line | 70,000 empty lines (as fields,
    // a frame of ~140 KB: more than a chunk) | "end" without a newline.
    const script =
      "printf a; sleep 0.1; printf '\\n'; sleep 0.1; printf '\\n'; sleep 0.1; printf '\\n\\nb'; sleep 0.1; " +
      "printf '\\n'; sleep 0.1; " +
      "head -c 300000 /dev/zero | tr '\\0' x; echo; sleep 0.1; yes '' | head -n 70000; sleep 0.1; printf end";
    const want = ["a", "", "", "", "b", "x".repeat(300_000), ...Array<string>(70_000).fill(""), "end"];
    for (const layout of ["joined", "fields"] as const) {
      let kept: LeanCall | null = null;
      const server = await startLeanServer(layout === "joined" ? "runs" : "fields", (call) => (kept = call));
      const session = http2.connect(`http://127.0.0.1:${server.port}`);
      try {
        await once(session, "connect");
        expect(await leanRunsJob(session, "sh", ["-c", script], layout)).toBe(want.length);
        const call = kept as LeanCall | null;
        const got = Array.from({ length: call!.count }, (_, i) => call!.line(i).text);
        expect(got.slice(0, 6)).toEqual(want.slice(0, 6));
        expect(got).toEqual(want);
      } finally {
        session.close();
        await server.close();
      }
    }
  });

  it("streams a job end to end over a real HTTP/2 socket in every mode, a last line without a newline too", async () => {
    const job = ["-c", "yes 'a line of output' | head -n 20000; printf 'no newline'"];
    for (const mode of ["bytes", "frames", "template", "runs", "fields"] as const) {
      const server = await startLeanServer(mode);
      const session = http2.connect(`http://127.0.0.1:${server.port}`);
      try {
        await once(session, "connect");
        if (mode === "bytes") expect(await transportJob(session, "sh", job)).toBe(20_000 * 17 + 10);
        else if (mode === "runs") expect(await leanRunsJob(session, "sh", job, "joined")).toBe(20_001);
        else if (mode === "fields") expect(await leanRunsJob(session, "sh", job, "fields")).toBe(20_001);
        else expect(await leanJob(session, "sh", job)).toBe(20_001);
      } finally {
        session.close();
        await server.close();
      }
    }
  });
});
