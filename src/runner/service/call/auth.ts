/**
 * Authentication of a call (docs/runner-protocol.md, §2): the bearer token's presence
 * and form before anything is read, then the token (or the host's authorize hook)
 * against the first item's request ID.
 */
import { ConnectError, type HandlerContext } from "@connectrpc/connect";
import { RunnerDepotError } from "../../../errors.js";
import { verifyJobToken } from "../../protocol/token.js";
import { OFFSET_HEADER } from "../contract.js";
import { uErr, type RunnerCore } from "../job-table.js";

/** `Bearer <token>` → token; anything else → null. O(header length), bounded by the transport's header limit. */
function bearer(value: string | null): string | null {
  if (value === null) return null;
  const match = /^Bearer ([A-Za-z0-9\-._~+/]+=*)$/i.exec(value.trim());
  return match ? match[1]! : null;
}

/** `runner-offset` → offset; absent → 0; malformed → NaN. */
export function parseOffset(value: string | null): number {
  if (value === null) return 0;
  if (!/^[0-9]{1,15}$/.test(value.trim())) return Number.NaN;
  return Number(value.trim());
}

/** UNAUTHENTICATED when the service checks tokens itself and the call carries none (first in the check order). */
export function checkTokenPresent(core: RunnerCore, headers: Headers): void {
  if (core.config.secrets && !core.options.authorize && bearer(headers.get("authorization")) === null) {
    throw uErr("UNAUTHENTICATED", "missing or malformed authorization: expected `Bearer <token>`");
  }
}

/** The token (or the authorize hook) against the job `id`; throws the refusal. */
export async function authenticate(core: RunnerCore, ctx: HandlerContext, id: string): Promise<void> {
  const headers = ctx.requestHeader;
  const token = bearer(headers.get("authorization"));
  const authorize = core.options.authorize;
  if (authorize) {
    try {
      await authorize({
        requestId: id,
        headers,
        token,
        offset: parseOffset(headers.get(OFFSET_HEADER)),
        protocol: ctx.protocolName,
        signal: ctx.signal,
      });
    } catch (error) {
      if (error instanceof RunnerDepotError || error instanceof ConnectError) throw error;
      throw new RunnerDepotError("PERMISSION_DENIED", error instanceof Error ? error.message : "not authorized", {
        cause: error,
      });
    }
    return;
  }
  const secrets = core.config.secrets;
  if (secrets && token !== null && !verifyJobToken(secrets, id, token)) {
    throw uErr("PERMISSION_DENIED", "the token is not valid for this job");
  }
}
