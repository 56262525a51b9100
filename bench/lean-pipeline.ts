/**
 * The lean ingest's server, for reference rows of bench/runner-line-time.ts (issue 23): what the end-to-end rate
 * comes to when the agent and the server do little more than the wire needs (its agents: bench/lean-agents.ts). Not a
 * product path: no retries, masking, rules, cap or store port; a frame outside the template is an error, not a
 * fallback.
 *
 * {@link startLeanServer}: in `bytes` mode each request chunk only counted (the transport alone); otherwise copied
 * whole into 1 MiB blocks (one copy a chunk, never a line on its own), then either only the frames' lengths walked
 * (`frames`), every frame decoded against the call's first (`template`), or each frame's run of lines cut into its
 * lines (`runs`: joined by `\n` in one string; `fields`: each line its own field; a wire the seed's proto does not
 * have).
 *
 * Why: docs/decisions/ingest-limit.md, "Lean pipelines" and "Runs of lines on the wire".
 */
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { readNanos } from "../src/runner/protocol/line-time.js";
import { BUSY_WINDOW_BYTES } from "../src/runner/server/flow-window.js";

const BLOCK = 1024 * 1024;

/** How the lean server reads a call: bytes counted, frames' lengths walked, every frame decoded, or runs of lines. */
export type LeanMode = "bytes" | "frames" | "template" | "runs" | "fields";

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
      else if (this.mode === "runs") this.decodeRun(this.frame + 5, end);
      else if (this.mode === "fields") this.decodeFields(this.frame + 5, end);
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
    this.checkId(start, end);
    let p = start + 38;
    if (b[p] !== 0x12 || b[p + 1]! >= 0x80) throw new Error("lean: layout");
    const stop = p + 2 + b[p + 1]!;
    // An empty line has no line field (proto3 leaves out an empty string).
    const hasLine = p + 2 < stop && b[p + 2] === 0x0a;
    if (hasLine && b[p + 3]! >= 0x80) throw new Error("lean: layout");
    const lineStart = hasLine ? p + 4 : p + 2;
    const lineEnd = hasLine ? lineStart + b[p + 3]! : lineStart;
    if (stop !== end || lineEnd > stop) throw new Error("lean: lengths");
    this.checkAscii(lineStart, lineEnd);
    p = lineEnd;
    let time = 0;
    if (p + 9 <= stop && b[p] === 0x19) {
      time = readNanos(this.block, p + 1);
      p += 9;
    }
    if (p !== stop) throw new Error("lean: trailing fields");
    this.keep(lineStart, lineEnd, time);
  }

  /**
   * One frame that carries a run of lines (`runs` mode: LogChunk's line holds a pipe read's whole lines joined by
   * `\n`, one time for them all), checked like {@link decode}, then cut into its lines.
   */
  private decodeRun(start: number, end: number): void {
    const b = this.block;
    this.checkId(start, end);
    let p = start + 38;
    if (b[p++] !== 0x12) throw new Error("lean: layout");
    const [inner, q] = this.varint(p);
    if (b[q] !== 0x0a) throw new Error("lean: layout");
    const [len, runStart] = this.varint(q + 1);
    const runEnd = runStart + len;
    if (q + inner !== end || runEnd + 9 !== end || b[runEnd] !== 0x19) throw new Error("lean: lengths");
    const time = readNanos(this.block, runEnd + 1);
    this.checkAscii(runStart, runEnd);
    // Searched within the run only: past it lie other frames, or the block's unused rest.
    const run = b.subarray(0, runEnd);
    for (let lineStart = runStart; ;) {
      const nl = run.indexOf(10, lineStart);
      const lineEnd = nl === -1 || nl >= runEnd ? runEnd : nl;
      this.keep(lineStart, lineEnd, time);
      if (lineEnd === runEnd) break;
      lineStart = lineEnd + 1;
    }
  }

  /**
   * One frame that carries a run as LogItem field 4 (`fields` mode: `LogRun { repeated string lines = 1; fixed64
   * time_unix_nano = 3 }`), each line its own field, walked and scanned line by line.
   */
  private decodeFields(start: number, end: number): void {
    const b = this.block;
    this.checkId(start, end);
    if (b[start + 38] !== 0x22) throw new Error("lean: layout");
    const [inner, at] = this.varint(start + 39);
    if (at + inner !== end) throw new Error("lean: lengths");
    let p = at;
    const first = this.count;
    while (p < end && b[p] === 0x0a) {
      const [len, lineStart] = this.varint(p + 1);
      const lineEnd = lineStart + len;
      if (lineEnd > end) throw new Error("lean: lengths");
      this.checkAscii(lineStart, lineEnd);
      this.keep(lineStart, lineEnd, 0);
      p = lineEnd;
    }
    if (p + 9 !== end || b[p] !== 0x19) throw new Error("lean: trailing fields");
    this.times.fill(readNanos(this.block, p + 1), first, this.count);
  }

  /** The frame's request_id (2 + 36 bytes) is the call's first one. */
  private checkId(start: number, end: number): void {
    const b = this.block;
    const v = this.view;
    // request_id and the event field's tag and length at least.
    if (end - start < 40 || b[start] !== 0x0a || b[start + 1] !== 36) throw new Error("lean: not a 36-byte request_id");
    if (this.id === null) this.id = Array.from({ length: 9 }, (_, k) => v.getUint32(start + 2 + 4 * k));
    for (let k = 0; k < 9; k++) if (v.getUint32(start + 2 + 4 * k) !== this.id[k]) throw new Error("lean: request_id");
  }

  /** The varint at `p` (up to 4 bytes) and where the bytes after it start. */
  private varint(p: number): [number, number] {
    const b = this.block;
    let n = 0;
    for (let shift = 0; shift < 28; shift += 7) {
      const x = b[p++]!;
      n |= (x & 0x7f) << shift;
      if (x < 0x80) return [n, p];
    }
    throw new Error("lean: lengths");
  }

  /** Bytes `[start, end)` of the block are ASCII, read a 16-byte word at a time. */
  private checkAscii(start: number, end: number): void {
    const b = this.block;
    const v = this.view;
    let acc = 0;
    let i = start;
    for (; i + 16 <= end; i += 16)
      acc |= v.getUint32(i, true) | v.getUint32(i + 4, true) | v.getUint32(i + 8, true) | v.getUint32(i + 12, true);
    for (; i < end; i++) acc |= b[i]!;
    if ((acc & 0x80808080) !== 0) throw new Error("lean: not ASCII");
  }

  /** A line's offsets in the block and its time. */
  private keep(start: number, end: number, time: number): void {
    if (this.count === this.ends.length) this.grow();
    this.starts[this.count] = start;
    this.ends[this.count] = end;
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
