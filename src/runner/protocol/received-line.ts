/**
 * A log line as the gRPC fast path received it: its UTF-8 bytes left where they arrived
 * (a range of the request's buffer) instead of a decoded string and three message
 * objects. It is the item the service reads, and the stored line a store is handed:
 * the text is decoded only when something reads `line` (a store that keeps strings, a
 * follower, the onLog hook), and a store that keeps bytes copies them (the memory store).
 */
import type { LogItem } from "../../gen/runner/v1/runner_pb.js";
import type { JobLogStore, LogEntry, StoredLine } from "../ports.js";
import type { ReceivedRun } from "./received-run.js";

/**
 * One received log item (request ID, line, stream) whose line is valid UTF-8. A line stored
 * whole is also its own {@link LogEntry} (stores it alone, `bytes` its cap cost, not capped):
 * a separate entry object and its one-element `stored` array were a third of what the
 * server allocated a line (~470 bytes, two dozen scavenges a 300k-line job).
 */
export class ReceivedLine implements StoredLine, LogEntry {
  /** The decoded text, once asked for. */
  private text: string | null = null;
  /**
   * As an entry: never the item where the log reached its cap (a line past it is stored as a marker entry). Type only,
   * no field.
   */
  declare readonly capped?: boolean;
  /**
   * As an entry: what it counts toward the job's log cap, set by the service's rule
   * (runner/service/log-cap.ts) before the line is stored.
   */
  bytes = 0;

  /**
   * @param requestId the item's request_id as sent (the same string object for every item of a call)
   * @param buf the buffer holding the line; never written again (a request chunk or a whole envelope)
   * @param start where its bytes start in `buf`
   * @param end where they end (exclusive)
   * @param time the agent's stamp in ms to the µs (runner/protocol/line-time.ts), 0 when it sent none; the
   *   service replaces 0 with its receive time and sets `serverTime`
   * @param timeAt where the stamp's 8 bytes are in `buf`, -1 when none (for readers that want the exact nanoseconds)
   * @param plainJson true only when the decoder found the line ASCII with no `"`, `\` or control
   *   character (its own JSON string body, byte-scan.ts `PLAIN_ASCII`); false says nothing (then scan)
   */
  constructor(
    readonly requestId: string,
    readonly buf: Buffer,
    readonly start: number,
    readonly end: number,
    readonly stderr: boolean,
    public time = 0,
    readonly timeAt = -1,
    readonly plainJson = false,
  ) {}

  /** True when `time` is the service's receive time (the agent sent no stamp). */
  serverTime = false;

  /** The line's text; decoded on first use, O(bytes), then kept. */
  get line(): string {
    return (this.text ??= this.buf.toString("utf8", this.start, this.end));
  }

  /** UTF-8 size of the line. */
  get size(): number {
    return this.end - this.start;
  }

  /**
   * As an entry: the lines it stores, i.e. itself; a new array on each read, for readers
   * that do not know the class (job-state's applyAppend, {@link pushPlain} and {@link storedCount} make none).
   */
  get stored(): StoredLine[] {
    return [this];
  }

  /** Serialises as the port's plain shape (a store that writes lines as JSON gets what it always got). */
  toJSON(): StoredLine {
    return plainLine(this);
  }
}

/**
 * A stored line as a plain object (the port's shape, nothing else): what a hook or a
 * follower may keep or serialise, without a view of the request's buffer.
 */
function plainLine(line: StoredLine): StoredLine {
  const out: StoredLine = line.marker
    ? { line: line.line, stderr: line.stderr, marker: true }
    : { line: line.line, stderr: line.stderr };
  if (line.time !== undefined && line.time > 0) {
    out.time = line.time;
    if (line.serverTime === true) out.serverTime = true;
  }
  return out;
}

/** Appends plain copies ({@link plainLine}) of the lines `entry` stores to `out`. O(lines + bytes). */
export function pushPlain(out: StoredLine[], entry: LogEntry): void {
  if (entry instanceof ReceivedLine) out.push(plainLine(entry));
  else for (const line of entry.stored) out.push(plainLine(line));
}

/** How many lines `entry` stores, without the array a received line's `stored` makes. O(1). */
export function storedCount(entry: LogEntry): number {
  return entry instanceof ReceivedLine ? 1 : entry.stored.length;
}

/**
 * Marks a log store whose `append` reads entries through the port's fields only (`stored`, `stderr`, `bytes`,
 * `capped`) and never serialises, clones or keeps an entry object whole: the service then hands it a line
 * stored whole as its own entry ({@link ReceivedLine}), with no entry object or array per line. This package's
 * memory, fs and PostgreSQL stores carry it.
 * Why: docs/decisions/runner-fastpath.md, "received-line.ts: READS_LINE_ENTRIES".
 */
export const READS_LINE_ENTRIES: unique symbol = Symbol.for("runner-depot.logStore.readsLineEntries") as never;

/**
 * Marks `store` {@link READS_LINE_ENTRIES} (this package's own log stores) and returns it.
 * The mark is an own, non-enumerable property: a wrapper made by spreading a marked store
 * (`{ ...store, append }`) or by `Object.create(store)` replaces what the mark vouches
 * for (its `append`), so it must not inherit the mark; such a store gets plain entries.
 */
export function readsLineEntries(store: JobLogStore): JobLogStore {
  Object.defineProperty(store, READS_LINE_ENTRIES, { value: true, enumerable: false });
  return store;
}

/** Whether `store` itself carries {@link READS_LINE_ENTRIES} (not through its prototype chain). O(1). */
export function isMarkedReadsLineEntries(store: JobLogStore): boolean {
  return (
    Object.prototype.hasOwnProperty.call(store, READS_LINE_ENTRIES) &&
    (store as { [READS_LINE_ENTRIES]?: boolean })[READS_LINE_ENTRIES] === true
  );
}

/**
 * The batch as `logs` may be handed it: as is for a store marked {@link READS_LINE_ENTRIES},
 * else with each received line made a plain entry of a plain line ({@link plainLine}: its
 * text decoded, no view of the request's buffer), which such a store may serialise, clone
 * or keep. O(1) for a marked store, else O(batch + bytes) (one entry, one array and one
 * string a line; the string is what such a store reads anyway).
 */
export function entriesFor(logs: JobLogStore, batch: LogEntry[]): LogEntry[] {
  if (isMarkedReadsLineEntries(logs)) return batch;
  let plain: LogEntry[] | null = null;
  for (let i = 0; i < batch.length; i++) {
    const entry = batch[i]!;
    if (!(entry instanceof ReceivedLine)) continue;
    plain ??= batch.slice();
    // A plain line, not the received one: a clone keeps own data properties only (the
    // received line's `line` is a getter), and a store that keeps it would pin the request's chunk.
    plain[i] = { stored: [plainLine(entry)], stderr: entry.stderr, bytes: entry.bytes };
  }
  return plain ?? batch;
}

/** The protobuf-es message a received line stands for (for readers that want messages). */
export function toLogItem(line: ReceivedLine): LogItem {
  return {
    $typeName: "runner.v1.LogItem",
    requestId: line.requestId,
    event: {
      case: "log",
      value: {
        $typeName: "runner.v1.LogChunk",
        line: line.line,
        stderr: line.stderr,
        timeUnixNano: line.timeAt < 0 ? 0n : line.buf.readBigUInt64LE(line.timeAt),
      },
    },
  };
}

/**
 * An item of a call as the service reads it: a message, a line the fast path kept as bytes, or a run of lines the
 * fast path kept as one object (the item reader hands the service its lines one at a time; a run reaches the
 * service whole only to be refused, runner/server/item-reader.ts).
 */
export type CallItem = LogItem | ReceivedLine | ReceivedRun;
