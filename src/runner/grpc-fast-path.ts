/**
 * The gRPC fast path of createRunnerHandler: plain (uncompressed, binary) gRPC calls of
 * `/runner.v1.Runner/StreamLogs` are read straight off the HTTP/2 request, split into
 * frames and decoded here, and handed to the same service implementation in batches.
 * Everything around the items is connect's own code (handler context, compression
 * negotiation, trailer status, response writer), so the response is the one the connect
 * path would write. Other protocols, compressed requests and calls with a deadline go
 * through connect-node, whose body is fed by the same RequestReader (request-reader.ts), so
 * every call is read within the same bounds.
 */
import type * as http2 from "node:http2";
import { create, isMessage, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError, type ContextValues, type HandlerContext } from "@connectrpc/connect";
import { compressionNegotiate, createMethodSerializationLookup, encodeEnvelope } from "@connectrpc/connect/protocol";
import { contentTypeProto, grpcStatusOk, headerAcceptEncoding, headerContentType, headerEncoding, headerGrpcMessage, headerGrpcStatus, setTrailerStatus } from "@connectrpc/connect/protocol-grpc";
import { compressionBrotli, compressionGzip, universalResponseToNodeResponse } from "@connectrpc/connect-node";
import { AckSchema, Runner, type LogItem } from "../gen/runner/v1/runner_pb.js";
import { decodeReceivedLine } from "./decoder.js";
import { ENVELOPE_PREFIX } from "./envelope-splitter.js";
import { respecGrpcMessage } from "./grpc-message.js";
import type { ReadBudget } from "./read-budget.js";
import { ReceivedLine, toLogItem, type CallItem } from "./received-line.js";
import { RequestReader, type EnvelopeSink } from "./request-reader.js";
import { kCallAuthenticated, kItemBatches, type ItemBatchSource, type RunnerService } from "./service.js";
import { readErrorOf } from "./wire-errors.js";

/** Options of {@link createStreamLogsFastPath}. */
export interface StreamLogsFastPathOptions {
  /** Largest message (the whole protobuf message, unknown fields included); larger ones end RESOURCE_EXHAUSTED. */
  messageBytes: number;
  /** Byte accounting shared by the server's calls (first-message limit, connection and server caps). */
  budget: ReadBudget;
  /** Path prefix the service is mounted under; default none. */
  requestPathPrefix?: string;
  /** Context values of each call (the same as given to connect). */
  contextValues: (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => ContextValues;
}

/** The compressions connect-node offers by default (only response negotiation matters here: requests are identity). */
const ACCEPT_COMPRESSION = [compressionGzip, compressionBrotli];
const CONTENT_TYPE = /^application\/grpc(?:\+proto)?$/i;
const method = Runner.method.streamLogs;

/**
 * Creates the fast path; it returns true when it took the request, false to leave it to connect.
 *
 * @example
 * const fast = createStreamLogsFastPath(runner, { messageBytes, budget: createReadBudget(), contextValues: () => createContextValues() });
 * server.on("request", (req, res) => fast(req, res) || adapter(req, res));
 */
export function createStreamLogsFastPath(
  runner: RunnerService,
  options: StreamLogsFastPathOptions,
): (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => boolean {
  const path = `${options.requestPathPrefix ?? ""}/${Runner.typeName}/${method.name}`;
  const parse = createMethodSerializationLookup(method, undefined, undefined, { readMaxBytes: options.messageBytes, writeMaxBytes: 0xffffffff }).getI(true);

  return function fastPath(req, res) {
    if (req.method !== "POST" || !("stream" in req)) return false;
    const url = req.url ?? "";
    const q = url.indexOf("?");
    if ((q === -1 ? url : url.slice(0, q)) !== path) return false;
    const headers = req.headers;
    const type = headers["content-type"];
    if (typeof type !== "string" || !CONTENT_TYPE.test(type)) return false;
    const encoding = headers["grpc-encoding"];
    if (encoding !== undefined && encoding !== "identity") return false;
    // connect turns grpc-timeout into a deadline; such calls are rare, so connect keeps them.
    if (headers["grpc-timeout"] !== undefined) return false;
    if (req.authority === undefined && headers.host === undefined) return false;

    const context = createFastContext(req, options.contextValues(req, res));
    if (context === null) return false;
    const requestHeader = context.requestHeader;
    const compression = compressionNegotiate(ACCEPT_COMPRESSION, requestHeader.get(headerEncoding), requestHeader.get(headerAcceptEncoding), headerAcceptEncoding);
    if (compression.response) context.responseHeader.set(headerEncoding, compression.response.name);

    const items = new ItemQueue((bytes) => parse.parse(bytes));
    const reader = new RequestReader(req, { messageBytes: options.messageBytes, budget: options.budget, compressed: false }, items);
    items.reader = reader;
    // The service says when the call is authenticated: only then may it send on.
    context.values.set(kCallAuthenticated, () => reader.authenticated());
    void (async () => {
      const body: Uint8Array[] = [];
      let failure: unknown;
      try {
        const ack = await runner.streamLogs(items.source(), context);
        // The Ack is far below connect's compressMinBytes (1 KiB): it is never compressed.
        body.push(encodeEnvelope(0, toBinary(AckSchema, isMessage(ack, AckSchema) ? ack : create(AckSchema, ack))));
      } catch (error) {
        failure = error;
        setTrailerStatus(context.responseTrailer, error instanceof ConnectError ? error : new ConnectError("internal error", Code.Internal, undefined, undefined, error));
      } finally {
        context.abort(failure);
        // Whatever the client still sends is discarded; the handler resets the stream after the trailers.
        items.clear();
        reader.close();
      }
      // grpc-message in the spec's percent-encoding (grpc-message.ts): connect's setTrailerStatus wrote encodeURIComponent's.
      const message = context.responseTrailer.get(headerGrpcMessage);
      if (message !== null) context.responseTrailer.set(headerGrpcMessage, respecGrpcMessage(message));
      await universalResponseToNodeResponse({ status: 200, header: context.responseHeader, body: iterate(body), trailer: context.responseTrailer }, res);
    })().catch(() => {
      // The client went away before the response was written; nobody is left to tell.
    });
    return true;
  };
}

/** A context of the fast path: connect's HandlerContext plus the abort its handler calls. */
type FastContext = HandlerContext & { abort(reason?: unknown): void };

const noTimeout = () => undefined;

/**
 * The HandlerContext connect's gRPC handler would build for a call without `grpc-timeout`,
 * built in one step: connect makes a universal request first (an unused body generator, an
 * AbortController and a copy of the headers) and then the context (two more AbortControllers,
 * linked, and a second copy of the headers), about 3 KiB a call that every open stream kept.
 * Same fields and values; `signal` aborts when the request closes (with connect's reason for
 * an HTTP/2 reset code) or on `abort()`. Null when the authority makes no URL (connect then
 * answers the request its own way). O(headers).
 */
function createFastContext(req: http2.Http2ServerRequest, values: ContextValues): FastContext | null {
  const authority = req.authority ?? req.headers.host;
  let url: string;
  try {
    const encrypted = "encrypted" in req.socket && (req.socket as { encrypted?: boolean }).encrypted;
    url = new URL(req.url ?? "", `${encrypted ? "https" : "http"}://${authority}`).toString();
  } catch {
    return null;
  }
  const requestHeader = new Headers();
  const nodeHeaders = req.headers;
  for (const name in nodeHeaders) {
    if (name.startsWith(":")) continue;
    const value = nodeHeaders[name];
    if (value === undefined) continue;
    if (typeof value === "string") requestHeader.append(name, value);
    else if (typeof value === "number") requestHeader.append(name, String(value));
    else for (const v of value) requestHeader.append(name, v);
  }
  const controller = new AbortController();
  // "close" comes once: no once() wrapper to keep for the whole call.
  req.on("close", () => {
    if (!controller.signal.aborted) controller.abort(resetReason(req.stream?.rstCode));
  });
  return {
    service: Runner,
    method,
    protocolName: "grpc",
    requestMethod: req.method,
    url,
    signal: controller.signal,
    timeoutMs: noTimeout,
    requestHeader,
    responseHeader: new Headers({ [headerContentType]: contentTypeProto }),
    responseTrailer: new Headers({ [headerGrpcStatus]: grpcStatusOk }),
    values,
    abort(reason?: unknown) {
      controller.abort(reason);
    },
  };
}

/** What connect-node makes of an HTTP/2 reset code (connectErrorFromH2ResetCode, not exported): undefined for NO_ERROR and STREAM_CLOSED. */
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

async function* iterate(chunks: Uint8Array[]): AsyncGenerator<Uint8Array> {
  for (const chunk of chunks) yield chunk;
}

/**
 * The decoded items of one call, fed by a RequestReader (which splits the frames and
 * enforces the bounds) and read by the service in batches.
 */
class ItemQueue implements EnvelopeSink {
  private ready: CallItem[] = [];
  private readyBytes = 0;
  private waiter: { resolve: (batch: CallItem[] | null) => void; reject: (error: unknown) => void } | null = null;
  reader: RequestReader | null = null;

  constructor(private readonly parse: (bytes: Uint8Array) => LogItem) {}

  envelope(buf: Buffer, start: number, end: number): void {
    const from = start + ENVELOPE_PREFIX;
    // A plain log line stays bytes in `buf` (no string, no message objects); the rest is protobuf-es's.
    let item: CallItem | null = decodeReceivedLine(buf, from, end);
    if (item === null) {
      try {
        item = this.parse(buf.subarray(from, end));
      } catch (error) {
        // protobuf-es refused it: INVALID_ARGUMENT with one line (see wire-errors.ts).
        const refusal = readErrorOf(error, 0);
        throw new ConnectError(refusal.message, refusal.grpcCode);
      }
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
      // A plain reader gets messages: received lines are turned into LogItems here.
      async *[Symbol.asyncIterator]() {
        for (let batch = await pull(); batch !== null; batch = await pull()) {
          for (const item of batch) yield item instanceof ReceivedLine ? toLogItem(item) : item;
        }
      },
    };
  }

  /** Drops what is queued (the call is over). */
  clear(): void {
    this.ready = [];
    this.readyBytes = 0;
  }

  private take(): CallItem[] {
    const batch = this.ready;
    const bytes = this.readyBytes;
    this.ready = [];
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
