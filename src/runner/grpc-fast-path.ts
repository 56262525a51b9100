/**
 * The gRPC fast path of createRunnerHandler: plain (uncompressed, binary) gRPC calls of
 * `/runner.v1.Runner/StreamLogs` are read straight off the HTTP/2 request, split into
 * frames and decoded here, and handed to the same service implementation in batches.
 * Everything around the items is connect's own code (handler context, compression
 * negotiation, trailer status, response writer), so the response is the one the connect
 * path would write. Other protocols, compressed requests and calls with a deadline go
 * through connect-node unchanged.
 */
import type * as http2 from "node:http2";
import { create, isMessage, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError, createHandlerContext, type ContextValues } from "@connectrpc/connect";
import { compressionNegotiate, createMethodSerializationLookup, encodeEnvelope } from "@connectrpc/connect/protocol";
import { contentTypeProto, grpcStatusOk, headerAcceptEncoding, headerContentType, headerEncoding, headerGrpcStatus, setTrailerStatus } from "@connectrpc/connect/protocol-grpc";
import { compressionBrotli, compressionGzip, universalRequestFromNodeRequest, universalResponseToNodeResponse } from "@connectrpc/connect-node";
import { AckSchema, Runner, type LogItem } from "../gen/runner/v1/runner_pb.js";
import { decodeLogItem } from "./decoder.js";
import { kItemBatches, type ItemBatchSource, type RunnerService } from "./service.js";

/** Options of {@link createStreamLogsFastPath}. */
export interface StreamLogsFastPathOptions {
  /** Largest frame accepted on the wire (connect's `readMaxBytes`); larger ones end RESOURCE_EXHAUSTED. */
  readMaxBytes: number;
  /** Path prefix the service is mounted under; default none. */
  requestPathPrefix?: string;
  /** Context values of each call (the same as given to connect). */
  contextValues: (req: http2.Http2ServerRequest) => ContextValues;
}

/** Decoded items waiting for the service beyond which the request is paused (HTTP/2 flow control pushes back). */
const PAUSE_ITEMS = 16_384;
const PAUSE_BYTES = 4 * 1024 * 1024;
const FRAME_PREFIX = 5;
/** The compressions connect-node offers by default (only response negotiation matters here: requests are identity). */
const ACCEPT_COMPRESSION = [compressionGzip, compressionBrotli];
const CONTENT_TYPE = /^application\/grpc(?:\+proto)?$/i;
const method = Runner.method.streamLogs;

/**
 * Creates the fast path; it returns true when it took the request, false to leave it to connect.
 *
 * @example
 * const fast = createStreamLogsFastPath(runner, { readMaxBytes, contextValues: () => createContextValues() });
 * server.on("request", (req, res) => fast(req, res) || adapter(req, res));
 */
export function createStreamLogsFastPath(
  runner: RunnerService,
  options: StreamLogsFastPathOptions,
): (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => boolean {
  const path = `${options.requestPathPrefix ?? ""}/${Runner.typeName}/${method.name}`;
  const parse = createMethodSerializationLookup(method, undefined, undefined, { readMaxBytes: options.readMaxBytes, writeMaxBytes: 0xffffffff }).getI(true);

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

    let uReq: ReturnType<typeof universalRequestFromNodeRequest>;
    try {
      uReq = universalRequestFromNodeRequest(req, res, undefined, options.contextValues(req));
    } catch {
      // An authority that makes no URL: connect answers it its own way.
      return false;
    }
    // The same context connect's gRPC handler builds.
    const context = createHandlerContext({
      service: Runner,
      method,
      protocolName: "grpc",
      requestMethod: uReq.method,
      timeoutMs: undefined,
      shutdownSignal: undefined,
      requestSignal: uReq.signal,
      requestHeader: uReq.header,
      url: uReq.url,
      responseHeader: { [headerContentType]: contentTypeProto },
      responseTrailer: { [headerGrpcStatus]: grpcStatusOk },
      contextValues: uReq.contextValues,
    });
    const compression = compressionNegotiate(ACCEPT_COMPRESSION, uReq.header.get(headerEncoding), uReq.header.get(headerAcceptEncoding), headerAcceptEncoding);
    if (compression.response) context.responseHeader.set(headerEncoding, compression.response.name);

    const reader = new FrameReader(req, options.readMaxBytes, (bytes) => parse.parse(bytes));
    void (async () => {
      const body: Uint8Array[] = [];
      let failure: unknown;
      try {
        const ack = await runner.streamLogs(reader.source(), context);
        // The Ack is far below connect's compressMinBytes (1 KiB): it is never compressed.
        body.push(encodeEnvelope(0, toBinary(AckSchema, isMessage(ack, AckSchema) ? ack : create(AckSchema, ack))));
      } catch (error) {
        failure = error;
        setTrailerStatus(context.responseTrailer, error instanceof ConnectError ? error : new ConnectError("internal error", Code.Internal, undefined, undefined, error));
      } finally {
        context.abort(failure);
        // Whatever the client still sends is discarded; the handler resets the stream after the trailers.
        reader.close();
      }
      await universalResponseToNodeResponse({ status: 200, header: context.responseHeader, body: iterate(body), trailer: context.responseTrailer }, res);
    })().catch(() => {
      // The client went away before the response was written; nobody is left to tell.
    });
    return true;
  };
}

async function* iterate(chunks: Uint8Array[]): AsyncGenerator<Uint8Array> {
  for (const chunk of chunks) yield chunk;
}

/** Splits the request body into gRPC frames and decodes them as they arrive. */
class FrameReader {
  private ready: LogItem[] = [];
  private readyBytes = 0;
  private failure: unknown = null;
  private ended = false;
  private closed = false;
  private paused = false;
  private waiter: { resolve: (batch: LogItem[] | null) => void; reject: (error: unknown) => void } | null = null;
  /** Bytes of an incomplete frame, and how many are needed before it can be looked at again. */
  private partial: Buffer[] = [];
  private partialBytes = 0;
  private need = FRAME_PREFIX;

  constructor(
    private readonly req: http2.Http2ServerRequest,
    private readonly readMaxBytes: number,
    private readonly parse: (bytes: Uint8Array) => LogItem,
  ) {
    req.on("data", (chunk: Buffer) => this.onData(chunk));
    req.once("end", () => this.onEnd());
    req.once("close", () => {
      if (!this.ended) this.fail(new ConnectError("the request stream was closed", Code.Canceled));
    });
    req.on("error", () => undefined);
  }

  /** The request items as the service reads them: in batches, and as a plain async iterable. */
  source(): AsyncIterable<LogItem> & ItemBatchSource {
    const pull = () => this.pull();
    return {
      [kItemBatches]: () => pull,
      async *[Symbol.asyncIterator]() {
        for (let batch = await pull(); batch !== null; batch = await pull()) yield* batch;
      },
    };
  }

  /** Stops reading items; the rest of the body is drained and dropped. */
  close() {
    this.closed = true;
    this.ready = [];
    this.partial = [];
    if (this.paused) {
      this.paused = false;
      this.req.resume();
    }
  }

  private pull(): Promise<LogItem[] | null> {
    if (this.ready.length > 0) {
      const batch = this.ready;
      this.ready = [];
      this.readyBytes = 0;
      if (this.paused && this.failure === null) {
        this.paused = false;
        this.req.resume();
      }
      return Promise.resolve(batch);
    }
    if (this.failure !== null) return Promise.reject(this.failure);
    if (this.ended) return Promise.resolve(null);
    return new Promise((resolve, reject) => {
      this.waiter = { resolve, reject };
    });
  }

  private wake() {
    const waiter = this.waiter;
    if (waiter === null) return;
    if (this.ready.length > 0) {
      this.waiter = null;
      const batch = this.ready;
      this.ready = [];
      this.readyBytes = 0;
      waiter.resolve(batch);
    } else if (this.failure !== null) {
      this.waiter = null;
      waiter.reject(this.failure);
    } else if (this.ended) {
      this.waiter = null;
      waiter.resolve(null);
    }
  }

  private fail(error: unknown) {
    if (this.failure !== null || this.ended) return;
    this.failure = error;
    this.partial = [];
    this.wake();
  }

  private onEnd() {
    if (this.closed || this.failure !== null) return;
    if (this.partialBytes > 0) {
      this.fail(new ConnectError("protocol error: incomplete envelope", Code.InvalidArgument));
      return;
    }
    this.ended = true;
    this.wake();
  }

  private onData(chunk: Buffer) {
    if (this.closed || this.failure !== null) return;
    let buf = chunk;
    if (this.partialBytes > 0) {
      this.partial.push(chunk);
      this.partialBytes += chunk.length;
      // A frame spread over many chunks is joined once, when it is complete.
      if (this.partialBytes < this.need) return;
      buf = this.partial.length === 1 ? this.partial[0]! : Buffer.concat(this.partial, this.partialBytes);
      this.partial = [];
      this.partialBytes = 0;
    }
    let pos = 0;
    const len = buf.length;
    try {
      while (len - pos >= FRAME_PREFIX) {
        const size = buf.readUInt32BE(pos + 1);
        if (size > this.readMaxBytes) {
          // connect's words, checked on the prefix before the message is buffered.
          throw new ConnectError(`message size ${size} is larger than configured readMaxBytes ${this.readMaxBytes}`, Code.ResourceExhausted);
        }
        const stop = pos + FRAME_PREFIX + size;
        if (stop > len) break;
        if ((buf[pos]! & 1) === 1) throw new ConnectError("received compressed envelope, but do not know how to decompress", Code.Internal);
        const start = pos + FRAME_PREFIX;
        const item = decodeLogItem(buf, start, stop) ?? this.parse(buf.subarray(start, stop));
        this.ready.push(item);
        this.readyBytes += size + 64;
        pos = stop;
      }
    } catch (error) {
      this.fail(error);
      return;
    }
    if (pos < len) {
      const rest = buf.subarray(pos);
      this.partial.push(rest);
      this.partialBytes = rest.length;
      this.need = rest.length >= FRAME_PREFIX ? FRAME_PREFIX + rest.readUInt32BE(1) : FRAME_PREFIX;
    }
    this.wake();
    if (!this.paused && (this.ready.length >= PAUSE_ITEMS || this.readyBytes >= PAUSE_BYTES)) {
      this.paused = true;
      this.req.pause();
    }
  }
}
