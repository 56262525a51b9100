import { randomUUID } from "node:crypto";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { LeanCall, leanJob, startLeanServer } from "../../bench/lean-pipeline.js";
import { createLogItemEncoder } from "../../src/runner/protocol/encoder.js";

/** The frames the agent's encoder makes of `lines` (ASCII, under 128 bytes), back to back. */
function frames(requestId: string, lines: string[], time: number): Buffer {
  const enc = createLogItemEncoder(requestId);
  const buf = Buffer.alloc(lines.length * 200 + 64);
  let pos = 0;
  for (const line of lines) {
    const src = Buffer.from(line, "latin1");
    pos = enc.writeLogFrameBytes(buf, pos, src, 0, src.length, false, time);
  }
  return buf.subarray(0, pos);
}

/** `buf` cut at the given points (sorted, deduplicated, within it). */
function cut(buf: Buffer, at: number[]): Buffer[] {
  const points = [...new Set(at.map((a) => a % (buf.length + 1)))].sort((a, b) => a - b);
  const out: Buffer[] = [];
  let from = 0;
  for (const p of [...points, buf.length]) {
    out.push(buf.subarray(from, p));
    from = p;
  }
  return out;
}

const asciiLine = fc.string({
  unit: fc.integer({ min: 0x20, max: 0x7e }).map((c) => String.fromCharCode(c)),
  maxLength: 110,
});

describe("the ceiling's lean server (bench/lean-pipeline.ts)", () => {
  it("reads every frame the encoder makes, however the body is cut, with its line and time", () => {
    fc.assert(
      fc.property(fc.array(asciiLine, { maxLength: 60 }), fc.array(fc.nat(), { maxLength: 20 }), (lines, at) => {
        const time = 1_764_480_000_000.5;
        const call = new LeanCall("template");
        for (const chunk of cut(frames(randomUUID(), lines, time), at)) call.push(chunk);
        expect(call.count).toBe(lines.length);
        lines.forEach((line, i) => {
          const kept = call.line(i);
          expect(kept.text).toBe(line);
          // The stamp to the µs the wire carries (ms, as the service keeps it).
          expect(Math.abs(kept.time - time)).toBeLessThan(0.001);
        });
      }),
      { numRuns: 200 },
    );
  });

  it("refuses a frame of another request_id, and a line that is not ASCII", () => {
    const call = new LeanCall("template");
    call.push(frames("6f1c1a3e-9b7d-4c55-8f0e-2a1b3c4d5e6f", ["first"], 1));
    expect(() => call.push(frames("6f1c1a3e-9b7d-4c55-8f0e-2a1b3c4d5e70", ["second"], 1))).toThrow(/request_id/);
    const other = new LeanCall("template");
    expect(() => other.push(frames(randomUUID(), ["caf\u00e9"], 1))).toThrow(/ASCII/);
  });

  it("counts a job's lines end to end over a real HTTP/2 socket, in both modes", async () => {
    for (const mode of ["frames", "template"] as const) {
      const server = await startLeanServer(mode);
      try {
        expect(await leanJob(server.port, "sh", ["-c", "yes 'a line of output' | head -n 20000"])).toBe(20_000);
      } finally {
        await server.close();
      }
    }
  });
});
