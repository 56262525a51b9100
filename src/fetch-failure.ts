/**
 * Names why a `fetch` failed. Undici's own message is only "fetch failed"; the reason
 * (refused, DNS, TLS, timeout, reset) sits in `error.cause.code`, sometimes one level
 * deeper (a TLS error wrapped by the connector), which this reads.
 */

/** Why a request never got an answer, in words a user can act on. */
export function fetchFailureCause(error: unknown): string {
  const chain: Array<{ code?: string; name?: string; message?: string }> = [];
  for (let e = error as { cause?: unknown } | undefined, depth = 0; e && depth < 4; e = e.cause as typeof e, depth++) {
    chain.push(e as { code?: string; name?: string; message?: string });
  }
  for (const e of chain) {
    const code = typeof e.code === "string" ? e.code : "";
    if (code === "ECONNREFUSED") return "connection refused (ECONNREFUSED): nothing listens there";
    if (code === "ENOTFOUND" || code === "EAI_AGAIN" || code === "EAI_NONAME")
      return `DNS lookup failed (${code}): no such host`;
    if (code === "ECONNRESET" || code === "UND_ERR_SOCKET" || code === "EPIPE") return `connection reset (${code})`;
    if (
      code === "ETIMEDOUT" ||
      code === "UND_ERR_CONNECT_TIMEOUT" ||
      code === "UND_ERR_HEADERS_TIMEOUT" ||
      code === "UND_ERR_BODY_TIMEOUT"
    ) {
      return `timed out (${code})`;
    }
    // A caller's own deadline (the command's $RUNNER_DEPOT_TIMEOUT) says what it waited for.
    if (code === "ANSWER_TIMEOUT") return `timed out: ${e.message ?? ""}`;
    if (e.name === "TimeoutError") return "timed out";
    if (code === "EHOSTUNREACH" || code === "ENETUNREACH") return `host unreachable (${code})`;
    // OpenSSL's record-layer errors mean the other end is not speaking TLS at all.
    if (
      code === "ERR_SSL_WRONG_VERSION_NUMBER" ||
      code === "ERR_SSL_PACKET_LENGTH_TOO_LONG" ||
      /wrong version number/i.test(e.message ?? "")
    ) {
      return `TLS failed (${code || "wrong version number"}): the server does not speak TLS there (http:// rather than https://?)`;
    }
    if (/CERT|SSL|TLS|SELF_SIGNED|UNABLE_TO_VERIFY|HOSTNAME/.test(code))
      return `TLS failed (${code}): ${(e.message ?? "").split("\n")[0]}`;
  }
  const last = chain.at(-1);
  return last?.message && last.message !== "fetch failed" ? last.message : String((error as Error)?.message ?? error);
}
