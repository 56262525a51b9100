/**
 * The lean pipelines' agents (bench/lean-pipeline.ts is their server), reference rows of bench/runner-line-time.ts
 * (issue 23). Not a product path: no spool, retries, masking or rules.
 *
 * - {@link transportJob}: the child's stdout piped as it comes into one request (no framing), for a `bytes` server.
 * - {@link leanJob}: the child's pipe read into one reused buffer (`readPipe`), lines cut at `\n`, each written as its
 *   gRPC frame by the project's encoder (request_id, line, the read's time), for a `frames` or `template` server.
 * - {@link leanRunsJob}: each pipe read's whole lines in one frame, a wire the seed's proto does not have, for a `runs`
 *   or `fields` server (docs/decisions/ingest-limit.md, "Runs of lines on the wire").
 *
 * Frames go into reused chunks that go to one HTTP/2 request as they fill; the pipe is paused only while more than a
 * call's worth (4 MiB, the client's `maxCallBytes`) waits in the stream.
 */
import { spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { once } from "node:events";
import type http2 from "node:http2";
import type { Readable } from "node:stream";
import { readPipe, type PipeReader } from "../src/runner/agent/pipe-reader.js";
import { varintSize } from "../src/runner/protocol/encoded-size.js";
import { createLogItemEncoder, writeVarint } from "../src/runner/protocol/encoder.js";
import { writeNanos } from "../src/runner/protocol/line-time.js";

const CHUNK = 64 * 1024;
/** Bytes waiting in the stream past which the lean agent stops reading its pipe (the client's `maxCallBytes`). */
const AHEAD = 4 * 1024 * 1024;

/** A request on `session` and the number its server answers. */
function openCall(session: http2.ClientHttp2Session): { req: http2.ClientHttp2Stream; answer: Promise<number> } {
  const req = session.request({ ":method": "POST", ":path": "/lean" });
  req.setEncoding("utf8");
  let text = "";
  req.on("data", (d: string) => (text += d));
  return { req, answer: once(req, "end").then(() => Number(text)) };
}

/**
 * Frames written into reused chunks of `chunkBytes`, each sent whole once it cannot take the next frame; the pipe is
 * paused while more than AHEAD waits in the request and read again once half of that is written out.
 */
class ChunkSender {
  out: Buffer;
  pos = 0;
  pipe: PipeReader | null = null;
  private paused = false;
  private readonly spare: Buffer[] = [];

  constructor(
    private readonly req: http2.ClientHttp2Stream,
    private readonly chunkBytes: number,
  ) {
    this.out = Buffer.allocUnsafe(chunkBytes);
  }

  /** Makes room for a frame of `bytes` at `out[pos]` (a frame larger than a chunk gets a buffer of its own). */
  room(bytes: number): void {
    if (this.out.length - this.pos >= bytes) return;
    if (this.pos > 0) this.send();
    if (this.out.length < bytes) this.out = Buffer.allocUnsafe(bytes);
  }

  /** Sends what the chunk holds. */
  send(): void {
    const buf = this.out;
    this.req.write(buf.subarray(0, this.pos), () => {
      if (buf.length === this.chunkBytes) this.spare.push(buf);
      if (this.paused && this.req.writableLength <= AHEAD / 2) {
        this.paused = false;
        this.pipe?.resume();
      }
    });
    this.out = this.spare.pop() ?? Buffer.allocUnsafe(this.chunkBytes);
    this.pos = 0;
    if (!this.paused && this.req.writableLength > AHEAD) {
      this.paused = true;
      this.pipe?.pause();
    }
  }

  /** Sends the rest and ends the request. */
  end(): void {
    if (this.pos > 0) this.send();
    this.req.end();
  }
}

/**
 * Reads `stdout` into one reused buffer and hands `put` the text of whole lines, without their last newline: of each
 * read, the line finished from the last read's tail (copied: the buffer is reused), then the read's other whole lines
 * as one span; at the end, a last line without a newline. `put` is called with (bytes, start, end, the read's time).
 */
function readSpans(stdout: Readable, put: (src: Buffer, start: number, end: number, time: number) => void): PipeReader {
  let tail: Buffer | null = null;
  return readPipe(
    stdout,
    (read) => {
      const time = Date.now();
      const first = read.indexOf(10);
      if (first === -1) {
        tail = Buffer.concat(tail === null ? [read] : [tail, read]);
        return;
      }
      let start = 0;
      if (tail !== null) {
        const line = Buffer.concat([tail, read.subarray(0, first)]);
        tail = null;
        put(line, 0, line.length, time);
        start = first + 1;
      }
      const last = read.lastIndexOf(10);
      if (last >= start) put(read, start, last, time);
      tail = last + 1 < read.length ? Buffer.from(read.subarray(last + 1)) : null;
    },
    () => {
      if (tail !== null) put(tail, 0, tail.length, Date.now());
    },
  );
}

/** Runs `command` with its stdout through `readSpans` into `put`, then ends the request once the child is done. */
async function runInto(
  sender: ChunkSender,
  command: string,
  args: string[],
  put: (src: Buffer, start: number, end: number, time: number) => void,
): Promise<void> {
  const child = spawn(command, args, { stdio: ["ignore", "pipe", "inherit"] });
  sender.pipe = readSpans(child.stdout, put);
  await Promise.all([once(child, "exit"), sender.pipe.done]);
  sender.end();
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
  const sender = new ChunkSender(req, CHUNK);
  const frame = (src: Buffer, start: number, end: number, time: number) => {
    sender.room(end - start + 64);
    sender.pos = enc.writeLogFrameBytes(sender.out, sender.pos, src, start, end, false, time);
  };
  await runInto(sender, command, args, (src, start, end, time) => {
    for (let s = start; ;) {
      const nl = src.indexOf(10, s);
      const e = nl === -1 || nl > end ? end : nl;
      frame(src, s, e, time);
      if (e === end) break;
      s = e + 1;
    }
  });
  return answer;
}

/** How a run of lines goes on the wire: joined by `\n` in LogChunk's line, or each line a field of LogItem field 4. */
export type RunLayout = "joined" | "fields";

/**
 * One job through the lean agent on `session`, each pipe read's whole lines in one frame with the read's time (to a
 * `runs` server for `joined`, a `fields` server for `fields`); resolves with the number of lines the server read.
 *
 * @example
 * const lines = await leanRunsJob(session, "sh", ["-c", "yes | head -n 1000"], "fields");
 */
export async function leanRunsJob(
  session: http2.ClientHttp2Session,
  command: string,
  args: string[],
  layout: RunLayout,
): Promise<number> {
  const id = Buffer.from(randomUUID(), "latin1");
  const { req, answer } = openCall(session);
  // A 64 KiB read's run and its head fit one chunk, but for a read of very short lines as fields (each line 2 bytes
  // more): room() gives such a frame a buffer of its own.
  const sender = new ChunkSender(req, 2 * CHUNK);
  const framer = runFramer(layout, id);
  await runInto(sender, command, args, (src, start, end, time) => {
    sender.room(framer.size(src, start, end));
    sender.pos = framer.write(sender.out, sender.pos, src, start, end, time);
  });
  return answer;
}

/** A run's framer: its frame's size (called first), then the frame written at `pos`; returns the end. */
export interface RunFramer {
  size(src: Buffer, start: number, end: number): number;
  write(b: Buffer, pos: number, src: Buffer, start: number, end: number, time: number): number;
}

/**
 * The framer of runs of lines in `layout` for the request ID `id` (its 36 bytes).
 *
 * @example
 * const framer = runFramer("fields", Buffer.from(randomUUID(), "latin1"));
 * const buf = Buffer.alloc(framer.size(text, 0, text.length));
 * framer.write(buf, 0, text, 0, text.length, Date.now());
 */
export function runFramer(layout: RunLayout, id: Buffer): RunFramer {
  return layout === "joined" ? joinedRun(id) : fieldsRun(id);
}

/** The gRPC prefix, request_id and the event field's tag and length of a frame; returns where its value starts. */
function writeHead(b: Buffer, pos: number, id: Buffer, tag: number, inner: number): number {
  const item = 2 + id.length + 1 + varintSize(inner) + inner;
  b[pos] = 0;
  b.writeUInt32BE(item, pos + 1);
  let p = pos + 5;
  b[p++] = 0x0a;
  b[p++] = id.length;
  p += id.copy(b, p);
  b[p++] = tag;
  return writeVarint(b, p, inner);
}

/** The frame's size from its event's value length. */
const frameSize = (id: Buffer, inner: number) => 5 + 2 + id.length + 1 + varintSize(inner) + inner;

/** fixed64 `time_unix_nano` (field 3) of `time` ms (to the µs). */
function writeTime(b: Buffer, p: number, time: number): number {
  b[p] = 0x19;
  return writeNanos(b, p + 1, time);
}

/** The run joined in LogChunk's line (LogItem field 2): `{ line = 1: the run; time_unix_nano = 3 }`. */
function joinedRun(id: Buffer): RunFramer {
  const innerOf = (len: number) => 1 + varintSize(len) + len + 9;
  return {
    size: (_src, start, end) => frameSize(id, innerOf(end - start)),
    write(b, pos, src, start, end, time) {
      let p = writeHead(b, pos, id, 0x12, innerOf(end - start));
      b[p++] = 0x0a;
      p = writeVarint(b, p, end - start);
      p += src.copy(b, p, start, end);
      return writeTime(b, p, time);
    },
  };
}

/** The run as LogItem field 4, `LogRun { repeated string lines = 1; fixed64 time_unix_nano = 3 }`. */
function fieldsRun(id: Buffer): RunFramer {
  // The lines' ends, found by size() and used by write() for the same run.
  let ends = new Uint32Array(2048);
  let n = 0;
  let inner = 0;
  return {
    size(src, start, end) {
      n = 0;
      inner = 9;
      for (let s = start; ;) {
        const nl = src.indexOf(10, s);
        const e = nl === -1 || nl > end ? end : nl;
        if (n === ends.length) {
          const grown = new Uint32Array(n * 2);
          grown.set(ends);
          ends = grown;
        }
        ends[n++] = e;
        inner += 1 + varintSize(e - s) + e - s;
        if (e === end) break;
        s = e + 1;
      }
      return frameSize(id, inner);
    },
    write(b, pos, src, start, end, time) {
      if (n === 0 || ends[n - 1] !== end) throw new Error("lean: write() of a run size() did not measure");
      let p = writeHead(b, pos, id, 0x22, inner);
      for (let k = 0, s = start; k < n; k++) {
        const e = ends[k]!;
        b[p++] = 0x0a;
        p = writeVarint(b, p, e - s);
        p += src.copy(b, p, s, e);
        s = e + 1;
      }
      return writeTime(b, p, time);
    },
  };
}
