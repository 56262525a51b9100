/**
 * A run of lines (runner.v1 `LogRun`, docs/runner-protocol.md §2, "Runs of lines") as the gRPC fast path
 * received it: ONE object for the whole message, its lines left as bytes where they arrived. The decoder
 * (runner/protocol/decoder.ts, decodeReceivedRun) checked the whole run when it made it; the item reader
 * (runner/server/item-reader.ts) walks it and makes a {@link ReceivedLine} for each line only when the service
 * takes it. So before a call is authenticated a run costs one object, whatever its number of lines.
 * Why: docs/decisions/runner-fastpath.md, "received-run.ts: one object a run, walked lazily".
 */
import type { LogItem } from "../../gen/runner/v1/runner_pb.js";
import { ReceivedLine } from "./received-line.js";

/** Most lines a run may hold (docs/runner-protocol.md §7); a run over it, or an empty one, ends INVALID_ARGUMENT. */
export const MAX_RUN_LINES = 4096;

/** The name of the feature in `runner-accepts` (runner/service/contract.ts, ACCEPTS_HEADER). */
export const RUNS_FEATURE = "runs";

/**
 * The one-line refusal of a run of `count` lines, or null when the count is within 1 to {@link MAX_RUN_LINES}.
 * O(1).
 */
export function runRefusal(count: number): string | null {
  if (count === 0) return "a run must hold at least one line";
  if (count > MAX_RUN_LINES) return `a run of ${count} lines is over the ${MAX_RUN_LINES}-line limit; split it`;
  return null;
}

/**
 * One received run whose lines are all valid UTF-8 and whose fields are plain (each of stderr and time at most
 * once, no unknown field): what the decoder accepted. Nothing in it grows with the lines.
 */
export class ReceivedRun {
  /**
   * @param requestId the item's request_id as sent
   * @param buf the buffer holding the run; never written again (a request chunk or a whole envelope)
   * @param start where the run's fields (the inside of `LogRun`) start in `buf`
   * @param end where they end (exclusive)
   * @param firstLineAt where the first line's field (its tag) starts; `end` when the run holds none
   * @param count how many lines the run holds
   * @param stderr the run's stream
   * @param time the agent's stamp in ms to the µs (runner/protocol/line-time.ts), 0 when it sent none
   * @param timeAt where the stamp's 8 bytes are in `buf`, -1 when none
   * @param plainJson true when every line is its own JSON string body (byte-scan.ts `PLAIN_ASCII`); false says
   *   nothing
   */
  constructor(
    readonly requestId: string,
    readonly buf: Buffer,
    readonly start: number,
    readonly end: number,
    readonly firstLineAt: number,
    readonly count: number,
    readonly stderr: boolean,
    readonly time: number,
    readonly timeAt: number,
    readonly plainJson: boolean,
  ) {}

  /**
   * The line whose field is the first line field at or after `at` (a field boundary inside the run, at most the
   * stderr and time fields before it), as a {@link ReceivedLine} with the run's stream and time; its `end` is where
   * the next field starts. Only for a run the decoder accepted, and only while a line is left at or after `at`.
   * O(1): the line's bytes are not read.
   */
  lineAt(at: number): ReceivedLine {
    const buf = this.buf;
    for (;;) {
      const tag = buf[at++]!;
      if (tag === 0x10) at += 1;
      else if (tag === 0x19) at += 8;
      else break;
    }
    // A line field (0x0a): its length, a minimal varint of at most 5 bytes (checked by the decoder).
    let len = 0;
    let shift = 0;
    for (;;) {
      const byte = buf[at++]!;
      len += (byte & 0x7f) * 2 ** shift;
      if (byte < 0x80) break;
      shift += 7;
    }
    return new ReceivedLine(
      this.requestId,
      buf,
      at,
      at + len,
      this.stderr,
      this.time,
      this.timeAt,
      this.plainJson || len === 0,
    );
  }

  /** The protobuf-es message the run stands for (for readers that want messages). O(lines + bytes). */
  toLogItem(): LogItem {
    const lines: string[] = [];
    for (let i = 0, at = this.firstLineAt; i < this.count; i++) {
      const line = this.lineAt(at);
      lines.push(line.line);
      at = line.end;
    }
    return {
      $typeName: "runner.v1.LogItem",
      requestId: this.requestId,
      event: {
        case: "run",
        value: {
          $typeName: "runner.v1.LogRun",
          lines,
          stderr: this.stderr,
          timeUnixNano: this.timeAt < 0 ? 0n : this.buf.readBigUInt64LE(this.timeAt),
        },
      },
    };
  }
}
