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

/** Any backend failure becomes `code` (the side's "backend is down" code), keeping the cause. */
export function s3Failure(error: unknown, code: "STORE_UNAVAILABLE" | "UNAVAILABLE"): RunnerDepotError {
  if (error instanceof RunnerDepotError) return error;
  const message = error instanceof Error ? error.message : String(error);
  return new RunnerDepotError(code, `S3: ${message}`, { cause: error });
}
