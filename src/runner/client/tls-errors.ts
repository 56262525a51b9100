/** Which TLS failures retrying cannot fix: the server's certificate is one the agent will never trust as configured. */
import { Code } from "@connectrpc/connect";
import { RunnerDepotError } from "../../errors.js";

/**
 * OpenSSL's verify results (Node's `error.code`) for an unknown CA, a host name the
 * certificate does not name, and a certificate outside its validity; the agent gives up on
 * these at once instead of retrying them until its deadline.
 */
const CERTIFICATE_ERRORS = new Set([
  // Unknown CA: self-signed, or a chain to a root not in `tls.ca` / the system store.
  "DEPTH_ZERO_SELF_SIGNED_CERT",
  "SELF_SIGNED_CERT_IN_CHAIN",
  "UNABLE_TO_VERIFY_LEAF_SIGNATURE",
  "UNABLE_TO_GET_ISSUER_CERT",
  "UNABLE_TO_GET_ISSUER_CERT_LOCALLY",
  "CERT_UNTRUSTED",
  "CERT_REJECTED",
  "INVALID_CA",
  "CERT_SIGNATURE_FAILURE",
  // Host name mismatch.
  "ERR_TLS_CERT_ALTNAME_INVALID",
  // Validity.
  "CERT_HAS_EXPIRED",
  "CERT_NOT_YET_VALID",
  "CERT_REVOKED",
]);

/**
 * The certificate error behind `error` (itself or a cause, as a call's stream error wraps
 * its session's), or undefined when it is not one.
 *
 * @example
 * const tls = certificateError(streamError); // "DEPTH_ZERO_SELF_SIGNED_CERT"
 */
export function certificateError(error: unknown): { code: string; message: string } | undefined {
  let e = error as { code?: unknown; message?: unknown; cause?: unknown } | undefined;
  for (let depth = 0; e !== null && typeof e === "object" && depth < 4; depth++, e = e.cause as typeof e) {
    if (typeof e.code === "string" && CERTIFICATE_ERRORS.has(e.code)) {
      return { code: e.code, message: String(e.message ?? e.code).split("\n")[0]! };
    }
  }
  return undefined;
}

/** A server certificate the client will never trust as configured: said plainly, given up on at once. */
export function certificateRefused(tls: { code: string; message: string }): RunnerDepotError {
  return new RunnerDepotError(
    "UNAVAILABLE",
    `the runner's TLS certificate is not trusted (${tls.code}: ${tls.message}); retrying cannot fix this: ` +
      "trust its CA (tls.ca, the agent's --ca or the job config's ca) or use a host name the certificate names",
    { details: { grpcCode: Code.Unavailable, tlsError: tls.code } },
  );
}
