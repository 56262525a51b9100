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
 * `maxLineBytes`, a frame a line. Returns
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
  for (const f of frames) {
    const item = fromBinary(LogItemSchema, f.subarray(5));
    const event = item.event;
    if (event.case === "log") again(event.value.line, event.value.stderr, event.value.timeUnixNano);
    else if (event.case === "run")
      for (const line of event.value.lines) again(line, event.value.stderr, event.value.timeUnixNano);
    else if (event.case === "end" && old++ >= from) {
      const frame = f;
      endOffset = spool.append(frame.length, (buf, pos) => pos + frame.copy(buf, pos));
      landed(old);
    }
  }
  return { endOffset, boundary };
}
