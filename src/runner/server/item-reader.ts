/**
 * Reading a call's items one at a time from the request stream, in batches when the
 * transport offers them (kItemBatches), so most items are handled without an await.
 */
import { ConnectError } from "@connectrpc/connect";
import type { LogItem } from "../../gen/runner/v1/runner_pb.js";
import type { CallItem } from "../protocol/received-line.js";
import { kItemBatches, type ItemBatchSource } from "./call-context.js";
import type { CallRun } from "../service/call/run.js";
import { readErrorOf } from "../protocol/wire-errors.js";

/** Reads a call's items one at a time from batches (of one item for plain async iterables). */
export interface ItemReader {
  batch: readonly CallItem[];
  pos: number;
  pull: () => Promise<readonly CallItem[] | null>;
}

export function readerOf(requests: AsyncIterable<LogItem>): ItemReader {
  const batched = (requests as Partial<ItemBatchSource>)[kItemBatches];
  if (typeof batched === "function") return { batch: [], pos: 0, pull: batched.call(requests) };
  const it = requests[Symbol.asyncIterator]();
  return {
    batch: [],
    pos: 0,
    pull: async () => {
      const result = await it.next();
      return result.done ? null : [result.value];
    },
  };
}

/**
 * An empty batch: a used-up one is let go (its items may hold request chunks, see runner/protocol/received-line.ts).
 */
const NO_ITEMS: readonly CallItem[] = [];

/** Puts `item`, the last one read, back: the next read returns it again. O(1) after a read. */
export function unread(it: ItemReader, item: CallItem): void {
  if (it.pos > 0 && it.batch[it.pos - 1] === item) it.pos--;
  else {
    it.batch = [item, ...it.batch.slice(it.pos)];
    it.pos = 0;
  }
}

/** The next item of the current batch, or undefined once it is used up (then {@link refill}). O(1). */
export function takeItem(it: ItemReader): CallItem | undefined {
  return it.pos < it.batch.length ? it.batch[it.pos++] : undefined;
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
