/**
 * How the depot answers a request for stored bytes (archives, deltas): ETag and
 * `Repr-Digest`, `304`, a signed redirect when the store can sign, `Range` with `206` and
 * `416`, and the body streamed without reading ahead of the client. The body is also
 * offered natively to a Node host (depot/server/native-body.ts).
 */
import { RunnerDepotError } from "../../errors.js";
import { isStoreDigest, toHttpDigest } from "../package/digest.js";
import { setNativeResponseBody } from "./native-body.js";
import type { ByteRange } from "../ports.js";
import { lazyWebStream } from "./web-streams.js";

const IMMUTABLE = "public, max-age=31536000, immutable";

/** True when an `If-None-Match` header matches `etag` (weak comparison, `*` matches). */
export function matchesEtag(header: string | null, etag: string): boolean {
  if (header === null) return false;
  if (header.trim() === "*") return true;
  return header.split(",").some((tag) => tag.trim().replace(/^W\//, "") === etag);
}

type RangeAnswer = { kind: "full" } | { kind: "partial"; start: number; end: number } | { kind: "unsatisfiable" };

/** A single `bytes=` range (RFC 9110); anything malformed or multi-range is served whole. */
function parseRangeHeader(header: string | null, size: number): RangeAnswer {
  if (header === null) return { kind: "full" };
  const match = /^\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*$/.exec(header);
  if (!match || (match[1] === "" && match[2] === "")) return { kind: "full" };
  if (match[1] === "") {
    const suffix = Number(match[2]);
    if (suffix === 0 || size === 0) return { kind: "unsatisfiable" };
    return { kind: "partial", start: Math.max(0, size - suffix), end: size - 1 };
  }
  const start = Number(match[1]);
  const end = match[2] === "" ? size - 1 : Math.min(Number(match[2]), size - 1);
  if (match[2] !== "" && Number(match[2]) < start) return { kind: "full" };
  if (start >= size) return { kind: "unsatisfiable" };
  return { kind: "partial", start, end };
}

/** Bytes the depot serves: an assembled archive or delta (depot/package/archive.ts). */
export interface ByteSource {
  /**
   * `sha256:<hex>` of the whole representation: the strong ETag and Repr-Digest (absent: a delta's HEAD before any GET
   * hashed it).
   */
  digest?: string;
  /** Exact length. */
  size: number;
  /** The bytes, or an inclusive range of them; `borrow` as in readArchive (depot/package/archive.ts). */
  read(range?: ByteRange, options?: { borrow?: boolean }): AsyncIterable<Uint8Array>;
  /** A signed URL of a materialised copy, when the store serves by redirect; else null. */
  signedUrl?(): Promise<string | null>;
}

/**
 * Answers a GET or HEAD for `source`: 304 on a matching If-None-Match, a 302 to a signed
 * URL when the store offers one, 416 for a range past the end, 206 for one satisfiable
 * range (If-Range honoured), else 200 with Content-Length and Content-Digest.
 */
export async function serveBytes(request: Request, source: ByteSource, filename: string): Promise<Response> {
  const { digest, size } = source;
  if (digest !== undefined && !isStoreDigest(digest))
    throw new RunnerDepotError("INTERNAL", `Bad stored digest ${digest}`);
  const etag = digest === undefined ? null : `"${digest.slice(7)}"`;
  const reprDigest = digest === undefined ? null : toHttpDigest(digest);
  const tags: Record<string, string> = etag && reprDigest ? { ETag: etag, "Repr-Digest": reprDigest } : {};
  const headers: Record<string, string> = {
    ...tags,
    "Cache-Control": etag ? IMMUTABLE : "no-cache",
    "Accept-Ranges": "bytes",
  };
  if (etag && matchesEtag(request.headers.get("if-none-match"), etag))
    return new Response(null, { status: 304, headers });
  const url = (await source.signedUrl?.()) ?? null;
  if (url)
    return new Response(null, { status: 302, headers: { ...headers, Location: url, "Cache-Control": "no-store" } });
  const ifRange = request.headers.get("if-range");
  const range =
    ifRange !== null && ifRange.trim() !== etag
      ? ({ kind: "full" } as RangeAnswer)
      : parseRangeHeader(request.headers.get("range"), size);
  if (range.kind === "unsatisfiable") {
    const problem = new RunnerDepotError("RANGE_NOT_SATISFIABLE", `The archive has ${size} bytes`).toProblem();
    return new Response(JSON.stringify(problem), {
      status: 416,
      headers: {
        "Content-Type": "application/problem+json",
        "Content-Range": `bytes */${size}`,
        ...tags,
        "Accept-Ranges": "bytes",
      },
    });
  }
  headers["Content-Type"] = "application/x-tar";
  headers["Content-Disposition"] = `attachment; filename="${filename}"`;
  const head = request.method === "HEAD";
  let status = 200;
  let bytes: ByteRange | undefined;
  if (range.kind === "partial") {
    status = 206;
    bytes = { start: range.start, end: range.end };
    headers["Content-Range"] = `bytes ${range.start}-${range.end}/${size}`;
    headers["Content-Length"] = String(range.end - range.start + 1);
  } else {
    headers["Content-Length"] = String(size);
    if (reprDigest) headers["Content-Digest"] = reprDigest;
  }
  if (head || size === 0) return new Response(null, { status, headers });
  // The Web body gets chunks of its own; a Node host waits for each borrowed chunk's write
  // (depot/server/node-handler.ts).
  return setNativeResponseBody(
    new Response(
      lazyWebStream(() => source.read(bytes)),
      { status, headers },
    ),
    () => source.read(bytes, { borrow: true }),
  );
}
