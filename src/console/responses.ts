/** Small response helpers the console's handlers share: JSON, problems and security headers. */
import { RunnerDepotError } from "../errors.js";

/**
 * Headers on every console response: no framing (clickjacking), no sniffing, no referrer
 * (job URLs can name private repositories), and a CSP that allows only the console's own
 * script and style (nothing inline, nothing from elsewhere).
 */
export const SECURITY_HEADERS: Readonly<Record<string, string>> = Object.freeze({
  "content-security-policy":
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
  "x-content-type-options": "nosniff",
  "referrer-policy": "no-referrer",
  "x-frame-options": "DENY",
});

/** A JSON answer. */
export function json(body: unknown, status = 200, headers: Record<string, string> = {}): Response {
  return new Response(JSON.stringify(body), {
    status,
    headers: {
      ...SECURITY_HEADERS,
      "content-type": "application/json; charset=utf-8",
      "cache-control": "no-store",
      ...headers,
    },
  });
}

/** An RFC 9457 problem answer for any error (unexpected ones become INTERNAL, their text hidden). */
export function problem(error: unknown): Response {
  const doc = RunnerDepotError.from(error).toProblem();
  return json(doc, doc.status, { "content-type": "application/problem+json" });
}

/** An integer query parameter within [min, max], or `fallback` when absent; INVALID_ARGUMENT otherwise. */
export function intParam(url: URL, name: string, fallback: number, min: number, max: number): number {
  const raw = url.searchParams.get(name);
  if (raw === null || raw === "") return fallback;
  if (!/^\d{1,15}$/.test(raw)) throw new RunnerDepotError("INVALID_ARGUMENT", `${name} must be a whole number`);
  const value = Number(raw);
  if (value < min || value > max)
    throw new RunnerDepotError("INVALID_ARGUMENT", `${name} must be from ${min} to ${max}`);
  return value;
}
