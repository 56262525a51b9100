/**
 * The leanest ingest this stack allows, as a ceiling for bench/runner-line-time.ts (issue 23): what the end-to-end
 * rate could be if the agent and the server did only what the wire needs. Not a product path: no spool, retries,
 * masking, rules, cap or store port; a frame the template does not fit is an error, not a fallback.
 *
 * - {@link leanJob}, the agent: the child's pipe read into one reused buffer (`readPipe`), lines cut at `\n`, each
 *   written as its gRPC frame by the project's encoder (request_id, line, time) into 64 KiB chunks that go to one
 *   HTTP/2 request as they fill; reading pauses while the stream's buffer is over node's mark (16 KiB).
 * - {@link startLeanServer}, the server: each request chunk copied whole into 1 MiB blocks (one copy a chunk, never a
 *   line), then, in `frames` mode, only the frames' lengths walked; in `template` mode every frame decoded against
 *   the call's first: the same request_id (word compares), the log field's layout, the line's bytes ASCII, its time,
 *   each line's offsets and time kept in typed arrays. Both answer the number of frames.
 */
import { spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { once } from "node:events";
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { readPipe } from "../src/runner/agent/pipe-reader.js";
import { createLogItemEncoder } from "../src/runner/protocol/encoder.js";

/** Windows as wide as ours gives a busy call (runner/server/flow-window.ts). */
const WINDOW = 1024 * 1024;
const BLOCK = 1024 * 1024;
const CHUNK = 64 * 1024;

/** How the lean server reads a call: frame lengths only, or every frame decoded against a template. */
export type LeanMode = "frames" | "template";

/**
 * One call's storage: whole request chunks back to back in blocks; per line its offsets and time. Throws on a frame
 * the template does not fit (test/bench/lean-pipeline.test.ts).
 *
 * @example
 * const call = new LeanCall("template");
 * call.push(chunk); // call.count: frames read so far
 */
export class LeanCall {
  private block = Buffer.allocUnsafe(BLOCK);
  /** Every block of the call (kept, as a store keeps a job's lines) and the first line read in each. */
  private readonly blocks: Buffer[] = [this.block];
  private readonly blockFirst: number[] = [0];
  private view = new DataView(this.block.buffer, this.block.byteOffset, this.block.length);
  /** Bytes of the block written; `frame` is where the first frame not yet read starts. */
  private used = 0;
  private frame = 0;
  private id: number[] | null = null;
  private starts = new Uint32Array(1 << 16);
  private ends = new Uint32Array(1 << 16);
  private times = new Float64Array(1 << 16);
  /** Frames read. */
  count = 0;

  constructor(private readonly mode: LeanMode) {}

  /** Copies the chunk after the last (a new block takes the unread frame's bytes along), then reads its frames. */
  push(chunk: Buffer): void {
    if (this.block.length - this.used < chunk.length) {
      const next = Buffer.allocUnsafe(Math.max(BLOCK, chunk.length + this.used - this.frame));
      this.block.copy(next, 0, this.frame, this.used);
      this.used -= this.frame;
      this.frame = 0;
      this.block = next;
      this.blocks.push(next);
      this.blockFirst.push(this.count);
      this.view = new DataView(next.buffer, next.byteOffset, next.length);
    }
    chunk.copy(this.block, this.used);
    this.used += chunk.length;
    while (this.frame + 5 <= this.used) {
      const end = this.frame + 5 + this.view.getUint32(this.frame + 1);
      if (end > this.used) break;
      if (this.mode === "template") this.decode(this.frame + 5, end);
      else this.count++;
      this.frame = end;
    }
  }

  /** One frame against the template: what the fast path checks of a plain line, without an object a line. */
  private decode(start: number, end: number): void {
    const b = this.block;
    const v = this.view;
    if (b[start] !== 0x0a || b[start + 1] !== 36) throw new Error("lean: not a 36-byte request_id");
    if (this.id === null) this.id = Array.from({ length: 9 }, (_, k) => v.getUint32(start + 2 + 4 * k));
    for (let k = 0; k < 9; k++) if (v.getUint32(start + 2 + 4 * k) !== this.id[k]) throw new Error("lean: request_id");
    let p = start + 38;
    if (b[p] !== 0x12 || b[p + 1]! >= 0x80) throw new Error("lean: layout");
    const stop = p + 2 + b[p + 1]!;
    // An empty line has no line field (proto3 leaves out an empty string).
    const hasLine = p + 2 < stop && b[p + 2] === 0x0a;
    if (hasLine && b[p + 3]! >= 0x80) throw new Error("lean: layout");
    const lineStart = hasLine ? p + 4 : p + 2;
    const lineEnd = hasLine ? lineStart + b[p + 3]! : lineStart;
    if (stop !== end || lineEnd > stop) throw new Error("lean: lengths");
    let acc = 0;
    let i = lineStart;
    for (; i + 16 <= lineEnd; i += 16)
      acc |= v.getUint32(i, true) | v.getUint32(i + 4, true) | v.getUint32(i + 8, true) | v.getUint32(i + 12, true);
    for (; i < lineEnd; i++) acc |= b[i]!;
    if ((acc & 0x80808080) !== 0) throw new Error("lean: not ASCII");
    p = lineEnd;
    let time = 0;
    if (p < stop && b[p] === 0x19) {
      // fixed64 nanoseconds since the epoch, as ms (what the service keeps, to the µs).
      time = (v.getUint32(p + 5, true) * 0x100000000 + v.getUint32(p + 1, true)) / 1e6;
      p += 9;
    }
    if (p !== stop) throw new Error("lean: trailing fields");
    if (this.count === this.ends.length) this.grow();
    this.starts[this.count] = lineStart;
    this.ends[this.count] = lineEnd;
    this.times[this.count] = time;
    this.count++;
  }

  /** Line `i` as kept (template mode): its text and time. */
  line(i: number): { text: string; time: number } {
    let b = this.blocks.length - 1;
    while (this.blockFirst[b]! > i) b--;
    return { text: this.blocks[b]!.toString("latin1", this.starts[i], this.ends[i]), time: this.times[i]! };
  }

  private grow(): void {
    const n = this.count * 2;
    const starts = new Uint32Array(n);
    starts.set(this.starts);
    const ends = new Uint32Array(n);
    ends.set(this.ends);
    const times = new Float64Array(n);
    times.set(this.times);
    [this.starts, this.ends, this.times] = [starts, ends, times];
  }
}

/**
 * Starts the lean server on 127.0.0.1; every stream is one call, answered with its frame count.
 *
 * @example
 * const { port, close } = await startLeanServer("template");
 */
export async function startLeanServer(mode: LeanMode): Promise<{ port: number; close(): Promise<void> }> {
  const server = http2.createServer({ settings: { initialWindowSize: WINDOW } });
  server.on("session", (session) => session.setLocalWindowSize(WINDOW));
  server.on("stream", (stream) => {
    const call = new LeanCall(mode);
    stream.on("data", (chunk: Buffer) => call.push(chunk));
    stream.on("end", () => {
      stream.respond({ ":status": 200 });
      stream.end(String(call.count));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    port: (server.address() as AddressInfo).port,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

/**
 * One job through the lean agent to the lean server at `port`: `command` run, its lines framed and sent; resolves
 * once the server has answered, with the number of lines it read (the caller checks it).
 *
 * @example
 * const frames = await leanJob(port, "sh", ["-c", "yes | head -n 1000"]);
 */
export async function leanJob(port: number, command: string, args: string[]): Promise<number> {
  const session = http2.connect(`http://127.0.0.1:${port}`, { settings: { initialWindowSize: WINDOW } });
  try {
    await once(session, "connect");
    const enc = createLogItemEncoder(randomUUID());
    const req = session.request({ ":method": "POST", ":path": "/lean" });
    let answer = "";
    req.setEncoding("utf8");
    req.on("data", (d: string) => (answer += d));
    const answered = once(req, "end");
    let out = Buffer.allocUnsafe(CHUNK);
    let pos = 0;
    // The unfinished last line of a read, copied (the read buffer is reused).
    let tail: Buffer | null = null;
    // The reader pauses while the stream's buffer is over its mark, as the agent's high-water mark makes it.
    let paused = false;
    let reader: { pause(): void; resume(): void } | null = null;
    const frame = (src: Buffer, start: number, end: number, time: number) => {
      if (out.length - pos < end - start + 64) {
        if (!req.write(out.subarray(0, pos)) && !paused) {
          paused = true;
          reader?.pause();
          req.once("drain", () => {
            paused = false;
            reader?.resume();
          });
        }
        out = Buffer.allocUnsafe(Math.max(CHUNK, end - start + 64));
        pos = 0;
      }
      pos = enc.writeLogFrameBytes(out, pos, src, start, end, false, time);
    };
    const child = spawn(command, args, { stdio: ["ignore", "pipe", "inherit"] });
    const pipe = readPipe(
      child.stdout,
      (read) => {
        const time = Date.now();
        let start = 0;
        let nl = read.indexOf(10);
        if (tail !== null && nl !== -1) {
          const line = Buffer.concat([tail, read.subarray(0, nl)]);
          tail = null;
          frame(line, 0, line.length, time);
          start = nl + 1;
          nl = read.indexOf(10, start);
        }
        for (; nl !== -1; nl = read.indexOf(10, start)) {
          frame(read, start, nl, time);
          start = nl + 1;
        }
        if (start < read.length)
          tail = Buffer.concat(tail === null ? [read.subarray(start)] : [tail, read.subarray(start)]);
      },
      () => undefined,
    );
    reader = pipe;
    await Promise.all([once(child, "exit"), pipe.done]);
    if (pos > 0) req.write(out.subarray(0, pos));
    req.end();
    await answered;
    return Number(answer);
  } finally {
    session.close();
  }
}
