/** Per-job tokens: base64url(HMAC-SHA256(secret, lower-case request ID)), no padding. */
import { createHmac, timingSafeEqual } from "node:crypto";

/** A token key: its bytes, a string taken as UTF-8. */
export type JobTokenSecret = string | Uint8Array;

function keyBytes(secret: JobTokenSecret): Uint8Array {
  return typeof secret === "string" ? Buffer.from(secret, "utf8") : secret;
}

/**
 * Mints the token a runner sends as `authorization: Bearer <token>` for one job.
 *
 * @example
 * const token = mintJobToken(process.env.RUNNER_SECRET!, requestId);
 */
export function mintJobToken(secret: JobTokenSecret, requestId: string): string {
  return createHmac("sha256", keyBytes(secret)).update(requestId.toLowerCase(), "utf8").digest("base64url");
}

/**
 * True when `token` is the job's token under any of the secrets (several allow key
 * rotation). Compared in constant time; only the token's length may leak.
 */
export function verifyJobToken(
  secrets: JobTokenSecret | readonly JobTokenSecret[],
  requestId: string,
  token: string,
): boolean {
  const list = Array.isArray(secrets) ? (secrets as readonly JobTokenSecret[]) : [secrets as JobTokenSecret];
  const given = Buffer.from(token, "utf8");
  let ok = false;
  for (const secret of list) {
    const expected = Buffer.from(mintJobToken(secret, requestId), "utf8");
    // timingSafeEqual needs equal lengths; a token of the wrong length is simply wrong.
    if (expected.length === given.length && timingSafeEqual(expected, given)) ok = true;
  }
  return ok;
}
