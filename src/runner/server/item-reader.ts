/**
 * Reading a call's items one at a time from the request stream, in batches when the
 * transport offers them (kItemBatches), so most items are handled without an await.
 * A run of lines (docs/runner-protocol.md §2, "Runs of lines") is walked here: the service
 * gets its lines one at a time, each made only when taken.
 */
import { ConnectError } from "@connectrpc/connect";
import type { LogItem, LogRun } from "../../gen/runner/v1/runner_pb.js";
import { ReceivedLine, type CallItem } from "../protocol/received-line.js";
import { ReceivedRun, runRefusal } from "../protocol/received-run.js";
import { kItemBatches, type ItemBatchSource } from "./call-context.js";
import type { CallRun } from "../service/call/run.js";
import { readErrorOf } from "../protocol/wire-errors.js";

/** Reads a call's items one at a time from batches (of one item for plain async iterables). */
export interface ItemReader {
  batch: readonly CallItem[];
  pos: number;
  pull: () => Promise<readonly CallItem[] | null>;
  /**
   * Whether runs are walked line by line (the service's `acceptRuns`). When false, or when a run holds no line
   * or more than MAX_RUN_LINES, the run is handed over whole, as one item, for the service to refuse.
   */
  readonly runs: boolean;
  /**
   * While `batch[pos]` is a run being walked: where its next line is looked for (a byte offset in a
   * {@link ReceivedRun}'s buffer, an index into a message's lines); -1 when no run is being walked.
   */
  runAt: number;
  /** Lines of that run handed out so far. */
  runLines: number;
  /** `runAt` before the last line was handed out, and that line: what {@link unread} puts back. */
  prevRunAt: number;
  lastLine: CallItem | null;
}

/** The reader of `requests`; `runs`: walk runs of lines (see {@link ItemReader.runs}). */
export function readerOf(requests: AsyncIterable<LogItem>, runs = true): ItemReader {
  const batched = (requests as Partial<ItemBatchSource>)[kItemBatches];
  const walk = { runs, runAt: -1, runLines: 0, prevRunAt: -1, lastLine: null };
  if (typeof batched === "function") return { batch: [], pos: 0, pull: batched.call(requests), ...walk };
  const it = requests[Symbol.asyncIterator]();
  return {
    batch: [],
    pos: 0,
    pull: async () => {
      const result = await it.next();
      return result.done ? null : [result.value];
    },
    ...walk,
  };
}

/**
 * An empty batch: a used-up one is let go (its items may hold request chunks, see runner/protocol/received-line.ts).
 */
const NO_ITEMS: readonly CallItem[] = [];

/** Puts `item`, the last one read, back: the next read returns it again (a run's line made anew). O(1) after a read. */
export function unread(it: ItemReader, item: CallItem): void {
  if (it.runAt >= 0 && it.lastLine === item) {
    // A line of the run being walked: the walk steps back one line.
    it.runLines--;
    it.runAt = it.runLines === 0 ? -1 : it.prevRunAt;
    it.lastLine = null;
  } else if (it.pos > 0 && it.batch[it.pos - 1] === item) it.pos--;
  else {
    it.batch = [item, ...it.batch.slice(it.pos)];
    it.pos = 0;
    endRun(it);
  }
}

/**
 * The next item of the current batch, or undefined once it is used up (then {@link refill}). A run within its
 * bounds gives its lines one at a time: a {@link ReceivedLine} for a {@link ReceivedRun}, a LogItem with a
 * LogChunk for a run message (protobuf-es's odd encodings, the connect path), each exactly as if it had been sent
 * alone with the run's stream and time. O(1) (a line's bytes are not read).
 */
export function takeItem(it: ItemReader): CallItem | undefined {
  while (it.pos < it.batch.length) {
    const item = it.batch[it.pos]!;
    if (item instanceof ReceivedLine) {
      it.pos++;
      return item;
    }
    const run = item instanceof ReceivedRun ? item : item.event.case === "run" ? item.event.value : null;
    if (run === null) {
      it.pos++;
      return item;
    }
    const count = run instanceof ReceivedRun ? run.count : run.lines.length;
    if (!it.runs || runRefusal(count) !== null) {
      // Refused by the service (processItem), with the items before it stored.
      it.pos++;
      return item;
    }
    if (it.runLines === count) {
      it.pos++;
      endRun(it);
      continue;
    }
    const at = it.runAt >= 0 ? it.runAt : run instanceof ReceivedRun ? run.firstLineAt : 0;
    let line: CallItem;
    if (run instanceof ReceivedRun) {
      const received = run.lineAt(at);
      it.runAt = received.end;
      line = received;
    } else {
      it.runAt = at + 1;
      line = logLine(item.requestId, run, at);
    }
    it.prevRunAt = at;
    it.runLines++;
    it.lastLine = line;
    return line;
  }
  return undefined;
}

/** Leaves the run being walked, if any. O(1). */
function endRun(it: ItemReader): void {
  it.runAt = -1;
  it.runLines = 0;
  it.prevRunAt = -1;
  it.lastLine = null;
}

/** Line `index` of a run message as the LogItem of a LogChunk with the run's stream and time. O(1). */
function logLine(requestId: string, run: LogRun, index: number): LogItem {
  return {
    $typeName: "runner.v1.LogItem",
    requestId,
    event: {
      case: "log",
      value: {
        $typeName: "runner.v1.LogChunk",
        line: run.lines[index]!,
        stderr: run.stderr,
        timeUnixNano: run.timeUnixNano,
      },
    },
  };
}

/**
 * Waits for the next batch: true once there is one (read it with {@link takeItem}), false at the end of the
 * request stream.
 * Why: docs/decisions/runner-fleet-memory.md, "item-reader.ts: refill".
 */
export async function refill(call: CallRun, it: ItemReader): Promise<boolean> {
  // Not kept while the call waits: an idle stream would pin its last request chunk.
  it.batch = NO_ITEMS;
  it.pos = 0;
  endRun(it);
  const read = it.pull();
  // The read may settle after we gave up on it (stream reset); never leave it unhandled.
  read.catch(() => undefined);
  call.waitingSince = Date.now();
  try {
    const batch = await call.guard(read);
    if (batch === null || batch.length === 0) return false;
    it.batch = batch;
    return true;
  } catch (error) {
    // Reading failed (a limit, a message protobuf-es refused, an unknown encoding): the
    // documented code and one line of text; none of these is an unexpected fault.
    if (error instanceof ConnectError) throw readErrorOf(error, call.maxBytes);
    throw error;
  } finally {
    call.waitingSince = 0;
  }
}
