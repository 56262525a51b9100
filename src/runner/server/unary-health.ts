/**
 * Health's unary calls (`Check`, `List`) over the Connect protocol, whose request body is the bare message, not an
 * envelope (a GET, or a POST of `application/json` or `application/proto`). They carry no credentials, so they are
 * read under the same budget as any call before authentication: they count among the unauthenticated calls, their
 * bytes among the connection's and the server's, at most UNARY_BODY_BYTES each, the whole body within
 * `firstMessageMs`. Why: docs/decisions/runner-server.md, "connect-path.ts: connect's handlers fed whole envelopes".
 */
import type * as http2 from "node:http2";
import { constants as h2 } from "node:http2";
import { Code, ConnectError } from "@connectrpc/connect";
import type { UniversalHandler, UniversalServerRequest } from "@connectrpc/connect/protocol";
import { universalResponseToNodeResponse } from "@connectrpc/connect-node";
import type { ReadBudget } from "./read-budget.js";

/** Largest body of a unary Health call: a HealthCheckRequest is one service name. */
export const UNARY_BODY_BYTES = 4096;

/**
 * A Connect unary request: a GET, or a POST whose body is the bare message (`application/json`,
 * `application/proto`), not enveloped as every gRPC, gRPC-web and Connect streaming body is. O(1).
 */
export function isConnectUnary(req: http2.Http2ServerRequest): boolean {
  const type = String(req.headers["content-type"] ?? "").toLowerCase();
  return req.method === "GET" || type.startsWith("application/json") || type.startsWith("application/proto");
}

/**
 * Serves one unary Health call read under `budget`; connect answers its errors (UNAVAILABLE past the budget,
 * RESOURCE_EXHAUSTED past UNARY_BODY_BYTES) in the call's protocol.
 *
 * @example
 * if (handler.method.methodKind === "unary" && isConnectUnary(req)) return serveUnaryHealth(handler, uReq, req, res, budget);
 */
export function serveUnaryHealth(
  handler: UniversalHandler,
  uReq: UniversalServerRequest,
  req: http2.Http2ServerRequest,
  res: http2.Http2ServerResponse,
  budget: ReadBudget,
): void {
  const entered = budget.enterUnauthenticated();
  const timer = setTimeout(() => req.stream.close(h2.NGHTTP2_CANCEL), budget.limits.firstMessageMs);
  const body = entered ? boundedBody(req, budget) : refused(budget.limits.unauthenticatedCalls);
  handler({ ...uReq, body })
    .then((uRes) => universalResponseToNodeResponse(uRes, res))
    .catch((reason: unknown) => {
      if (ConnectError.from(reason).code !== Code.Aborted)
        console.error(`handler for rpc ${handler.method.name} of ${handler.service.typeName} failed`, reason);
    })
    .finally(() => {
      clearTimeout(timer);
      if (entered) budget.leaveUnauthenticated();
    });
}

/** The request's bytes, counted against the connection's and the server's budget while read. O(body). */
async function* boundedBody(req: http2.Http2ServerRequest, budget: ReadBudget): AsyncIterable<Uint8Array> {
  const connection = req.stream.session ?? req.stream;
  let held = 0;
  try {
    for await (const chunk of req as AsyncIterable<Buffer>) {
      if (held + chunk.length > UNARY_BODY_BYTES)
        throw new ConnectError(`a unary request body is over ${UNARY_BODY_BYTES} bytes`, Code.ResourceExhausted);
      if (budget.adjust(connection, chunk.length) !== null)
        throw new ConnectError("the server holds too many bytes of unfinished requests; retry later", Code.Unavailable);
      held += chunk.length;
      yield chunk;
    }
  } finally {
    budget.adjust(connection, -held);
  }
}

/** A body that refuses the call: too many calls wait for their first message. */
async function* refused(limit: number): AsyncIterable<Uint8Array> {
  throw new ConnectError(
    `the server has ${limit} calls waiting for their first message or its check; retry the call later`,
    Code.Unavailable,
  );
}
