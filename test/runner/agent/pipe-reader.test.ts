/**
 * readPipe: a child's stdio pipe read into one reused buffer, every byte delivered in order,
 * the end once, pause and resume honoured, and node's own reads where the handle cannot be taken.
 */
import { spawn } from "node:child_process";
import { once } from "node:events";
import { PassThrough } from "node:stream";
import { describe, expect, it } from "vitest";
import { readPipe, PIPE_READ_BYTES } from "../../../src/runner/agent/pipe-reader.js";

/** A child writing `bytes` bytes of a known pattern to stdout, in writes of `piece` bytes. */
function writer(bytes: number, piece: number) {
  const script = `
    const b = Buffer.alloc(${bytes}); for (let i = 0; i < b.length; i++) b[i] = (i * 7 + (i >> 8)) & 0xff;
    let at = 0; const next = () => { while (at < b.length) { const end = Math.min(b.length, at + ${piece});
      const ok = process.stdout.write(b.subarray(at, end)); at = end; if (!ok) return process.stdout.once("drain", next); } };
    next();`;
  return spawn(process.execPath, ["-e", script], { stdio: ["ignore", "pipe", "pipe"] });
}

function expected(bytes: number): Buffer {
  const b = Buffer.alloc(bytes);
  for (let i = 0; i < b.length; i++) b[i] = (i * 7 + (i >> 8)) & 0xff;
  return b;
}

describe("readPipe", () => {
  it("delivers every byte in order through one reused buffer, the end once, then resolves done", async () => {
    const bytes = 3 * 1024 * 1024 + 17;
    const child = writer(bytes, 10_000);
    const got: Buffer[] = [];
    const memory = new Set<ArrayBufferLike>();
    let ends = 0;
    let endedBeforeDone = false;
    const reader = readPipe(
      child.stdout,
      (chunk) => {
        memory.add(chunk.buffer);
        expect(chunk.length).toBeLessThanOrEqual(PIPE_READ_BYTES);
        got.push(Buffer.from(chunk)); // the caller copies what outlives the call
      },
      () => ends++,
    );
    const errPipe = readPipe(
      child.stderr,
      () => undefined,
      () => undefined,
    );
    expect(reader.reused).toBe(true);
    await reader.done.then(() => (endedBeforeDone = ends === 1));
    await errPipe.done;
    expect(endedBeforeDone).toBe(true);
    expect(ends).toBe(1);
    expect(Buffer.concat(got).equals(expected(bytes))).toBe(true);
    // Node's own reads give each read fresh memory: 3 MiB is at least 48 of them.
    expect(memory.size).toBe(1);
  });

  it("reads nothing while paused, and everything after resume", async () => {
    const bytes = 1024 * 1024;
    const child = writer(bytes, 4096);
    let got = 0;
    let whilePaused = 0;
    let paused = false;
    const reader = readPipe(
      child.stdout,
      (chunk) => {
        if (paused) whilePaused += chunk.length;
        got += chunk.length;
        if (got > 100_000 && got - chunk.length <= 100_000) {
          paused = true;
          reader.pause();
          setTimeout(() => {
            paused = false;
            reader.resume();
          }, 200);
        }
      },
      () => undefined,
    );
    readPipe(
      child.stderr,
      () => undefined,
      () => undefined,
    );
    await reader.done;
    expect(whilePaused).toBe(0);
    expect(got).toBe(bytes);
  });

  it("the child's close still comes (at its exit); done waits for output a background process writes after it", async () => {
    const child = spawn("sh", ["-c", "echo first; (sleep 0.3; echo late) &"], { stdio: ["ignore", "pipe", "pipe"] });
    let text = "";
    const reader = readPipe(
      child.stdout,
      (b) => (text += b.toString()),
      () => undefined,
    );
    readPipe(
      child.stderr,
      () => undefined,
      () => undefined,
    );
    const [code] = (await once(child, "close")) as [number];
    expect(code).toBe(0);
    await reader.done;
    expect(text).toBe("first\nlate\n");
  });

  it("reads any other stream the usual way", async () => {
    const stream = new PassThrough();
    const got: string[] = [];
    let ended = false;
    const reader = readPipe(
      stream,
      (b) => got.push(b.toString()),
      () => (ended = true),
    );
    expect(reader.reused).toBe(false);
    stream.write("a");
    stream.end("b");
    await reader.done;
    expect(got.join("")).toBe("ab");
    expect(ended).toBe(true);
  });
});
