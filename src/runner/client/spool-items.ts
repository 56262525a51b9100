/**
 * The runner client's items in its spool: a log line encoded once into its frame, and the
 * unacknowledged items encoded again, a frame a line, with a smaller line limit after RESOURCE_EXHAUSTED or for a
 * server that refused runs.
 */
import { fromBinary } from "@bufbuild/protobuf";
import { LogItemSchema } from "../../gen/runner/v1/runner_pb.js";
import { utf8Length, type LogItemEncoder } from "../protocol/encoder.js";
import { splitUtf8 } from "../agent/line-splitter.js";
import { nanosToMs } from "../protocol/line-time.js";
import type { Spool } from "./spool.js";

/** Appends one log line (within the line limit) with its time (ms, 0 for none) to the spool. */
export function appendLine(spool: Spool, enc: LogItemEncoder, line: string, stderr: boolean, time: number): void {
  const bytes = utf8Length(line);
  spool.append(enc.logFrameSize(line, bytes, stderr, time), (buf, pos) =>
    enc.writeLogFrame(buf, pos, line, bytes, stderr, time),
  );
}

/**
 * Re-encodes the spool's items from `from` (`runner-committed`: everything before it is stored) with lines of at most
 * `maxLineBytes`: a frame a line, or with `runs` each run's lines in runs again (a run's empty line is 2 bytes, its
 * own frame ~50: a spool of runs would grow up to ~25×). Returns
 * the job end's new offset (null when it was not queued) and where each old item boundary in `wanted` (what the
 * client's waiters wait for) now lands: re-splitting renumbers every unacknowledged item. Only those are kept: a map of
 * every boundary grew with the spool's lines (a run's empty line is 2 bytes, and a Map holds at most ~16.7 M entries).
 */
export function resplitFrom(
  spool: Spool,
  enc: LogItemEncoder,
  from: number,
  maxLineBytes: number,
  wanted: Iterable<number> = [],
  runs = false,
): { endOffset: number | null; boundary: Map<number, number> } {
  // From the first line of the run holding `from`, since a frame is cut whole. The run's lines before `from` are
  // stored: they are not sent again, as a re-split would number them anew (a line cut in two is two items).
  const start = spool.frameStart(from);
  const frames = spool.frames(start);
  spool.truncate(start, from);
  let endOffset: number | null = null;
  const want = new Set(wanted);
  const boundary = new Map<number, number>();
  if (want.has(from)) boundary.set(from, from);
  /** Where the old item boundary `at` lands: `spool.end` now. O(1). */
  const landed = (at: number) => {
    if (want.has(at)) boundary.set(at, spool.end);
  };
  let old = start;
  /** One line, cut to the limit; every piece keeps the line's stamp (a re-split never changes when it happened). */
  const again = (line: string, stderr: boolean, timeUnixNano: bigint) => {
    if (old < from) {
      old++;
      return;
    }
    const time = nanosToMs(timeUnixNano);
    for (const piece of splitUtf8(line, maxLineBytes)) appendLine(spool, enc, piece, stderr, time);
    landed(++old);
  };
  /** A run's lines not stored, each cut to the limit, in runs again; the pieces of a line are lines of the run. */
  const againInRuns = (lines: string[], stderr: boolean, timeUnixNano: bigint) => {
    if (lines.length === 0) return;
    const pieces = lines.map((line) => splitUtf8(line, maxLineBytes));
    const read = Buffer.from(pieces.map((p) => p.map((piece) => `${piece}\n`).join("")).join(""), "utf8");
    let at = spool.end;
    const framed = spool.appendRuns(
      read,
      0,
      read.length,
      maxLineBytes,
      enc.lineFramer(stderr, nanosToMs(timeUnixNano)),
      maxLineBytes,
    );
    if (framed !== read.length) throw new Error("spool: a re-split run's piece is over the line limit");
    for (const p of pieces) {
      at += p.length;
      if (want.has(++old)) boundary.set(old, at);
    }
  };
  for (const f of frames) {
    const item = fromBinary(LogItemSchema, f.subarray(5));
    const event = item.event;
    if (event.case === "log") again(event.value.line, event.value.stderr, event.value.timeUnixNano);
    else if (event.case === "run" && runs) {
      const { lines, stderr, timeUnixNano } = event.value;
      const skip = Math.min(lines.length, Math.max(0, from - old));
      old += skip;
      againInRuns(lines.slice(skip), stderr, timeUnixNano);
    } else if (event.case === "run")
      for (const line of event.value.lines) again(line, event.value.stderr, event.value.timeUnixNano);
    else if (event.case === "end" && old++ >= from) {
      const frame = f;
      endOffset = spool.append(frame.length, (buf, pos) => pos + frame.copy(buf, pos));
      landed(old);
    }
  }
  return { endOffset, boundary };
}

/** A LogItem frame's run tag (field 4, wire type 2), after the request ID the encoder writes first. */
const RUN_TAG = 0x22;

/**
 * Whole frames from the spool (`buffers`, the first frame holding item `first`) as a server that takes no runs gets
 * them: each run's lines from item `from` on, a frame a line with the run's stream and time, and every other frame as
 * it is. A run's line is one item either way, so no offset changes. Why not re-encode the spool when runs are refused:
 * a run's line can be 2 bytes and its frame ~50, so the spool would grow up to ~25× at once (docs/decisions/
 * runner-client.md, "Runs of lines"). O(bytes out); what it returns is at most ~25× `buffers`.
 *
 * @example
 * const slice = spool.slice(spool.frameStart(sentTo), 16 * 1024);
 * const out = framesALine(slice.buffers, spool.frameStart(sentTo), sentTo, enc);
 */
export function framesALine(
  buffers: readonly Buffer[],
  first: number,
  from: number,
  enc: LogItemEncoder,
): { buffers: Buffer[]; bytes: number } {
  const out: Buffer[] = [];
  let bytes = 0;
  let item = first;
  // [flags][length: 4][the request ID field as this encoder writes it (none for an empty ID)][event tag]
  const tagAt = 5 + enc.lineFramer(false).id.length;
  for (const buf of buffers) {
    /** Where the frames to pass on as they are begin in `buf` (-1: none yet): one write for all of them. */
    let kept = -1;
    const keep = (to: number) => {
      if (kept < 0) return;
      out.push(buf.subarray(kept, to));
      bytes += to - kept;
      kept = -1;
    };
    for (let p = 0; p < buf.length;) {
      const end = p + 5 + buf.readUInt32BE(p + 1);
      const frame = buf.subarray(p, end);
      if (frame[tagAt] !== RUN_TAG) {
        if (item++ >= from && kept < 0) kept = p;
        p = end;
        continue;
      }
      keep(p);
      p = end;
      const event = fromBinary(LogItemSchema, frame.subarray(5)).event;
      if (event.case !== "run") throw new Error("spool: a frame with the run tag holds no run");
      const { lines, stderr, timeUnixNano } = event.value;
      const time = nanosToMs(timeUnixNano);
      const todo = lines.slice(Math.max(0, from - item));
      item += lines.length;
      if (todo.length === 0) continue;
      const sizes = todo.map((line) => enc.logFrameSize(line, utf8Length(line), stderr, time));
      const run = Buffer.allocUnsafe(sizes.reduce((a, b) => a + b, 0));
      let w = 0;
      todo.forEach((line) => (w = enc.writeLogFrame(run, w, line, utf8Length(line), stderr, time)));
      out.push(run);
      bytes += run.length;
    }
    keep(buf.length);
  }
  return { buffers: out, bytes };
}
