/**
 * How a `StreamLogs` call ended, read on the client side: gRPC status and message,
 * `runner-committed` and `runner-reason` from the trailers (or a trailers-only answer),
 * the Ack, or what stands in for a status when there is none (an HTTP error from a proxy,
 * a broken stream, no answer in time, an answer the client cut off). Every failure becomes a
 * RunnerDepotError with its gRPC code in `details.grpcCode`.
 */
import type http2 from "node:http2";
import { gunzipSync, inflateSync } from "node:zlib";
import { fromBinary } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { RunnerDepotError } from "../../errors.js";
import { AckSchema } from "../../gen/runner/v1/runner_pb.js";
import { certificateError, certificateRefused } from "./tls-errors.js";

/** grpc-status 0 (connect-es has no `Code.OK`: it never reports success as a code). */
export const GRPC_OK = 0 as Code;

/**
 * Most bytes of an answer body the client keeps (an Ack frame is 7 bytes): a server that
 * sends more is not answering the call, and the call fails INTERNAL (docs/runner-protocol.md §9).
 */
export const MAX_ANSWER_BYTES = 64 * 1024;
/** Most bytes a compressed Ack may inflate to (an Ack is 2 bytes), so a small answer cannot be a zip bomb. */
const MAX_ACK_BYTES = 1024;

/** What a finished call left behind: its response head, trailers, body and stream error. */
export interface CallResponse {
  headers?: http2.IncomingHttpHeaders;
  trailers?: http2.IncomingHttpHeaders;
  data: Buffer[];
  error?: Error;
  /** Why the client cancelled it itself (no answer in time, no write progress, an answer over the cap). */
  failure?: { code: Code; message: string };
  /**
   * The job offset one past the last item the call wrote: an Ack ok = true says they are all stored, so its
   * `runner-committed` must reach it (unchecked when absent).
   */
  sentTo?: number;
}

/** A call's outcome: `ok` is the Ack's (status OK), `error` set for anything else. */
interface CallOutcome {
  code?: Code;
  ok?: boolean;
  committed?: number;
  reason?: string;
  error?: RunnerDepotError;
  /** Retrying cannot help whatever the code says (a server certificate the client cannot trust). */
  permanent?: boolean;
  /** The server said it takes runs of lines (`runner-accepts: runs`, docs/runner-protocol.md §2). */
  acceptsRuns?: boolean;
  /** A gRPC status came back (a server answered, whatever it said). */
  answered?: boolean;
}

/**
 * Reads the outcome of a closed call. `sent`: how many items the client has written in
 * all (the highest offset of any call); a `runner-committed` beyond it is a lie, read as a
 * protocol error (INTERNAL, retried) and never applied.
 */
export function readOutcome(c: CallResponse, sent: number): CallOutcome {
  const h = c.headers ?? {};
  const t = c.trailers ?? {};
  const status = header(t, "grpc-status") ?? header(h, "grpc-status");
  const committedText = header(t, "runner-committed") ?? header(h, "runner-committed");
  const committedNum = committedText !== undefined && /^\d+$/.test(committedText) ? Number(committedText) : undefined;
  if (committedNum !== undefined && committedNum > sent) {
    const message = `runner-committed ${committedText!.slice(0, 20)} is beyond the ${sent} items sent: not a conforming runner.v1 answer`;
    return { code: Code.Internal, error: rpcError(message, Code.Internal) };
  }
  const reason = header(t, "runner-reason") ?? header(h, "runner-reason");
  const base = {
    committed: committedNum,
    reason,
    acceptsRuns: acceptsRuns(header(t, "runner-accepts") ?? header(h, "runner-accepts")),
    answered: status !== undefined,
  };
  if (c.failure !== undefined)
    return { ...base, code: c.failure.code, error: rpcError(c.failure.message, c.failure.code) };
  if (status === undefined) {
    const tls = certificateError(c.error);
    if (tls !== undefined) return { code: Code.Unavailable, error: certificateRefused(tls), permanent: true };
    const httpStatus = Number(h[":status"] ?? 200);
    if (httpStatus !== 200) {
      const code = httpToCode(httpStatus);
      return { ...base, code, error: rpcError(`HTTP ${httpStatus}`, code) };
    }
    return {
      ...base,
      code: Code.Unavailable,
      error: networkError(c.error ?? new Error("stream closed without a status")),
    };
  }
  const code = Number(status) as Code;
  if (code !== GRPC_OK) {
    const message = decodeMessage(header(t, "grpc-message") ?? header(h, "grpc-message") ?? "");
    return { ...base, code, error: rpcError(message, code, committedNum) };
  }
  try {
    const ack = parseAck(Buffer.concat(c.data), header(h, "grpc-encoding"));
    // ok = true says every item of the call is stored (docs/runner-protocol.md §6): an answer whose runner-committed
    // falls short of them, or is missing, contradicts itself. Taken as ok, it would start the next call at once with
    // nothing acknowledged, a call a round trip for ever; as a protocol error it is retried with back-off until the
    // deadline.
    if (ack && c.sentTo !== undefined && (committedNum === undefined || committedNum < c.sentTo)) {
      const shown = committedNum === undefined ? "no runner-committed" : `runner-committed ${committedNum}`;
      const message = `an Ack ok = true with ${shown} falls short of ${c.sentTo}, the end of the items the call sent: not a conforming runner.v1 answer`;
      return { ...base, code: Code.Internal, error: rpcError(message, Code.Internal, committedNum) };
    }
    return { ...base, code, ok: ack };
  } catch (e) {
    return {
      ...base,
      code: Code.Internal,
      error: new RunnerDepotError("INTERNAL", `bad Ack: ${String(e)}`, { cause: e }),
    };
  }
}

/** A failure to connect or a broken stream: UNAVAILABLE, always retried. */
export function networkError(cause: unknown): RunnerDepotError {
  const message = cause instanceof Error ? cause.message : String(cause);
  return new RunnerDepotError("UNAVAILABLE", `network error: ${message}`, {
    cause,
    details: { grpcCode: Code.Unavailable },
  });
}

function header(h: http2.IncomingHttpHeaders, name: string): string | undefined {
  const v = h[name];
  return Array.isArray(v) ? v[0] : v;
}

/** Whether a `runner-accepts` value (a comma-separated list of features) names `runs`. O(value), at most 256 bytes read. */
function acceptsRuns(value: string | undefined): boolean {
  if (value === undefined) return false;
  return value
    .slice(0, 256)
    .split(",")
    .some((feature) => feature.trim().toLowerCase() === "runs");
}

/** grpc-message is percent-encoded; a server that did not encode it is shown as sent. */
function decodeMessage(m: string): string {
  try {
    return decodeURIComponent(m);
  } catch {
    return m;
  }
}

function rpcError(message: string, code: Code, committed?: number): RunnerDepotError {
  const err = RunnerDepotError.from(new ConnectError(message, code));
  if (committed !== undefined) err.details.committed = committed;
  err.details.grpcCode = code;
  return err;
}

/** gRPC's HTTP-to-status mapping for responses that are not gRPC at all (proxies, wrong port). */
function httpToCode(status: number): Code {
  switch (status) {
    case 400:
      return Code.Internal;
    case 401:
      return Code.Unauthenticated;
    case 403:
      return Code.PermissionDenied;
    case 404:
      return Code.Unimplemented;
    case 429:
    case 502:
    case 503:
    case 504:
      return Code.Unavailable;
    default:
      return Code.Unknown;
  }
}

/** The Ack's `ok` from the response body: one length-prefixed message, maybe compressed. */
function parseAck(body: Buffer, encoding: string | undefined): boolean {
  if (body.length < 5) throw new Error("no response message");
  const len = body.readUInt32BE(1);
  if (body.length < 5 + len) throw new Error("truncated response message");
  let msg: Buffer = body.subarray(5, 5 + len);
  if ((body[0]! & 1) === 1) {
    if (encoding === "gzip") msg = gunzipSync(msg, { maxOutputLength: MAX_ACK_BYTES });
    else if (encoding === "deflate") msg = inflateSync(msg, { maxOutputLength: MAX_ACK_BYTES });
    else throw new Error(`unsupported grpc-encoding ${encoding}`);
  }
  return fromBinary(AckSchema, msg).ok;
}
