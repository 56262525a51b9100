/**
 * The client's side of yanks (docs/depot-api.md §Yank): marking a version yanked or taking the mark back, and the
 * `Pkg-Yanked` header an answer about a yanked version carries (its reason, percent-encoded).
 */
import { RunnerDepotError } from "../../errors.js";
import { specPath, versionPart, type DepotConnection } from "./connection.js";
import type { YankResult } from "./types.js";

/** The longest reason a depot takes (depot/catalog/yank.ts YANK_REASON_MAX), in characters. */
const REASON_MAX = 1024;

/**
 * `POST /yank/<name>@<version>` with `Pkg-Reason` (reason given) or `DELETE` (null: un-yank). O(1).
 * The version must be named exactly; the reason is 1 to 1,024 characters without control characters.
 */
export async function sendYank(connection: DepotConnection, spec: string, reason: string | null): Promise<YankResult> {
  const { name, version } = versionPart(spec);
  if (version === undefined) throw new RunnerDepotError("VERSION_INVALID", `yank needs name@version, not ${spec}`);
  const headers: Record<string, string> = {};
  if (reason !== null) {
    const text = reason.trim();
    if (text.length === 0 || text.length > REASON_MAX || /\p{Cc}/u.test(text))
      throw new RunnerDepotError(
        "BAD_REQUEST",
        `A yank reason is 1 to ${REASON_MAX} characters without control characters`,
      );
    headers["pkg-reason"] = encodeURIComponent(text);
  }
  return connection.json<YankResult>(reason === null ? "DELETE" : "POST", `yank/${specPath(name, version)}`, {
    headers,
  });
}

/** The reason a `Pkg-Yanked` header gives, or undefined without one (a malformed escape is kept as sent). */
export function yankedReason(headers: Headers): string | undefined {
  const raw = headers.get("pkg-yanked");
  if (raw === null) return undefined;
  try {
    return decodeURIComponent(raw);
  } catch {
    return raw;
  }
}
