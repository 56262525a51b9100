/**
 * A lean ingest, as reference rows of bench/runner-line-time.ts (issue 23): what the end-to-end rate comes to
 * when the agent and the server do little more than the wire needs. Not a product path: no spool, retries,
 * masking, rules, cap or store port; a frame outside the template is an error, not a fallback.
 *
 * - {@link leanJob}, the agent: the child's pipe read into one reused buffer (`readPipe`), lines cut at `\n`, each
 *   written as its gRPC frame by the project's encoder (request_id, line, the read's time) into 64 KiB chunks that go
 *   to one HTTP/2 request as they fill; a chunk is reused once written out, and the pipe is paused only while more
 *   than a call's worth (4 MiB, the client's `maxCallBytes`) waits in the stream.
 * - {@link startLeanServer}, the server: in `bytes` mode each request chunk only counted (the transport alone);
 *   otherwise copied whole into 1 MiB blocks (one copy a chunk, never a line on its own), then either only the
 *   frames' lengths walked (`frames`) or every frame decoded against the call's first (`template`).
 * - {@link transportJob}: the child's stdout piped as it comes into one request (no framing), for `bytes`.
 *
 * Why: docs/decisions/ingest-limit.md, "Lean pipelines".
 */
import { spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { once } from "node:events";
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { readPipe, type PipeReader } from "../src/runner/agent/pipe-reader.js";
import { createLogItemEncoder } from "../src/runner/protocol/encoder.js";
import { BUSY_WINDOW_BYTES } from "../src/runner/server/flow-window.js";

const BLOCK = 1024 * 1024;
const CHUNK = 64 * 1024;
/** Bytes waiting in the stream past which the lean agent stops reading its pipe (the client's `maxCallBytes`). */
const AHEAD = 4 * 1024 * 1024;

/** How the lean server reads a call: bytes counted, frames' lengths walked, or every frame decoded. */
export type LeanMode = "bytes" | "frames" | "template";

/**
 * One call's storage: whole request chunks back to back in blocks; per line its offsets and time. Throws on a frame
 * the template does not fit: a flag byte, a request_id other than the call's first 36-byte one, a length over one
 * varint byte (a line over ~116 bytes), a stderr flag, a line that is not ASCII.
 *
 * @example
 * const call = new LeanCall("template");
 * call.push(chunk); // call.count: frames read so far
 */
export class LeanCall {
  private block: Buffer;
  private view: DataView;
  /** Every block of the call (kept until the call ends, then let go) and the first line read in each. */
  private readonly blocks: Buffer[];
  private readonly blockFirst: number[] = [0];
  /** Bytes of the block written; `frame` is where the first frame not yet read starts. */
  private used = 0;
  private frame = 0;
  private id: number[] | null = null;
  private starts = new Uint32Array(1024);
  private ends = new Uint32Array(1024);
  private times = new Float64Array(1024);
  /** Frames read (bytes, in `bytes` mode). */
  count = 0;

  constructor(
    private readonly mode: LeanMode,
    /** Size of a block (a test makes it small, so frames cross blocks). */
    private readonly blockBytes = BLOCK,
  ) {
    this.block = Buffer.allocUnsafe(blockBytes);
    this.view = new DataView(this.block.buffer, this.block.byteOffset, this.block.length);
    this.blocks = [this.block];
  }

  /** Copies the chunk after the last (a new block takes the unread frame's bytes along), then reads its frames. */
  push(chunk: Buffer): void {
    if (this.mode === "bytes") {
      this.count += chunk.length;
      return;
    }
    if (this.block.length - this.used < chunk.length) this.nextBlock(chunk.length);
    chunk.copy(this.block, this.used);
    this.used += chunk.length;
    while (this.frame + 5 <= this.used) {
      if (this.block[this.frame] !== 0) throw new Error("lean: a flagged frame");
      const end = this.frame + 5 + this.view.getUint32(this.frame + 1);
      if (end > this.used) break;
      if (this.mode === "template") this.decode(this.frame + 5, end);
      else this.count++;
      this.frame = end;
    }
  }

  /** Line `i` as kept (template mode): its text and time (ms). */
  line(i: number): { text: string; time: number } {
    let b = this.blocks.length - 1;
    while (this.blockFirst[b]! > i) b--;
    return { text: this.blocks[b]!.toString("latin1", this.starts[i], this.ends[i]), time: this.times[i]! };
  }

  /** A new block holding the unread frame's bytes, with room for `bytes` more. */
  private nextBlock(bytes: number): void {
    const next = Buffer.allocUnsafe(Math.max(this.blockBytes, bytes + this.used - this.frame));
    this.block.copy(next, 0, this.frame, this.used);
    this.used -= this.frame;
    this.frame = 0;
    this.block = next;
    this.blocks.push(next);
    this.blockFirst.push(this.count);
    this.view = new DataView(next.buffer, next.byteOffset, next.length);
  }

  /** One frame against the template: what the fast path checks of a plain line, without an object a line. */
  private decode(start: number, end: number): void {
    const b = this.block;
    const v = this.view;
    // request_id (2 + 36) and the log field's tag and length at least.
    if (end - start < 40 || b[start] !== 0x0a || b[start + 1] !== 36) throw new Error("lean: not a 36-byte request_id");
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
    if (p + 9 <= stop && b[p] === 0x19) {
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
 * Starts the lean server on 127.0.0.1; every stream is one call, answered with its count.
 *
 * @example
 * const { port, close } = await startLeanServer("template");
 */
export async function startLeanServer(
  mode: LeanMode,
  /** Called with each call's storage when it ends (a test reads the lines back). */
  onEnd?: (call: LeanCall) => void,
): Promise<{ port: number; close(): Promise<void> }> {
  // Windows as wide as ours gives a busy call, so they are not what limits the rows.
  const server = http2.createServer({ settings: { initialWindowSize: BUSY_WINDOW_BYTES } });
  server.on("session", (session) => session.setLocalWindowSize(BUSY_WINDOW_BYTES));
  server.on("stream", (stream) => {
    const call = new LeanCall(mode);
    stream.on("data", (chunk: Buffer) => call.push(chunk));
    stream.on("end", () => {
      onEnd?.(call);
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

/** A request on `session` and the number its server answers. */
function openCall(session: http2.ClientHttp2Session): { req: http2.ClientHttp2Stream; answer: Promise<number> } {
  const req = session.request({ ":method": "POST", ":path": "/lean" });
  req.setEncoding("utf8");
  let text = "";
  req.on("data", (d: string) => (text += d));
  return { req, answer: once(req, "end").then(() => Number(text)) };
}

/**
 * The transport alone: `command`'s stdout piped as it comes (node's reads) into one request on `session`; resolves
 * with the bytes the server counted.
 *
 * @example
 * const bytes = await transportJob(session, "sh", ["-c", "yes | head -n 1000"]);
 */
export async function transportJob(
  session: http2.ClientHttp2Session,
  command: string,
  args: string[],
): Promise<number> {
  const { req, answer } = openCall(session);
  const child = spawn(command, args, { stdio: ["ignore", "pipe", "inherit"] });
  child.stdout.pipe(req);
  return answer;
}

/**
 * One job through the lean agent on `session` (to a `frames` or `template` server): `command` run, its lines framed
 * and sent; resolves once the server has answered, with the number of lines it read (the caller checks it).
 *
 * @example
 * const lines = await leanJob(session, "sh", ["-c", "yes | head -n 1000"]);
 */
export async function leanJob(session: http2.ClientHttp2Session, command: string, args: string[]): Promise<number> {
  const enc = createLogItemEncoder(randomUUID());
  const { req, answer } = openCall(session);
  const spare: Buffer[] = [];
  let out: Buffer = Buffer.allocUnsafe(CHUNK);
  let pos = 0;
  let pipe: PipeReader | null = null;
  let paused = false;
  const send = () => {
    const buf = out;
    req.write(buf.subarray(0, pos), () => {
      // Written out: the chunk takes later frames; the pipe is read again once the stream holds half of AHEAD.
      if (buf.length === CHUNK) spare.push(buf);
      if (paused && req.writableLength <= AHEAD / 2) {
        paused = false;
        pipe?.resume();
      }
    });
    out = spare.pop() ?? Buffer.allocUnsafe(CHUNK);
    pos = 0;
    if (!paused && req.writableLength > AHEAD) {
      paused = true;
      pipe?.pause();
    }
  };
  const frame = (src: Buffer, start: number, end: number, time: number) => {
    if (out.length - pos < end - start + 64) {
      if (pos > 0) send();
      if (out.length < end - start + 64) out = Buffer.allocUnsafe(end - start + 64);
    }
    pos = enc.writeLogFrameBytes(out, pos, src, start, end, false, time);
  };
  // The unfinished last line of a read, copied (the read buffer is reused).
  let tail: Buffer | null = null;
  const child = spawn(command, args, { stdio: ["ignore", "pipe", "inherit"] });
  pipe = readPipe(
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
    () => {
      // A last line without a newline is a line too.
      if (tail !== null) frame(tail, 0, tail.length, Date.now());
    },
  );
  await Promise.all([once(child, "exit"), pipe.done]);
  if (pos > 0) send();
  req.end();
  return answer;
}
