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
  compressionBrotli,
  compressionGzip,
  universalRequestFromNodeRequest,
  universalResponseToNodeResponse,
} from "@connectrpc/connect-node";
import { Runner } from "../../gen/runner/v1/runner_pb.js";
import type { ReadBudget } from "./read-budget.js";
import { ConnectBody, RequestReader } from "./request-reader.js";
import { kCallAuthenticated, kCallHeldBack, type RunnerService } from "../service/runner-service.js";
import { Health } from "../../gen/grpc/health/v1/health_pb.js";
import type { RunnerHealth } from "./health.js";
import type { StoreBacklog } from "../service/store-backlog.js";

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
  const encoding = headers["grpc-encoding"] ?? headers["connect-content-encoding"];
  return encoding !== undefined && encoding !== "identity";
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
  const router = createConnectRouter({
    readMaxBytes: options.messageBytes,
    acceptCompression: [compressionGzip, compressionBrotli],
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
    const body = new ConnectBody();
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
