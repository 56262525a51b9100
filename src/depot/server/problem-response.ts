/**
 * The depot router's answers: JSON bodies, and anything thrown mapped to a problem+json
 * response with its documented code (docs/depot-api.md §Errors). A failing backend that is
 * likely to come back answers 503 STORE_UNAVAILABLE with Retry-After, not 500.
 */
import { RunnerDepotError } from "../../errors.js";

/** Error codes of Node, PostgreSQL and the network that mean "the store may come back". */
const TRANSIENT_CODES = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "ETIMEDOUT",
  "EAI_AGAIN",
  "ENOTFOUND",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "EPIPE",
  "ENOSPC",
  "EMFILE",
  "57P01",
  "57P03",
  "53300",
]);

/** A JSON answer that no cache keeps. */
export function json(status: number, body: unknown, headers: Record<string, string> = {}): Response {
  return new Response(JSON.stringify(body), {
    status,
    headers: { "Content-Type": "application/json", "Cache-Control": "no-store", ...headers },
  });
}

/** Maps anything thrown to a problem+json response; a 500 never carries internals. */
export function problemResponse(
  reason: unknown,
  request: Request,
  onError: (error: unknown, request: Request) => void,
): Response {
  let error: RunnerDepotError;
  if (reason instanceof RunnerDepotError) {
    error =
      reason.code === "UNAVAILABLE"
        ? new RunnerDepotError("STORE_UNAVAILABLE", "The package store is unavailable; retry later", { cause: reason })
        : reason;
  } else if (isTransient(reason)) {
    error = new RunnerDepotError("STORE_UNAVAILABLE", "The package store is unavailable; retry later", {
      cause: reason,
    });
  } else {
    error = new RunnerDepotError("INTERNAL", "internal error", { cause: reason });
  }
  // Every 5xx keeps its status and code (503, 504, 502…); only INTERNAL hides its detail (toProblem).
  if (error.status >= 500 && error.code !== "STORE_UNAVAILABLE") onError(reason, request);
  const { wwwAuthenticate, allow, ...problem } = error.toProblem() as Record<string, unknown>;
  const headers: Record<string, string> = { "Content-Type": "application/problem+json", "Cache-Control": "no-store" };
  if (error.status === 405 && typeof allow === "string") headers.Allow = allow;
  if (error.status === 401)
    headers["WWW-Authenticate"] = typeof wwwAuthenticate === "string" ? wwwAuthenticate : 'Bearer realm="runner-depot"';
  if (typeof problem.retryAfter === "number") headers["Retry-After"] = String(problem.retryAfter);
  if (error.code === "STORE_UNAVAILABLE") headers["Retry-After"] = "5";
  return new Response(JSON.stringify(problem), { status: error.status, headers });
}

function isTransient(reason: unknown): boolean {
  const error = reason as { code?: unknown; name?: unknown; $metadata?: { httpStatusCode?: number } } | null;
  if (!error || typeof error !== "object") return false;
  if (typeof error.code === "string" && TRANSIENT_CODES.has(error.code)) return true;
  if (error.name === "TimeoutError" || error.name === "ServiceUnavailable" || error.name === "SlowDown") return true;
  return error.$metadata?.httpStatusCode === 503;
}
