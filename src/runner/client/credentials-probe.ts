/**
 * The credentials check (docs/decisions/runner-client.md, "Credentials check"): one
 * short StreamLogs call whose only item is `LogItem{request_id}` with no event, so a
 * wrong token or an unknown job is known before the job's command is spawned.
 * Why: docs/decisions/runner-client.md, "credentials-probe.ts: checking credentials with the protocol's own call".
 */
import http2 from "node:http2";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { RunnerDepotError } from "../../errors.js";
import { fetchFailureCause } from "../../fetch-failure.js";
import { AckSchema, LogItemSchema } from "../../gen/runner/v1/runner_pb.js";
import type { RunnerClientTlsOptions } from "./runner-client.js";
import { certificateError, certificateRefused } from "./tls-errors.js";

/** Largest answer body read (an Ack frame is 7 bytes). */
const MAX_ANSWER_BYTES = 64 * 1024;

/** Options of {@link checkJobCredentials}. */
export interface CredentialsCheckOptions {
  /** `http://host:port` (h2c) or `https://host:port`. */
  endpoint: string;
  requestId: string;
  /** The job's token; empty or absent for an open server. */
  token?: string;
  tls?: RunnerClientTlsOptions;
  /** Give up after this long (the answer is then `unreachable`). Default 5000 ms. */
  timeoutMs?: number;
}

/** What the server said. */
export type CredentialsCheckResult =
  /** Credentials accepted; the job may run. `committed`: items the server holds already. */
  | { status: "ok"; committed: number }
  /** The server answered Ack ok = false (a server that lets a job's end come first): the job is over. */
  | { status: "ended"; reason: string }
  /** The server refused the call for good: UNAUTHENTICATED, PERMISSION_DENIED, NOT_FOUND, UNIMPLEMENTED… */
  | { status: "refused"; error: RunnerDepotError }
  /**
   * No usable answer. `answered` false: nothing answered at all (connection refused, DNS,
   * no response headers before the timeout, a proxy's 502/503/504 with no gRPC status),
   * so the runner was never reached. `answered` true: something answered, badly
   * (UNAVAILABLE, INTERNAL, an over-long answer…); the runner client's retries deal with it.
   */
  | { status: "unreachable"; answered: boolean; error: RunnerDepotError };

/**
 * Asks the runner server whether this job's credentials are good, in one short call.
 *
 * @example
 * const check = await checkJobCredentials({ endpoint, requestId, token });
 * if (check.status === "refused") throw check.error; // before spawning anything
 */
export async function checkJobCredentials(options: CredentialsCheckOptions): Promise<CredentialsCheckResult> {
  const url = new URL(options.endpoint);
  const timeoutMs = options.timeoutMs ?? 5000;
  const message = toBinary(LogItemSchema, create(LogItemSchema, { requestId: options.requestId.toLowerCase() }));
  const frame = Buffer.alloc(5 + message.byteLength);
  frame.writeUInt32BE(message.byteLength, 1);
  frame.set(message, 5);

  const session = http2.connect(url.origin, {
    ...(url.protocol === "https:" ? options.tls : {}),
    settings: { enablePush: false },
  });
  session.on("error", () => {});
  // Response headers seen: whatever fails after them, something at the endpoint answered.
  let answered = false;
  try {
    const answer = await new Promise<{
      headers: http2.IncomingHttpHeaders;
      trailers: http2.IncomingHttpHeaders;
      data: Buffer;
    }>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no answer within ${timeoutMs} ms`)), timeoutMs);
      session.once("error", (error) => {
        clearTimeout(timer);
        reject(error);
      });
      const stream = session.request({
        ":method": "POST",
        ":path": `${url.pathname.replace(/\/$/, "")}/runner.v1.Runner/StreamLogs`,
        "content-type": "application/grpc",
        te: "trailers",
        ...(options.token ? { authorization: `Bearer ${options.token}` } : {}),
      });
      let headers: http2.IncomingHttpHeaders = {};
      let trailers: http2.IncomingHttpHeaders = {};
      const chunks: Buffer[] = [];
      stream.on("response", (h) => {
        headers = h;
        answered = true;
      });
      stream.on("trailers", (t) => (trailers = t));
      let bytes = 0;
      stream.on("data", (d: Buffer) => {
        // An Ack is a few bytes: a server sending more is not answering this call.
        bytes += d.length;
        if (bytes > MAX_ANSWER_BYTES)
          stream.destroy(new Error(`the answer is over ${MAX_ANSWER_BYTES} bytes; not a runner.v1 server`));
        else chunks.push(d);
      });
      stream.on("error", (error) => {
        clearTimeout(timer);
        reject(error);
      });
      stream.on("close", () => {
        clearTimeout(timer);
        resolve({ headers, trailers, data: Buffer.concat(chunks) });
      });
      stream.end(frame);
    });
    return outcome(answer.headers, answer.trailers, answer.data);
  } catch (error) {
    const cause = error as Error;
    // A certificate the agent cannot trust will not become trusted by waiting: refused, not unreachable.
    const tls = certificateError(cause);
    if (tls !== undefined) return { status: "refused", error: certificateRefused(tls) };
    return {
      status: "unreachable",
      answered,
      error: new RunnerDepotError("UNAVAILABLE", `cannot reach ${url.origin}: ${fetchFailureCause(cause)}`, { cause }),
    };
  } finally {
    session.destroy();
  }
}

function header(h: http2.IncomingHttpHeaders, name: string): string | undefined {
  const v = h[name];
  return Array.isArray(v) ? v[0] : v;
}

function outcome(
  headers: http2.IncomingHttpHeaders,
  trailers: http2.IncomingHttpHeaders,
  data: Buffer,
): CredentialsCheckResult {
  const status = header(trailers, "grpc-status") ?? header(headers, "grpc-status");
  const committedText = header(trailers, "runner-committed") ?? header(headers, "runner-committed");
  const committed = committedText !== undefined && /^\d+$/.test(committedText) ? Number(committedText) : undefined;
  if (status === undefined) {
    const http = Number(header(headers, ":status") ?? 0);
    const error = new RunnerDepotError("UNAVAILABLE", `not a gRPC answer (HTTP ${http})`);
    // A 404 is a server without runner.v1: refused for good, as the runner client does.
    if (http === 404)
      return {
        status: "refused",
        error: new RunnerDepotError("NOT_FOUND", "no runner.v1 service at this endpoint (HTTP 404)"),
      };
    // A proxy's 502/503/504 without a gRPC status: nothing behind it answered yet.
    return { status: "unreachable", answered: http !== 502 && http !== 503 && http !== 504, error };
  }
  if (status === "0") {
    const ok = data.length >= 5 ? fromBinary(AckSchema, data.subarray(5, 5 + data.readUInt32BE(1))).ok : false;
    // Not what a conforming server answers a lone empty item, but an Ack ok = true is a yes.
    if (ok) return { status: "ok", committed: committed ?? 0 };
    return { status: "ended", reason: header(trailers, "runner-reason") ?? "ended" };
  }
  const code = Number(status) as Code;
  let text = header(trailers, "grpc-message") ?? header(headers, "grpc-message") ?? "";
  try {
    text = decodeURIComponent(text);
  } catch {
    // Left as sent.
  }
  // The item's own check comes after authentication and the job lookup; `runner-committed`
  // shows the server got that far (a request ID refused before it is not given one).
  if (code === Code.InvalidArgument && committed !== undefined) return { status: "ok", committed };
  const error = RunnerDepotError.from(new ConnectError(text, code));
  if (
    code === Code.Unavailable ||
    code === Code.DeadlineExceeded ||
    code === Code.ResourceExhausted ||
    code === Code.Internal ||
    code === Code.Unknown ||
    code === Code.Aborted
  ) {
    // A gRPC status came back: the runner (or a gRPC proxy speaking for it) answered.
    return { status: "unreachable", answered: true, error };
  }
  return { status: "refused", error };
}
