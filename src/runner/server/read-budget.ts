/**
 * Caps on the request bytes a runner server holds for messages that have not fully
 * arrived: per connection and per server. Every call's reader reports what it holds; a
 * call whose bytes would cross a cap is refused UNAVAILABLE, which frees them, so a client
 * holding made-up tokens cannot grow the server's memory with half-sent messages on many
 * streams or many connections. (Complete messages are handed to the service at once and
 * are bounded per call by back-pressure; see runner/server/request-reader.ts.)
 */

/** The buffer limits of a runner server (see docs/decisions/runner-server.md, "Bounds before authentication"). */
export interface RunnerReadLimits {
  /**
   * Largest first message of a call. It is read before the call is authenticated (the
   * request ID, and so the job its token is for, arrives with it), so it is kept small;
   * later messages may be up to `messageBytes`. Default 128 KiB (a 64 KiB line fits).
   */
  firstMessageBytes: number;
  /**
   * Once a call's first message has started to arrive, the rest of it must arrive within
   * this many milliseconds, else the call ends DEADLINE_EXCEEDED (a slow sender cannot hold
   * an unauthenticated call's bytes for the whole idle time); default 10 000.
   */
  firstMessageMs: number;
  /**
   * A call's first byte of request data must arrive within this many milliseconds of the
   * call's start (its HEADERS), else the call ends DEADLINE_EXCEEDED: a stream that sends
   * nothing does not hold an unauthenticated call for the whole idle time. Longer than
   * `firstMessageMs`: a client multiplexing many calls on one connection may feed them
   * slowly through its connection's flow-control window; default 30 000.
   */
  firstByteMs: number;
  /**
   * Calls of the server not yet authenticated (opened, first message not yet read or its
   * token not yet checked), across all connections; a call past it is refused UNAVAILABLE at
   * once. Each open stream costs the server about 7.6 KiB of heap before any byte is read;
   * default 4 096 (about 31 MiB).
   */
  unauthenticatedCalls: number;
  /** Bytes of incomplete messages held for all calls of one HTTP/2 connection; default 16 MiB. */
  connectionBytes: number;
  /** Bytes of incomplete messages held for all calls of the server; default 256 MiB. */
  serverBytes: number;
  /**
   * Bytes a call's DATA frames must carry on average, past its first 1 024 (DATA_FRAME_ALLOWANCE):
   * each frame costs the server about the same whatever it carries, so one-byte frames cost ~40×
   * the CPU per byte of 16 KiB ones. A call past it ends RESOURCE_EXHAUSTED. An item is at
   * least 45 bytes on the wire, so a client sending one item per frame stays above the default 32.
   */
  dataFrameBytes: number;
}

/** DATA frames (chunks) of a call that are free of {@link RunnerReadLimits.dataFrameBytes}. */
export const DATA_FRAME_ALLOWANCE = 1024;

/** Defaults of {@link RunnerReadLimits}. */
const DEFAULT_READ_LIMITS: Readonly<RunnerReadLimits> = Object.freeze({
  firstMessageBytes: 128 * 1024,
  firstMessageMs: 10_000,
  firstByteMs: 30_000,
  unauthenticatedCalls: 4096,
  connectionBytes: 16 * 1024 * 1024,
  serverBytes: 256 * 1024 * 1024,
  dataFrameBytes: 32,
});

/** Which cap a change would cross. */
type BudgetRefusal = "connection" | "server";

/** Shared byte accounting of one server; a connection is any object standing for it (its HTTP/2 session). */
export interface ReadBudget {
  /**
   * Changes what one call on `connection` holds by `delta` bytes; refuses (changing nothing) a growth past a cap. O(1).
   */
  adjust(connection: object, delta: number): BudgetRefusal | null;
  /** Bytes held by the calls of the server. */
  readonly serverHeld: number;
  /**
   * Counts one more unauthenticated call; false (counting nothing) when `unauthenticatedCalls` are open already. O(1).
   */
  enterUnauthenticated(): boolean;
  /** One unauthenticated call was authenticated or ended. O(1). */
  leaveUnauthenticated(): void;
  /** Calls counted by {@link enterUnauthenticated} and not yet left. */
  readonly unauthenticated: number;
  /** Bytes held by the calls of one connection. */
  connectionHeld(connection: object): number;
  /** The caps in force. */
  readonly limits: Readonly<RunnerReadLimits>;
}

/**
 * Creates the byte accounting of one server (or handler).
 *
 * @example
 * const budget = createReadBudget({ connectionBytes: 8 << 20 });
 * if (budget.adjust(session, chunk.length) !== null) refuse();
 */
export function createReadBudget(limits: Partial<RunnerReadLimits> = {}): ReadBudget {
  const caps: RunnerReadLimits = { ...DEFAULT_READ_LIMITS };
  for (const [name, value] of Object.entries(limits)) {
    if (value === undefined) continue;
    if (!(typeof value === "number" && value > 0)) throw new RangeError(`readLimits.${name} must be a positive number`);
    caps[name as keyof RunnerReadLimits] = value;
  }
  // Weak: a connection's entry goes with its session object.
  const perConnection = new WeakMap<object, number>();
  let server = 0;
  let unauthenticated = 0;
  return {
    enterUnauthenticated() {
      if (unauthenticated >= caps.unauthenticatedCalls) return false;
      unauthenticated++;
      return true;
    },
    leaveUnauthenticated() {
      unauthenticated--;
    },
    get unauthenticated() {
      return unauthenticated;
    },
    adjust(connection, delta) {
      if (delta === 0) return null;
      const current = perConnection.get(connection) ?? 0;
      if (delta > 0) {
        if (current + delta > caps.connectionBytes) return "connection";
        if (server + delta > caps.serverBytes) return "server";
      }
      perConnection.set(connection, current + delta);
      server += delta;
      return null;
    },
    get serverHeld() {
      return server;
    },
    connectionHeld(connection) {
      return perConnection.get(connection) ?? 0;
    },
    limits: caps,
  };
}
