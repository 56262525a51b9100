/**
 * Reads the body of one runner call off its HTTP/2 request, for both ways a call is served: the gRPC fast
 * path (which decodes the envelopes itself) and connect-node (which is fed whole envelopes, see
 * {@link ConnectBody}).
 * Why: docs/decisions/runner-fleet-memory.md, "request-reader.ts: the bounds that hold before authentication".
 */
import * as http2 from "node:http2";
import { Code, ConnectError } from "@connectrpc/connect";
import { ENVELOPE_PREFIX, EnvelopeSplitter, EnvelopeTooLarge } from "../protocol/envelope-splitter.js";
import { MALFORMED_REFUSAL, countRefusal, countRunLines } from "../protocol/received-run.js";
import { countJsonCommas, jsonCountRefusal } from "../protocol/json-values.js";
import { fromBinary } from "@bufbuild/protobuf";
import { LogItemSchema } from "../../gen/runner/v1/runner_pb.js";
import { DATA_FRAME_ALLOWANCE, type ReadBudget } from "./read-budget.js";
import { widenWhenBusy } from "./flow-window.js";
import type { BacklogWaiter, StoreBacklog } from "../service/store-backlog.js";

/** Options of a {@link RequestReader}. */
interface RequestReaderOptions {
  /** Largest message after the first. */
  messageBytes: number;
  /** Byte accounting shared by the server's calls. */
  budget: ReadBudget;
  /** True when the call names a compression (`grpc-encoding` / `connect-content-encoding` other than identity). */
  compressed: boolean;
  /** Complete envelopes waiting for the consumer past which reading pauses; default 1 MiB. */
  pauseBytes?: number;
  /**
   * The service's store backlog: while it is over budget, a call authenticated by a
   * credential is paused (after the chunk in hand) until it drains. None: never.
   */
  backlog?: StoreBacklog;
}

/** What a reader hands its envelopes to. */
export interface EnvelopeSink {
  /** One whole envelope, prefix included: `buf[start, end)`. Throwing ends the call with that error. */
  envelope(buf: Buffer, start: number, end: number): void;
  /** The reader's state changed (envelopes added, failed, ended): wake the consumer. */
  wake(): void;
}

const DEFAULT_PAUSE_BYTES = 1024 * 1024;
/**
 * A chunk is a view of the connection's whole socket read, which may hold other streams' frames too.
 * Why: docs/decisions/runner-fleet-memory.md, "request-reader.ts: MAX_VIEW_RATIO".
 */
const MAX_VIEW_RATIO = 8;

/**
 * What a call's body is read from: the compatibility layer's request (connect-node's calls,
 * a host's own server) or the raw HTTP/2 stream (startRunnerServer's fast path, which
 * builds no Http2ServerRequest/Response: see runner/server/fast-path.ts).
 */
export type RequestBody = http2.Http2ServerRequest | http2.ServerHttp2Stream;

/** The HTTP/2 stream under a body (undefined for an HTTP/1 request of a host that allows HTTP/1). */
function streamOf(body: RequestBody): http2.Http2Stream | undefined {
  return body instanceof http2.Http2ServerRequest ? body.stream : body;
}

/** The body's connection, for the budget: its HTTP/2 session (an HTTP/1 socket for hosts that allow HTTP/1). */
function connectionOf(body: RequestBody): object {
  const session = streamOf(body)?.session as object | undefined;
  return session ?? (body instanceof http2.Http2ServerRequest ? body.socket : undefined) ?? body;
}

/** The request's reader, for the shared listeners below. */
const kReader = Symbol("runner request reader");
type ReaderOwner = { [kReader]: RequestReader };
function onReaderData(this: ReaderOwner, chunk: Buffer): void {
  this[kReader].onData(chunk);
}
function onReaderEnd(this: ReaderOwner): void {
  this[kReader].onEnd();
}
function onReaderClose(this: ReaderOwner): void {
  this[kReader].onClose();
}
function ignore(): void {
  // Errors end the request with "close", which fails the reader.
}

/**
 * Reads one call's request body into a sink, within the bounds above.
 *
 * @example
 * const reader = new RequestReader(req, { messageBytes, budget, compressed: false }, sink);
 * // once the service has checked the token:
 * reader.authenticated();
 */
export class RequestReader implements BacklogWaiter {
  /** Why reading stopped early (a limit, a protocol error, the client going away). */
  failure: ConnectError | null = null;
  /** True once the body ended cleanly. */
  ended = false;
  /** Bytes of complete envelopes given to the sink and not yet {@link taken}. */
  private queued = 0;
  /** Bytes of incomplete messages this call has accounted in the budget. */
  private accounted = 0;
  /** Bytes received in this call (for {@link widenWhenBusy} and the DATA frame floor). */
  private received = 0;
  /** Chunks received in this call: a DATA frame each (or a piece of one split across socket reads). */
  private chunks = 0;
  private isAuthenticated = false;
  /**
   * True once a credential authenticated the call ({@link authenticated}), not a call read
   * on without one ({@link readOn}): only such a call may widen its connection's windows.
   */
  private mayWiden = false;
  private closed = false;
  private paused = false;
  /** True while registered with the backlog (paused until it drains). */
  private waitingBacklog = false;
  private firstTimer: NodeJS.Timeout | null = null;
  /** True once the first message's first byte arrived (its clock changed to firstMessageMs). */
  private firstByteSeen = false;
  /** True while this call counts in the budget's unauthenticated calls. */
  private pending = false;
  private readonly splitter: EnvelopeSplitter;
  private readonly connection: object;
  private readonly stream: http2.Http2Stream | undefined;
  private readonly pauseBytes: number;

  constructor(
    private readonly req: RequestBody,
    private readonly options: RequestReaderOptions,
    private readonly sink: EnvelopeSink,
  ) {
    this.splitter = new EnvelopeSplitter(
      Math.min(options.budget.limits.firstMessageBytes, options.messageBytes),
      options.messageBytes,
    );
    this.connection = connectionOf(req);
    this.stream = streamOf(req);
    this.pauseBytes = options.pauseBytes ?? DEFAULT_PAUSE_BYTES;
    // Shared listeners that find the reader on the request: four closures per call were kept
    // for as long as it stayed open. "end" and "close" come once: on(), not once() (whose
    // wrapper every open call would keep).
    (req as unknown as ReaderOwner)[kReader] = this;
    req.on("data", onReaderData);
    req.on("end", onReaderEnd);
    req.on("close", onReaderClose);
    req.on("error", ignore);
    if (options.budget.enterUnauthenticated()) {
      this.pending = true;
      this.startFirstTimer();
    } else {
      const limit = options.budget.limits.unauthenticatedCalls;
      this.fail(
        new ConnectError(
          `the server has ${limit} calls waiting for their first message or its check; retry the call later`,
          Code.Unavailable,
        ),
      );
    }
  }

  /** The call no longer counts as unauthenticated (authenticated, failed or ended). */
  private leavePending(): void {
    if (!this.pending) return;
    this.pending = false;
    this.options.budget.leaveUnauthenticated();
  }

  /** The request closed (ended, reset or gone). */
  onClose(): void {
    if (!this.ended) this.fail(new ConnectError("the request stream was closed", Code.Canceled));
    // Whatever is still accounted goes with the request.
    this.setQueued(0);
    this.closed = true;
    this.stopFirstTimer();
    this.leavePending();
    this.account();
  }

  /** The service has authenticated the call: later messages may use the full limit and reading goes on. */
  authenticated(): void {
    this.mayWiden = true;
    this.readOn();
  }

  /**
   * Reads on without a credential (a Health call: one small message, no token): later
   * messages may use the full limit, but the call never widens its connection's HTTP/2
   * windows (runner/server/flow-window.ts), so a caller without a token keeps 64 KiB windows.
   */
  readOn(): void {
    this.isAuthenticated = true;
    this.leavePending();
    this.maybeResume();
  }

  /** The consumer took `bytes` of complete envelopes. */
  taken(bytes: number): void {
    this.setQueued(Math.max(0, this.queued - bytes));
    this.maybeResume();
  }

  /** Stops reading: the rest of the body is drained and dropped, the budget released. */
  close(): void {
    this.closed = true;
    this.stopFirstTimer();
    this.leavePending();
    this.splitter.reset();
    this.setQueued(0);
    this.account();
    this.resume();
  }

  /** @internal A chunk of the request body (the shared "data" listener). */
  onData(chunk: Buffer): void {
    if (this.closed || this.failure !== null) return;
    this.received += chunk.length;
    // The frame floor, before any copy or parse: O(1) a chunk.
    if (++this.chunks > DATA_FRAME_ALLOWANCE && this.tooManyFrames()) return;
    if (chunk.buffer.byteLength > MAX_VIEW_RATIO * chunk.length) chunk = ownCopy(chunk);
    if (this.mayWiden) widenWhenBusy(this.stream, this.received);
    try {
      this.splitter.push(chunk, (buf, start, end) => {
        if ((buf[start]! & 1) === 1 && !this.options.compressed) {
          throw new ConnectError(
            "a message is flagged compressed but the call names no encoding (grpc-encoding)",
            Code.InvalidArgument,
          );
        }
        this.setQueued(this.queued + end - start);
        this.sink.envelope(buf, start, end);
      });
    } catch (error) {
      this.fail(toWireError(error));
    }
    if (this.failure === null) {
      const refusal = this.account();
      if (refusal !== null) this.fail(refusal);
    }
    this.watchFirstMessage();
    this.sink.wake();
    if (this.failure === null && !this.paused && this.mustPause()) {
      this.paused = true;
      this.req.pause();
      this.waitForBacklog();
    }
  }

  /**
   * True (and the call failed, its stream reset) when its DATA frames past the allowance
   * average under `dataFrameBytes`: a flood of tiny frames costs the server per frame, not per byte.
   */
  private tooManyFrames(): boolean {
    const floor = this.options.budget.limits.dataFrameBytes;
    if ((this.chunks - DATA_FRAME_ALLOWANCE) * floor <= this.received) return false;
    this.fail(
      new ConnectError(
        `${this.chunks} DATA frames carried ${this.received} bytes: past the first ${DATA_FRAME_ALLOWANCE}, frames must carry ${floor} bytes on average`,
        Code.ResourceExhausted,
      ),
    );
    // Reset at once, not after an answer: every frame still in the stream's window would
    // reach this listener first (~2 µs each; after the reset nghttp2 drops them for ~0.3 µs).
    // gRPC reads ENHANCE_YOUR_CALM as RESOURCE_EXHAUSTED.
    this.stream?.close(http2.constants.NGHTTP2_ENHANCE_YOUR_CALM);
    return true;
  }

  /** @internal The store backlog drained (StoreBacklog.wait). */
  drained(): void {
    this.waitingBacklog = false;
    this.maybeResume();
    this.waitForBacklog();
  }

  /**
   * Complete envelopes handed to the sink and not yet taken.
   * Why: docs/decisions/runner-fleet-memory.md, "request-reader.ts: RequestReader.setQueued".
   */
  private setQueued(bytes: number): void {
    const backlog = this.options.backlog;
    if (backlog !== undefined) {
      if (bytes >= this.queued) backlog.add(bytes - this.queued);
      else backlog.release(this.queued - bytes);
    }
    this.queued = bytes;
  }

  /** True while this call is paused behind the store backlog (the idle sweep does not count that wait). O(1). */
  heldBack(): boolean {
    return this.waitingBacklog;
  }

  /** Paused for the backlog: asks it to say when it drained (once per pause). */
  private waitForBacklog(): void {
    const backlog = this.options.backlog;
    if (backlog === undefined || !this.paused || this.waitingBacklog || !this.backlogHolds()) return;
    this.waitingBacklog = true;
    backlog.wait(this);
  }

  /** True when the backlog keeps this call paused: it is over budget and the call was authenticated by a credential. */
  private backlogHolds(): boolean {
    return this.mayWiden && this.options.backlog?.over === true;
  }

  /** @internal The request body ended (the shared "end" listener). */
  onEnd(): void {
    if (this.closed || this.failure !== null) return;
    if (this.splitter.heldBytes > 0) {
      this.fail(new ConnectError("protocol error: incomplete envelope", Code.InvalidArgument));
      return;
    }
    this.ended = true;
    this.stopFirstTimer();
    this.sink.wake();
  }

  private fail(error: ConnectError): void {
    if (this.failure !== null || this.ended) return;
    this.failure = error;
    this.stopFirstTimer();
    this.leavePending();
    this.splitter.reset();
    this.account();
    // Nothing more is read: the rest of the body is drained and dropped.
    this.resume();
    this.sink.wake();
  }

  /**
   * The first message's clocks: `firstByteMs` from the call's start until its first byte,
   * then `firstMessageMs` from that byte until the message is complete.
   */
  private watchFirstMessage(): void {
    if (this.splitter.completed > 0 || this.failure !== null || this.closed) {
      this.stopFirstTimer();
      return;
    }
    if (this.firstByteSeen || this.splitter.heldBytes === 0) return;
    this.firstByteSeen = true;
    this.stopFirstTimer();
    this.startFirstTimer();
  }

  /** Starts the clock of the first message's first byte, or, once it came, of its end. */
  private startFirstTimer(): void {
    const limits = this.options.budget.limits;
    const ms = this.firstByteSeen ? limits.firstMessageMs : limits.firstByteMs;
    const what = this.firstByteSeen ? "of its start" : "of the call's start";
    this.firstTimer = setTimeout(() => {
      this.firstTimer = null;
      if (this.splitter.completed === 0)
        this.fail(new ConnectError(`the first message did not arrive within ${ms} ms ${what}`, Code.DeadlineExceeded));
    }, ms);
    this.firstTimer.unref?.();
  }

  private stopFirstTimer(): void {
    if (this.firstTimer !== null) clearTimeout(this.firstTimer);
    this.firstTimer = null;
  }

  private mustPause(): boolean {
    return (
      this.queued >= this.pauseBytes || (!this.isAuthenticated && this.splitter.completed > 0) || this.backlogHolds()
    );
  }

  private maybeResume(): void {
    if (!this.paused) return;
    if (this.failure !== null || this.closed || !this.mustPause()) this.resume();
    // Still paused, maybe now for the backlog (paused first for its own queue).
    else this.waitForBacklog();
  }

  private resume(): void {
    if (this.waitingBacklog) {
      this.waitingBacklog = false;
      this.options.backlog!.forget(this);
    }
    if (!this.paused) return;
    this.paused = false;
    this.req.resume();
  }

  /** Brings the budget in line with what is held; returns the refusal when it would cross a cap. */
  private account(): ConnectError | null {
    const held = this.closed || this.failure !== null ? 0 : this.splitter.heldBytes;
    const refusal = this.options.budget.adjust(this.connection, held - this.accounted);
    if (refusal === null) {
      this.accounted = held;
      return null;
    }
    const limits = this.options.budget.limits;
    return refusal === "connection"
      ? new ConnectError(
          `this connection holds over ${limits.connectionBytes} bytes of unfinished requests; retry the call later`,
          Code.Unavailable,
        )
      : new ConnectError(
          `the server holds over ${limits.serverBytes} bytes of unfinished requests; retry the call later`,
          Code.Unavailable,
        );
  }
}

/** `chunk` in a buffer of its own (not the shared pool): it pins only its own bytes. O(chunk). */
function ownCopy(chunk: Buffer): Buffer {
  const copy = Buffer.allocUnsafeSlow(chunk.length);
  chunk.copy(copy);
  return copy;
}

function toWireError(error: unknown): ConnectError {
  if (error instanceof EnvelopeTooLarge) {
    return new ConnectError(
      error.index === 0
        ? `the first message of a call is ${error.size} bytes, over the ${error.limit}-byte limit of a message read before the call is authenticated; split the line`
        : `a message of ${error.size} bytes is over the ${error.limit}-byte limit; split the line`,
      Code.ResourceExhausted,
    );
  }
  if (error instanceof ConnectError) return error;
  return new ConnectError(
    error instanceof Error ? error.message : String(error),
    Code.Internal,
    undefined,
    undefined,
    error,
  );
}

/**
 * The request body as connect-node reads it: chunks of whole envelopes (neighbouring
 * envelopes of one received chunk stay one view), so connect's envelope reader holds at
 * most one chunk and never waits on a partial envelope. O(bytes).
 *
 * @example
 * const body = new ConnectBody();
 * body.attach(new RequestReader(req, options, body));
 * const uReq = { ...universalRequestFromNodeRequest(req, res, undefined, values), body };
 */
export class ConnectBody implements EnvelopeSink, AsyncIterable<Uint8Array> {
  private chunks: Buffer[] = [];
  /** Index of the next chunk to yield (no Array.shift: the queue may hold many small chunks). */
  private head = 0;
  private last: { buf: Buffer; start: number; end: number } | null = null;
  private waiter: (() => void) | null = null;
  private reader: RequestReader | null = null;

  /**
   * @param gate awaited with the first chunk before connect gets it (it may throw the call's refusal).
   * @param count LogItems in `binary`: an uncompressed message whose runs hold over MAX_RUN_LINES lines, or that is no
   *   well-formed message, is refused before connect parses it (a string a line), as the fast path does; in `json`:
   *   one with more values than a run's lines and an item's fields (json-values.ts). `null`: not counted.
   */
  constructor(
    private gate: ((chunk: Buffer) => Promise<void>) | null = null,
    private readonly count: "binary" | "json" | null = null,
  ) {}

  /** Connects the reader that feeds this body. */
  attach(reader: RequestReader): void {
    this.reader = reader;
  }

  envelope(buf: Buffer, start: number, end: number): void {
    if (this.count === "json" && (buf[start]! & 1) === 0) {
      const overBound = jsonCountRefusal(countJsonCommas(buf, start + ENVELOPE_PREFIX, end));
      if (overBound !== null) throw new ConnectError(overBound, Code.InvalidArgument);
    } else if (this.count === "binary" && (buf[start]! & 1) === 0) {
      const counted = countRunLines(buf, start + ENVELOPE_PREFIX, end);
      const overBound = countRefusal(counted);
      if (overBound !== null) throw new ConnectError(overBound, Code.InvalidArgument);
      // Not well-formed: connect refuses it with protobuf-es's own words, unless protobuf-es would read it (a field
      // that runs on past its message's end), whose lines were not counted. Rare, so read twice.
      if (counted < 0 && readsAnyway(buf.subarray(start + ENVELOPE_PREFIX, end)))
        throw new ConnectError(MALFORMED_REFUSAL, Code.InvalidArgument);
    }
    const last = this.last;
    if (last !== null && last.buf === buf && last.end === start) last.end = end;
    else {
      if (last !== null) this.chunks.push(last.buf.subarray(last.start, last.end));
      this.last = { buf, start, end };
    }
  }

  wake(): void {
    if (this.last !== null) {
      this.chunks.push(this.last.buf.subarray(this.last.start, this.last.end));
      this.last = null;
    }
    const waiter = this.waiter;
    this.waiter = null;
    waiter?.();
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<Uint8Array> {
    const reader = this.reader!;
    for (;;) {
      if (this.head < this.chunks.length) {
        const chunk = this.chunks[this.head++]!;
        if (this.head === this.chunks.length) {
          this.chunks = [];
          this.head = 0;
        }
        if (this.gate !== null) {
          const gate = this.gate;
          this.gate = null;
          await gate(chunk);
        }
        reader.taken(chunk.length);
        yield chunk;
        continue;
      }
      if (reader.failure !== null) throw reader.failure;
      if (reader.ended) return;
      await new Promise<void>((resolve) => (this.waiter = resolve));
    }
  }
}

/** Whether protobuf-es reads `bytes` as a LogItem (unknown fields dropped). O(bytes). */
function readsAnyway(bytes: Uint8Array): boolean {
  try {
    fromBinary(LogItemSchema, bytes, { readUnknownFields: false });
    return true;
  } catch {
    return false;
  }
}
