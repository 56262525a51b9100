/**
 * The connect-node side of createRunnerHandler: every call the gRPC fast path does not take (Connect,
 * gRPC-web, JSON, compressed requests, calls with a deadline) is served by connect's own protocol handlers,
 * but its body is read by a RequestReader and handed to connect as whole envelopes
 * (runner/server/request-reader.ts).
 * Why: docs/decisions/runner-server.md, "connect-path.ts: connect's handlers fed whole envelopes".
 */
import type * as http2 from "node:http2";
import { Code, ConnectError, createConnectRouter, type ContextValues } from "@connectrpc/connect";
import {
  compressionGzip,
  universalRequestFromNodeRequest,
  universalResponseToNodeResponse,
} from "@connectrpc/connect-node";
import { Runner } from "../../gen/runner/v1/runner_pb.js";
import type { ReadBudget } from "./read-budget.js";
import { ConnectBody, RequestReader } from "./request-reader.js";
import { kCallAuthenticated, kCallHeldBack, type RunnerService } from "../service/runner-service.js";
import { kFirstItemCheck } from "./call-context.js";
import { peekDecompressed, requestIdAtStart } from "./first-message-peek.js";
import { Health } from "../../gen/grpc/health/v1/health_pb.js";
import type { RunnerHealth } from "./health.js";
import type { StoreBacklog } from "../service/store-backlog.js";
import { isConnectUnary, serveUnaryHealth } from "./unary-health.js";

/** Options of {@link createConnectPath}. */
interface ConnectPathOptions {
  /** Largest message (decompressed); larger ones end RESOURCE_EXHAUSTED. */
  messageBytes: number;
  /** Byte accounting shared by the server's calls. */
  budget: ReadBudget;
  /** Path prefix the service is mounted under; default none. */
  requestPathPrefix?: string;
  /**
   * The service's store backlog (runner/service/store-backlog.ts): authenticated calls pause while it is over budget.
   */
  backlog?: StoreBacklog;
  /** Context values of each call (`call`: its key, the response). */
  contextValues: (call: object) => ContextValues;
  /** The health service served beside the runner service; none when null or absent. */
  health?: RunnerHealth | null;
}

/** A request names a compression when its encoding header is set to anything but identity. */
function namesCompression(headers: http2.IncomingHttpHeaders): boolean {
  return compressionOf(headers) !== null;
}

/** The compression a request names, or null for none (identity). */
function compressionOf(headers: http2.IncomingHttpHeaders): string | null {
  const encoding = headers["grpc-encoding"] ?? headers["connect-content-encoding"];
  return typeof encoding === "string" && encoding !== "identity" ? encoding : null;
}

/** The message encoding a request names: connect reads the content type without regard to case (`+JSON` too). */
function encodingOf(headers: http2.IncomingHttpHeaders): "json" | "binary" {
  return String(headers["content-type"] ?? "")
    .toLowerCase()
    .includes("json")
    ? "json"
    : "binary";
}

/**
 * What a compressed StreamLogs call's first chunk goes through before connect decompresses
 * it: a compressed first message is refused unless the request ID in its first
 * decompressed bytes passes the service's token check (kFirstItemCheck). O(PEEK_BYTES).
 */
function firstMessageGate(encoding: string, values: ContextValues): (chunk: Buffer) => Promise<void> {
  return async (chunk) => {
    if (chunk.length < 5 || (chunk[0]! & 1) === 0) return;
    const check = values.get(kFirstItemCheck);
    // An unknown encoding is connect's to refuse (UNIMPLEMENTED); a service not runner-depot's own sets no check.
    const peeked =
      check === undefined ? null : peekDecompressed(encoding, chunk.subarray(5, 5 + chunk.readUInt32BE(1)));
    if (peeked === null) return;
    let bytes: Buffer;
    try {
      bytes = await peeked;
    } catch {
      throw new ConnectError("the first message could not be decompressed", Code.InvalidArgument);
    }
    const requestId = requestIdAtStart(bytes);
    if (requestId === null)
      throw new ConnectError(
        "a compressed first message must begin with its request_id (field 1) within its first 256 bytes",
        Code.InvalidArgument,
      );
    await check!(requestId);
  };
}

/**
 * Creates the connect-node request handler of a runner service.
 *
 * @example
 * const connectPath = createConnectPath(runner, {
 *   messageBytes,
 *   budget: createReadBudget(),
 *   contextValues: () => createContextValues(),
 * });
 * http2.createServer(connectPath);
 */
export function createConnectPath(
  runner: RunnerService,
  options: ConnectPathOptions,
): (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => void {
  // connect's readMaxBytes applies to decompressed messages; uncompressed ones are refused
  // on their prefix by the reader, with the same limit.
  // Requests may be gzip only: a brotli first message costs its whole decoder window (up to
  // 16 MiB) before its request ID can be read (docs/decisions/runner-server.md, "Compressed first messages").
  // Unknown fields dropped as read, as on the fast path (fast-path.ts).
  const router = createConnectRouter({
    readMaxBytes: options.messageBytes,
    acceptCompression: [compressionGzip],
    binaryOptions: { readUnknownFields: false },
  });
  router.service(Runner, runner);
  if (options.health) router.service(Health, options.health);
  const prefix = options.requestPathPrefix ?? "";
  const paths = new Map(router.handlers.map((h) => [prefix + h.requestPath, h]));

  return function connectPath(req, res) {
    const uHandler = paths.get((req.url ?? "").split("?", 2)[0]!);
    if (!uHandler) {
      res.writeHead(404);
      res.end();
      return;
    }
    const values = options.contextValues(res);
    let uReq: ReturnType<typeof universalRequestFromNodeRequest>;
    try {
      uReq = universalRequestFromNodeRequest(req, res, undefined, values);
    } catch {
      // No :authority and no Host: no URL to build.
      res.writeHead(400);
      res.end();
      return;
    }
    // Health's unary calls over the Connect protocol: a bare message, read under the same budget (unary-health.ts).
    if (uHandler.method.methodKind === "unary" && uHandler.service.typeName === Health.typeName && isConnectUnary(req))
      return serveUnaryHealth(uHandler, uReq, req, res, options.budget);
    const encoding = compressionOf(req.headers);
    const runner = uHandler.service.typeName === Runner.typeName;
    const body = new ConnectBody(
      encoding !== null && runner ? firstMessageGate(encoding, values) : null,
      // Runs counted before connect parses a message (a string a line), in the encoding the call names.
      runner ? encodingOf(req.headers) : null,
    );
    const reader = new RequestReader(
      req,
      {
        messageBytes: options.messageBytes,
        budget: options.budget,
        compressed: namesCompression(req.headers),
        backlog: options.backlog,
      },
      body,
    );
    body.attach(reader);
    values.set(kCallAuthenticated, () => reader.authenticated());
    values.set(kCallHeldBack, () => reader.heldBack());
    // Health calls carry no credentials: one small message each, read on at once (never
    // widening the connection's windows: a caller without a token must not).
    if (uHandler.service.typeName === Health.typeName) reader.readOn();
    uHandler({ ...uReq, body })
      .then((uRes) => universalResponseToNodeResponse(uRes, res))
      .catch((reason: unknown) => {
        // As connectNodeAdapter: a call the client aborted is not worth a word.
        if (ConnectError.from(reason).code !== Code.Aborted)
          console.error(`handler for rpc ${uHandler.method.name} of ${uHandler.service.typeName} failed`, reason);
      })
      .finally(() => reader.close());
  };
}
