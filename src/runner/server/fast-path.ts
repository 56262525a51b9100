/**
 * The gRPC fast path of createRunnerHandler: plain (uncompressed, binary) gRPC calls of
 * `/runner.v1.Runner/StreamLogs` are read straight off the HTTP/2 stream (startRunnerServer: the raw stream,
 * no compatibility-layer request and response) or request (a host's own server), split into frames and
 * decoded here, and handed to the same service implementation in batches.
 * Why: docs/decisions/runner-fastpath.md, "fast-path.ts: the gRPC fast path".
 */
import * as http2 from "node:http2";
import { create, isMessage, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError, type ContextValues, type HandlerContext } from "@connectrpc/connect";
import { compressionNegotiate, createMethodSerializationLookup, encodeEnvelope } from "@connectrpc/connect/protocol";
import {
  contentTypeProto,
  grpcStatusOk,
  headerAcceptEncoding,
  headerContentType,
  headerEncoding,
  headerGrpcMessage,
  headerGrpcStatus,
  setTrailerStatus,
} from "@connectrpc/connect/protocol-grpc";
import { compressionGzip, universalResponseToNodeResponse } from "@connectrpc/connect-node";
import { AckSchema, Runner, type LogItem } from "../../gen/runner/v1/runner_pb.js";
import { decodeReceivedLine, decodeReceivedRun } from "../protocol/decoder.js";
import { ENVELOPE_PREFIX } from "../protocol/envelope-splitter.js";
import { cancelIfNotDrained } from "./answer-drain.js";
import { respecGrpcMessage } from "../protocol/grpc-message.js";
import type { ReadBudget } from "./read-budget.js";
import { ReceivedLine, toLogItem, type CallItem } from "../protocol/received-line.js";
import { MALFORMED_REFUSAL, ReceivedRun, countRefusal, countRunLines } from "../protocol/received-run.js";
import { BatchList } from "../protocol/batch-list.js";
import { RequestReader, type EnvelopeSink, type RequestBody } from "./request-reader.js";
import {
  kCallAuthenticated,
  kCallHeldBack,
  kItemBatches,
  type ItemBatchSource,
  type RunnerService,
} from "../service/runner-service.js";
import { readErrorOf } from "../protocol/wire-errors.js";
import type { StoreBacklog } from "../service/store-backlog.js";

/** Options of {@link createStreamLogsFastPath}. */
interface StreamLogsFastPathOptions {
  /** Largest message (the whole protobuf message, unknown fields included); larger ones end RESOURCE_EXHAUSTED. */
  messageBytes: number;
  /** Byte accounting shared by the server's calls (first-message limit, connection and server caps). */
  budget: ReadBudget;
  /** Path prefix the service is mounted under; default none. */
  requestPathPrefix?: string;
  /**
   * The service's store backlog (runner/service/store-backlog.ts): authenticated calls pause while it is over budget.
   */
  backlog?: StoreBacklog;
  /**
   * Context values of each call (the same as given to connect); `call` is the call's key (its response, or its stream
   * on the raw path).
   */
  contextValues: (call: object) => ContextValues;
}

/**
 * The fast path's two entries: `request` for the compatibility layer's request and response
 * (a host's own server), `stream` for a raw HTTP/2 stream and its headers (startRunnerServer,
 * which then builds no Http2ServerRequest/Response for these calls: ~6 KiB a call that every
 * open stream kept, and a second Readable every chunk went through). Each returns true when
 * it took the call, false to leave it to connect.
 */
interface StreamLogsFastPath {
  request(req: http2.Http2ServerRequest, res: http2.Http2ServerResponse): boolean;
  stream(stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders): boolean;
}

/**
 * The compressions the connect path accepts (runner/server/connect-path.ts: gzip only); only response negotiation
 * matters here.
 */
const ACCEPT_COMPRESSION = [compressionGzip];
const CONTENT_TYPE = /^application\/grpc(?:\+proto)?$/i;
const method = Runner.method.streamLogs;

/** What the call's response is written to: the status-200 headers, the Ack or nothing, the trailers. */
type Respond = (header: Headers, body: Uint8Array | null, trailer: Headers) => Promise<void>;

/**
 * Creates the fast path (see {@link StreamLogsFastPath}).
 *
 * @example
 * const fast = createStreamLogsFastPath(runner, {
 *   messageBytes,
 *   budget: createReadBudget(),
 *   contextValues: () => createContextValues(),
 * });
 * server.on("request", (req, res) => fast.request(req, res) || adapter(req, res));
 */
export function createStreamLogsFastPath(
  runner: RunnerService,
  options: StreamLogsFastPathOptions,
): StreamLogsFastPath {
  const path = `${options.requestPathPrefix ?? ""}/${Runner.typeName}/${method.name}`;
  // Unknown fields are dropped as read: kept, each is an object, and a first message (read before its call is
  // authenticated) of 128 KiB of them was ~10 MB of heap.
  const parse = createMethodSerializationLookup(method, { readUnknownFields: false }, undefined, {
    readMaxBytes: options.messageBytes,
    writeMaxBytes: 0xffffffff,
  }).getI(true);

  /** True when the headers make a call this path serves. O(headers). */
  function takes(methodName: string | undefined, url: string | undefined, headers: http2.IncomingHttpHeaders): boolean {
    if (methodName !== "POST") return false;
    url ??= "";
    const q = url.indexOf("?");
    if ((q === -1 ? url : url.slice(0, q)) !== path) return false;
    const type = headers["content-type"];
    if (typeof type !== "string" || !CONTENT_TYPE.test(type)) return false;
    const encoding = headers["grpc-encoding"];
    if (encoding !== undefined && encoding !== "identity") return false;
    // connect turns grpc-timeout into a deadline; such calls are rare, so connect keeps them.
    if (headers["grpc-timeout"] !== undefined) return false;
    return headers[":authority"] !== undefined || headers.host !== undefined;
  }

  /** Serves one call whose body is `body` and whose response goes to `respond`. */
  function serve(body: RequestBody, context: FastContext, respond: Respond): void {
    const compression = compressionNegotiate(
      ACCEPT_COMPRESSION,
      context.header(headerEncoding),
      context.header(headerAcceptEncoding),
      headerAcceptEncoding,
    );
    if (compression.response) context.encoding = compression.response.name;

    const items = new ItemQueue((bytes) => parse.parse(bytes));
    const reader = new RequestReader(
      body,
      { messageBytes: options.messageBytes, budget: options.budget, compressed: false, backlog: options.backlog },
      items,
    );
    items.reader = reader;
    // The service says when the call is authenticated: only then may it send on.
    context.values.set(kCallAuthenticated, () => reader.authenticated());
    context.values.set(kCallHeldBack, () => reader.heldBack());
    void (async () => {
      let ack: Uint8Array | null = null;
      let failure: unknown;
      try {
        const answer = await runner.streamLogs(items.source(), context);
        // The Ack is far below connect's compressMinBytes (1 KiB): it is never compressed.
        ack = encodeEnvelope(0, toBinary(AckSchema, isMessage(answer, AckSchema) ? answer : create(AckSchema, answer)));
      } catch (error) {
        failure = error;
        setTrailerStatus(
          context.responseTrailer,
          error instanceof ConnectError
            ? error
            : new ConnectError("internal error", Code.Internal, undefined, undefined, error),
        );
      } finally {
        context.abort(failure);
        // Whatever the client still sends is discarded; the handler resets the stream after the trailers.
        items.clear();
        reader.close();
      }
      // grpc-message in the spec's percent-encoding (runner/protocol/grpc-message.ts): connect's setTrailerStatus wrote
      // encodeURIComponent's.
      const message = context.responseTrailer.get(headerGrpcMessage);
      if (message !== null) context.responseTrailer.set(headerGrpcMessage, respecGrpcMessage(message));
      await respond(context.responseHeader, ack, context.responseTrailer);
    })().catch(() => {
      // The client went away before the response was written; nobody is left to tell.
    });
  }

  return {
    request(req, res) {
      if (!("stream" in req) || !takes(req.method, req.url, req.headers)) return false;
      const context = createFastContext(req, req.headers, options.contextValues(res));
      if (context === null) return false;
      serve(req, context, (header, body, trailer) =>
        universalResponseToNodeResponse({ status: 200, header, body: iterate(body), trailer }, res),
      );
      return true;
    },
    stream(stream, headers) {
      if (!takes(headers[":method"], headers[":path"], headers)) return false;
      const context = createFastContext(stream, headers, options.contextValues(stream));
      if (context === null) return false;
      serve(stream, context, (header, body, trailer) => respondOnStream(stream, header, body, trailer));
      return true;
    },
  };
}

/**
 * Writes a response on a raw stream as Http2ServerResponse writes connect's (the same frames).
 * Why: docs/decisions/runner-fastpath.md, "fast-path.ts: respondOnStream".
 */
function respondOnStream(
  stream: http2.ServerHttp2Stream,
  header: Headers,
  body: Uint8Array | null,
  trailer: Headers,
): Promise<void> {
  if (stream.destroyed || stream.closed) return Promise.resolve();
  const head: http2.OutgoingHttpHeaders = { ":status": 200 };
  header.forEach((value, name) => (head[name] = value));
  const tail: http2.OutgoingHttpHeaders = {};
  trailer.forEach((value, name) => (tail[name] = value));
  // Comes once: on(), no once() wrapper.
  stream.on("wantTrailers", () => {
    try {
      stream.sendTrailers(tail);
    } catch {
      // The stream closed meanwhile.
    }
  });
  stream.respond(head, { waitForTrailers: true });
  if (body !== null) stream.write(body);
  stream.end();
  // A client that never lets the answer out must not keep the stream (runner/server/answer-drain.ts).
  cancelIfNotDrained(stream);
  return Promise.resolve();
}

const noTimeout = () => undefined;

/**
 * The HandlerContext connect's gRPC handler would build for a call without `grpc-timeout`, built in one step.
 * Why: docs/decisions/runner-fastpath.md, "fast-path.ts: FastContext".
 */
class FastContext implements HandlerContext {
  /** The negotiated response compression (grpc-encoding), if any. */
  encoding: string | null = null;
  private responseHeaders: Headers | null = null;
  private responseTrailers: Headers | null = null;
  private readonly controller = new AbortController();

  /**
   * The request's metadata as name, value, name, value… (pseudo-headers left out; the
   * strings are Node's): a flat array is ~200 bytes an open call keeps, Node's headers
   * object (a dictionary) ~450 and a Headers ~1 KiB.
   */
  private readonly metadata: string[] = [];

  constructor(
    readonly url: string,
    nodeHeaders: http2.IncomingHttpHeaders,
    readonly values: ContextValues,
  ) {
    const metadata = this.metadata;
    for (const name in nodeHeaders) {
      if (name.startsWith(":")) continue;
      const value = nodeHeaders[name];
      if (value === undefined) continue;
      if (typeof value === "string") metadata.push(name, value);
      else if (typeof value === "number") metadata.push(name, String(value));
      else for (const v of value) metadata.push(name, v);
    }
  }

  get service() {
    return Runner;
  }
  get method() {
    return method;
  }
  get protocolName() {
    return "grpc";
  }
  get requestMethod() {
    return "POST";
  }
  get timeoutMs() {
    return noTimeout;
  }
  get signal(): AbortSignal {
    return this.controller.signal;
  }

  /** The request's metadata, pseudo-headers left out; a new Headers each time. O(headers). */
  get requestHeader(): Headers {
    const headers = new Headers();
    const metadata = this.metadata;
    for (let i = 0; i < metadata.length; i += 2) headers.append(metadata[i]!, metadata[i + 1]!);
    return headers;
  }

  get responseHeader(): Headers {
    this.responseHeaders ??= new Headers(
      this.encoding === null
        ? { [headerContentType]: contentTypeProto }
        : { [headerContentType]: contentTypeProto, [headerEncoding]: this.encoding },
    );
    return this.responseHeaders;
  }

  get responseTrailer(): Headers {
    this.responseTrailers ??= new Headers({ [headerGrpcStatus]: grpcStatusOk });
    return this.responseTrailers;
  }

  /**
   * One request header as Headers.get gives it (any case of `name`: connect's constants are
   * spelled `Grpc-Accept-Encoding`; repeated values joined with ", "), or null. O(headers).
   */
  header(name: string): string | null {
    // Node's names are lower-case.
    name = name.toLowerCase();
    let out: string | null = null;
    const metadata = this.metadata;
    for (let i = 0; i < metadata.length; i += 2)
      if (metadata[i] === name) out = out === null ? metadata[i + 1]! : `${out}, ${metadata[i + 1]}`;
    return out;
  }

  abort(reason?: unknown): void {
    // A call that ended well aborts its signal too ("aborted when the call ends"): with the
    // one shared AbortError, not a new DOMException (whose stack capture was ~1 % of the fleet
    // bench server's CPU, one per call).
    this.controller.abort(reason ?? CALL_ENDED);
  }

  /** @internal The body closed, with this HTTP/2 reset code. */
  closed(rstCode: number | undefined): void {
    if (!this.controller.signal.aborted) this.controller.abort(resetReason(rstCode));
  }
}

/** The reason of a call's signal when the call ended without a failure: what `abort()` would make, made once. */
const CALL_ENDED = new DOMException("This operation was aborted", "AbortError");

/**
 * The call's {@link FastContext}, or null when the authority makes no URL (connect then
 * answers the request its own way). O(headers).
 */
function createFastContext(
  body: RequestBody,
  nodeHeaders: http2.IncomingHttpHeaders,
  values: ContextValues,
): FastContext | null {
  const raw = !(body instanceof http2.Http2ServerRequest);
  const authority = nodeHeaders[":authority"] ?? nodeHeaders.host;
  let url: string;
  try {
    const encrypted = raw
      ? body.session?.encrypted === true
      : "encrypted" in body.socket && (body.socket as { encrypted?: boolean }).encrypted;
    url = new URL(
      (nodeHeaders[":path"] as string | undefined) ?? "",
      `${encrypted ? "https" : "http"}://${authority}`,
    ).toString();
  } catch {
    return null;
  }
  const context = new FastContext(url, nodeHeaders, values);
  const stream = raw ? body : body.stream;
  // "close" comes once: on(), no once() wrapper. A closure (~100 bytes), not a shared listener
  // finding the context through a symbol on the stream: one more property there moved the
  // stream's properties to a backing store of ~450 bytes.
  body.on("close", () => context.closed(stream?.rstCode));
  return context;
}

/**
 * What connect-node makes of an HTTP/2 reset code (connectErrorFromH2ResetCode, not exported): undefined for NO_ERROR
 * and STREAM_CLOSED.
 */
function resetReason(rstCode: number | undefined): ConnectError | undefined {
  const reset = rstCode === undefined ? undefined : RESETS[rstCode];
  if (reset === undefined) return undefined;
  const [name, code] = reset;
  return new ConnectError(`http/2 stream closed with error code ${name} (0x${rstCode!.toString(16)})`, code);
}

/** HTTP/2 reset codes: their names and the Code connect-node gives each. */
const RESETS: Record<number, readonly [string, Code]> = {
  1: ["PROTOCOL_ERROR", Code.Internal],
  2: ["INTERNAL_ERROR", Code.Internal],
  3: ["FLOW_CONTROL_ERROR", Code.Internal],
  4: ["SETTINGS_TIMEOUT", Code.Internal],
  6: ["FRAME_SIZE_ERROR", Code.Internal],
  7: ["REFUSED_STREAM", Code.Unavailable],
  8: ["CANCEL", Code.Canceled],
  9: ["COMPRESSION_ERROR", Code.Internal],
  10: ["CONNECT_ERROR", Code.Internal],
  11: ["ENHANCE_YOUR_CALM", Code.ResourceExhausted],
  12: ["INADEQUATE_SECURITY", Code.PermissionDenied],
  13: ["HTTP_1_1_REQUIRED", Code.PermissionDenied],
};

async function* iterate(body: Uint8Array | null): AsyncGenerator<Uint8Array> {
  if (body !== null) yield body;
}

/**
 * The decoded items of one call, fed by a RequestReader (which splits the frames and
 * enforces the bounds) and read by the service in batches.
 */
class ItemQueue implements EnvelopeSink {
  private readonly ready = new BatchList<CallItem>();
  private readyBytes = 0;
  private waiter: { resolve: (batch: CallItem[] | null) => void; reject: (error: unknown) => void } | null = null;
  reader: RequestReader | null = null;

  constructor(private readonly parse: (bytes: Uint8Array) => LogItem) {}

  envelope(buf: Buffer, start: number, end: number): void {
    const from = start + ENVELOPE_PREFIX;
    // A plain log line stays bytes in `buf` (no string, no message objects), and so does a plain run of lines, as ONE
    // object whatever its number of lines (none is made a line before the service takes it, runner/server/item-reader.ts);
    // the rest is protobuf-es's. A received chunk is never written again: the decoder may remember what it found in it
    // (byte-scan.ts). O(bytes).
    let item: CallItem | null = decodeReceivedLine(buf, from, end, true) ?? decodeReceivedRun(buf, from, end, true);
    if (item === null) {
      // protobuf-es makes a string a line of a run: a run over the bound, or bytes that are no well-formed message, are
      // refused before it parses them (before the call is authenticated, this is the first message).
      const counted = countRunLines(buf, from, end);
      const overBound = countRefusal(counted);
      if (overBound !== null) throw new ConnectError(overBound, Code.InvalidArgument);
      try {
        item = this.parse(buf.subarray(from, end));
      } catch (error) {
        // protobuf-es refused it: INVALID_ARGUMENT with one line (see runner/protocol/wire-errors.ts).
        const refusal = readErrorOf(error, 0);
        throw new ConnectError(refusal.message, refusal.grpcCode);
      }
      // Not well-formed, yet read: the lines it made were not counted. Refused at once, before the call holds it.
      if (counted < 0) throw new ConnectError(MALFORMED_REFUSAL, Code.InvalidArgument);
    }
    this.ready.push(item);
    this.readyBytes += end - start;
  }

  wake(): void {
    const waiter = this.waiter;
    if (waiter === null) return;
    const reader = this.reader!;
    if (this.ready.length > 0) {
      this.waiter = null;
      waiter.resolve(this.take());
    } else if (reader.failure !== null) {
      this.waiter = null;
      waiter.reject(reader.failure);
    } else if (reader.ended) {
      this.waiter = null;
      waiter.resolve(null);
    }
  }

  /** The request items as the service reads them: in batches, and as a plain async iterable. */
  source(): AsyncIterable<LogItem> & ItemBatchSource {
    const pull = () => this.pull();
    return {
      [kItemBatches]: () => pull,
      // A plain reader gets messages: received lines and runs are turned into LogItems here.
      async *[Symbol.asyncIterator]() {
        for (let batch = await pull(); batch !== null; batch = await pull()) {
          for (const item of batch)
            yield item instanceof ReceivedLine
              ? toLogItem(item)
              : item instanceof ReceivedRun
                ? item.toLogItem()
                : item;
        }
      },
    };
  }

  /** Drops what is queued (the call is over). */
  clear(): void {
    this.ready.clear();
    this.readyBytes = 0;
  }

  private take(): CallItem[] {
    const batch = this.ready.take();
    const bytes = this.readyBytes;
    this.readyBytes = 0;
    this.reader!.taken(bytes);
    return batch;
  }

  private pull(): Promise<CallItem[] | null> {
    const reader = this.reader!;
    if (this.ready.length > 0) return Promise.resolve(this.take());
    if (reader.failure !== null) return Promise.reject(reader.failure);
    if (reader.ended) return Promise.resolve(null);
    return new Promise((resolve, reject) => {
      this.waiter = { resolve, reject };
    });
  }
}
