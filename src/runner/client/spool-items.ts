/**
 * The runner client's items in its spool: a log line encoded once into its frame, and the
 * unacknowledged items encoded again with a smaller line limit after RESOURCE_EXHAUSTED.
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
 * Re-encodes the spool's items from `from` with lines of at most `maxLineBytes`. Returns
 * the job end's new offset (null when it was not queued) and where each old item boundary
 * now lands: re-splitting renumbers every unacknowledged item.
 */
export function resplitFrom(
  spool: Spool,
  enc: LogItemEncoder,
  from: number,
  maxLineBytes: number,
): { endOffset: number | null; boundary: Map<number, number> } {
  const frames = spool.frames(from);
  spool.truncate(from);
  let endOffset: number | null = null;
  const boundary = new Map<number, number>([[from, from]]);
  let old = from;
  for (const f of frames) {
    const item = fromBinary(LogItemSchema, f.subarray(5));
    if (item.event.case === "log") {
      // Every piece keeps the line's stamp: a re-split changes the pieces, never when the line happened.
      const time = nanosToMs(item.event.value.timeUnixNano);
      for (const piece of splitUtf8(item.event.value.line, maxLineBytes))
        appendLine(spool, enc, piece, item.event.value.stderr, time);
    } else if (item.event.case === "end") {
      const frame = f;
      endOffset = spool.append(frame.length, (buf, pos) => pos + frame.copy(buf, pos));
    }
    boundary.set(++old, spool.end);
  }
  return { endOffset, boundary };
}
