/**
 * Small helpers the depot client and installer share: digest notations, problem
 * documents turned into RunnerDepotError, and percent-encoding of header values.
 */
import { createHash } from "node:crypto";
import { RunnerDepotError, type ErrorCode } from "../../errors.js";
import { parseHttpDigest, toHttpDigest } from "../package/digest.js";
import { DEFAULT_LIMITS, readBounded } from "./body.js";

/** SHA-256 as lower-case hex from any notation the depot uses: `sha256:<hex>` or `sha-256=:<base64>:`. */
export function digestToHex(value: string): string | null {
  const text = value.trim();
  const prefixed = /^sha-?256:([0-9a-fA-F]{64})$/.exec(text);
  if (prefixed) return prefixed[1]!.toLowerCase();
  if (/^[0-9a-fA-F]{64}$/.test(text)) return text.toLowerCase();
  // The client is lenient where the server is strict: a malformed header is just "no digest".
  try {
    return parseHttpDigest(text)?.slice("sha256:".length) ?? null;
  } catch {
    return null;
  }
}

/** `sha-256=:<base64>:` (RFC 9530) for a hex SHA-256. */
export function hexToHttpDigest(hex: string): string {
  return toHttpDigest(hexToDigest(hex));
}

/** `sha256:<hex>`, the depot's stored notation. */
export function hexToDigest(hex: string): string {
  return `sha256:${hex}`;
}

/** A streaming SHA-256 of the given chunks, as hex. */
export async function sha256OfStream(chunks: AsyncIterable<Uint8Array>): Promise<{ hex: string; size: number }> {
  const hash = createHash("sha256");
  let size = 0;
  for await (const chunk of chunks) {
    hash.update(chunk);
    size += chunk.byteLength;
  }
  return { hex: hash.digest("hex"), size };
}

/** Percent-encodes a header value (UTF-8), so that commas and non-ASCII survive header folding. */
export function encodeHeaderValue(value: string): string {
  return encodeURIComponent(value);
}

/** Codes the server may send that this build knows; anything else maps by HTTP status. */
function asErrorCode(code: unknown): ErrorCode | null {
  if (typeof code !== "string" || !/^[A-Z][A-Z0-9_]*$/.test(code)) return null;
  try {
    // The constructor looks the code up in the table and throws on an unknown one.
    void new RunnerDepotError(code as ErrorCode, "");
    return code as ErrorCode;
  } catch {
    return null;
  }
}

const STATUS_CODES: Record<number, ErrorCode> = {
  400: "BAD_REQUEST",
  401: "UNAUTHENTICATED",
  403: "PERMISSION_DENIED",
  404: "NOT_FOUND",
  409: "CONFLICT",
  410: "TRANSACTION_GONE",
  413: "TOO_LARGE",
  416: "RANGE_NOT_SATISFIABLE",
  422: "COMMIT_INVALID",
  429: "TOO_MANY_TRANSACTIONS",
  431: "HEADERS_TOO_LARGE",
  503: "STORE_UNAVAILABLE",
};

/**
 * Turns a non-2xx response into a RunnerDepotError carrying the server's problem
 * `code`, status and extra members (e.g. `problems` of a failed commit). At most
 * 64 KiB of the body is read, within `timing` (a longer or stalled one keeps the status only).
 */
export async function errorFromResponse(
  response: Response,
  what: string,
  timing: { idleMs: number; totalMs: number } = {
    idleMs: DEFAULT_LIMITS.idleTimeoutMs,
    totalMs: DEFAULT_LIMITS.jsonTimeoutMs,
  },
): Promise<RunnerDepotError> {
  let problem: Record<string, unknown> = {};
  const read = await readBounded(response, what, { maxBytes: DEFAULT_LIMITS.maxErrorBytes, ...timing }, true).catch(
    () => null,
  );
  const text = read && !read.truncated ? read.bytes.toString("utf8") : "";
  try {
    const parsed: unknown = JSON.parse(text);
    if (parsed && typeof parsed === "object") problem = parsed as Record<string, unknown>;
  } catch {
    // Not a problem document (a proxy's HTML page, say): keep the status only.
  }
  const serverCode = typeof problem.code === "string" ? problem.code : undefined;
  const code =
    asErrorCode(serverCode) ??
    STATUS_CODES[response.status] ??
    (response.status >= 500 ? "UNAVAILABLE" : "BAD_REQUEST");
  let detail = typeof problem.detail === "string" ? problem.detail : response.statusText || `HTTP ${response.status}`;
  // A failed commit lists every problem: name them in the message, not only in details.
  if (Array.isArray(problem.problems) && problem.problems.length > 0) {
    const listed = problem.problems.slice(0, 5).map((p: unknown) => {
      const item = p as { detail?: unknown; code?: unknown };
      return typeof item?.detail === "string" ? item.detail : JSON.stringify(p);
    });
    detail += ` (${listed.join("; ")}${problem.problems.length > 5 ? "; …" : ""})`;
  }
  const { type: _t, title: _ti, status: _s, detail: _d, code: _c, ...rest } = problem;
  const details: Record<string, unknown> = { ...rest };
  if (serverCode !== undefined && serverCode !== code) details.serverCode = serverCode;
  const retryAfter = response.headers.get("retry-after");
  if (retryAfter !== null) details.retryAfter = retryAfter;
  return new RunnerDepotError(code, `${what}: ${detail}`, { status: response.status, details });
}
