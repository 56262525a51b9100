/** How the S3 adapters tell S3's errors apart and turn them into a RunnerDepotError. */
import { RunnerDepotError } from "../../errors.js";

/** The error's `name` (`NoSuchKey`, `InvalidRange`, …), or "" when it has none. */
export function errorName(error: unknown): string {
  return (error as { name?: string } | null)?.name ?? "";
}

/** Whether the AWS SDK threw it for an answer from the endpoint (it carries `$metadata`). */
export function isS3Error(error: unknown): boolean {
  return typeof error === "object" && error !== null && "$metadata" in error;
}

/** Whether the object (or bucket) is not there: `NotFound`, `NoSuchKey` or status 404. */
export function isNotFound(error: unknown): boolean {
  const name = errorName(error);
  const status = (error as { $metadata?: { httpStatusCode?: number } } | null)?.$metadata?.httpStatusCode;
  return name === "NotFound" || name === "NoSuchKey" || status === 404;
}

/**
 * Any backend failure becomes `code` (the side's "backend is down" code), keeping the cause. The message names the
 * failure by its kind and status only: an S3 error's own message is the endpoint's text (a 16 MiB body came back in a
 * problem's detail), and a network error's names the internal endpoint. O(1).
 */
export function s3Failure(error: unknown, code: "STORE_UNAVAILABLE" | "UNAVAILABLE"): RunnerDepotError {
  if (error instanceof RunnerDepotError) return error;
  const e = error as { name?: unknown; code?: unknown; $metadata?: { httpStatusCode?: unknown } } | null;
  const kind = typeof e?.code === "string" ? e.code : typeof e?.name === "string" ? e.name : "Error";
  const status = e?.$metadata?.httpStatusCode;
  // The kind may be the endpoint's own error code: kept to a short token.
  const token = kind.replace(/[^A-Za-z0-9._-]/g, "").slice(0, 64) || "Error";
  const what = `${token}${typeof status === "number" ? ` (HTTP ${status})` : ""}`;
  return new RunnerDepotError(code, `S3 failed: ${what}`, { cause: error });
}
