/**
 * Raw runner calls over node:http2 for tests that choose the bytes on the wire: frames,
 * bare prefixes, any of the four protocols, and the status of each call read from gRPC
 * trailers, a gRPC-web trailer frame or a Connect end-stream frame.
 */
import * as http2 from "node:http2";
import { toBinary } from "@bufbuild/protobuf";
import { Code } from "@connectrpc/connect";
import { LogItemSchema, type LogItem } from "../src/gen/runner/v1/runner_pb.js";

export const PATH = "/runner.v1.Runner/StreamLogs";

/** The four ways a StreamLogs call can be made; only plain gRPC takes the fast path. */
export const PROTOCOLS: Record<string, Record<string, string>> = {
  grpc: { "content-type": "application/grpc", te: "trailers" },
  "grpc with grpc-timeout": { "content-type": "application/grpc", te: "trailers", "grpc-timeout": "60S" },
  "grpc-web": { "content-type": "application/grpc-web+proto", "x-grpc-web": "1" },
  connect: { "content-type": "application/connect+proto", "connect-protocol-version": "1" },
};

export function frame(item: LogItem): Buffer {
  const bytes = toBinary(LogItemSchema, item);
  const out = Buffer.alloc(5 + bytes.length);
  out.writeUInt32BE(bytes.length, 1);
  out.set(bytes, 5);
  return out;
}

/** A frame prefix announcing `size` message bytes. */
export function prefix(size: number): Buffer {
  const out = Buffer.alloc(5);
  out.writeUInt32BE(size, 1);
  return out;
}

/** How a raw call ended: its gRPC code (from trailers, a gRPC-web trailer frame or a Connect end-stream frame) and message. */
export interface Status {
  code: number | null;
  message: string;
  /** runner-committed, where the protocol put it. */
  committed?: string;
}

/** A raw call: its stream, and its status once the response is complete. */
export interface RawCall {
  stream: http2.ClientHttp2Stream;
  status: Promise<Status>;
}

export function openCall(session: http2.ClientHttp2Session, protocol: string, token: string, extra: Record<string, string> = {}): RawCall {
  const stream = session.request({ ":method": "POST", ":path": PATH, authorization: `Bearer ${token}`, ...PROTOCOLS[protocol], ...extra });
  stream.on("error", () => undefined);
  let headers: http2.IncomingHttpHeaders = {};
  let trailers: http2.IncomingHttpHeaders = {};
  const body: Buffer[] = [];
  stream.on("response", (h) => (headers = h));
  stream.on("trailers", (t) => (trailers = t));
  stream.on("data", (c: Buffer) => body.push(c));
  const status = new Promise<Status>((resolve) => {
    stream.once("close", () => {
      const st = statusOf(headers, trailers, Buffer.concat(body));
      resolve(st);
    });
  });
  return { stream, status };
}

export function statusOf(headers: http2.IncomingHttpHeaders, trailers: http2.IncomingHttpHeaders, body: Buffer): Status {
  const grpc = trailers["grpc-status"] ?? headers["grpc-status"];
  if (grpc !== undefined) {
    const committed = trailers["runner-committed"] ?? headers["runner-committed"];
    return { code: Number(grpc), message: decodeURIComponent(String(trailers["grpc-message"] ?? headers["grpc-message"] ?? "")), committed: committed === undefined ? undefined : String(committed) };
  }
  // gRPC-web (trailer frame, flag 0x80) and Connect (end-stream frame, flag 0x02) carry the status in the body.
  for (let pos = 0; pos + 5 <= body.length; ) {
    const flags = body[pos]!;
    const size = body.readUInt32BE(pos + 1);
    const payload = body.subarray(pos + 5, pos + 5 + size).toString("utf8");
    pos += 5 + size;
    if (flags & 0x80) {
      const fields = Object.fromEntries(payload.split("\r\n").filter(Boolean).map((l) => [l.slice(0, l.indexOf(":")).toLowerCase(), l.slice(l.indexOf(":") + 1).trim()]));
      return { code: Number(fields["grpc-status"]), message: decodeURIComponent(fields["grpc-message"] ?? ""), committed: fields["runner-committed"] };
    }
    if (flags & 0x02) {
      const end = JSON.parse(payload) as { error?: { code: string; message?: string }; metadata?: Record<string, string[]> };
      const committed = end.metadata?.["runner-committed"]?.[0];
      if (!end.error) return { code: 0, message: "", committed };
      const name = end.error.code.replace(/(^|_)([a-z])/g, (_, __, c: string) => c.toUpperCase());
      return { code: Code[name as keyof typeof Code] as number, message: end.error.message ?? "", committed };
    }
  }
  return { code: null, message: "no status" };
}

/** The statuses of the calls that have ended so far (null for those still open). */
export async function settledStatuses(calls: RawCall[]): Promise<Array<Status | null>> {
  return Promise.all(calls.map((c) => Promise.race([c.status, Promise.resolve(null)])));
}

export function connect(url: string): http2.ClientHttp2Session {
  const session = http2.connect(url);
  session.on("error", () => undefined);
  return session;
}

