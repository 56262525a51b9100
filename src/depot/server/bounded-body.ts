/**
 * A small request body read whole, within a byte bound and an idle timeout: the attestation and mirror routes'
 * JSON and blob lists. Past the bound the body is refused TOO_LARGE, as announced (Content-Length, before a byte
 * is read) or as read; a body that stalls is refused by the idle timeout. O(maxBytes) memory.
 */
import { RunnerDepotError } from "../../errors.js";
import { readBounded } from "../client/body.js";
import { contentLength } from "./request-headers.js";

/** How long a body may send nothing before it is refused (a slow client never holds a route). */
const IDLE_MS = 30_000;

/**
 * The request's body, at most `maxBytes`; null when it has none. `what` names it in the TOO_LARGE problem.
 *
 * @example
 * const bytes = await boundedRequestBody(request, "an attestation", 64 * 1024);
 */
export async function boundedRequestBody(request: Request, what: string, maxBytes: number): Promise<Buffer | null> {
  const tooLarge = () => new RunnerDepotError("TOO_LARGE", `${what} is at most ${maxBytes} bytes`);
  const announced = contentLength(request);
  if (announced !== undefined && announced > maxBytes) throw tooLarge();
  if (!request.body) return null;
  const { bytes, truncated } = await readBounded(request, what, { maxBytes, idleMs: IDLE_MS }, true);
  if (truncated) throw tooLarge();
  return bytes;
}
