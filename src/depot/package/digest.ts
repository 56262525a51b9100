/**
 * Digest spellings: the store's `sha256:<hex>` and HTTP's RFC 9530 `sha-256=:<base64>:`.
 */
import { createHash } from "node:crypto";
import { RunnerDepotError } from "../../errors.js";

const STORE_DIGEST_RE = /^sha256:[0-9a-f]{64}$/;

/** The digest of zero bytes, in store form. */
export const EMPTY_DIGEST = `sha256:${createHash("sha256").digest("hex")}`;

/** True when `digest` is a store digest (`sha256:` and 64 lower-case hex digits). */
export function isStoreDigest(digest: string): boolean {
  return STORE_DIGEST_RE.test(digest);
}

/** `sha256:<hex>` → `sha-256=:<base64>:` (an RFC 9530 dictionary member). */
export function toHttpDigest(digest: string): string {
  return `sha-256=:${Buffer.from(digest.slice(7), "hex").toString("base64")}:`;
}

/**
 * Reads the `sha-256` member of a `Content-Digest`/`Repr-Digest` header value and returns
 * it as a store digest; undefined when the header has no sha-256 member, HEADER_INVALID
 * when that member is malformed or when two `sha-256` members differ (RFC 8941 would let
 * the last win silently; a sender that names two different digests is refused). Identical
 * repeats are accepted: they say the same thing.
 */
export function parseHttpDigest(header: string | null): string | undefined {
  if (header === null) return undefined;
  let found: string | undefined;
  for (const member of header.split(",")) {
    const eq = member.indexOf("=");
    if (eq === -1) continue;
    if (member.slice(0, eq).trim().toLowerCase() !== "sha-256") continue;
    const match = /^:([A-Za-z0-9+/]+={0,2}):$/.exec(member.slice(eq + 1).trim());
    const bytes = match ? Buffer.from(match[1]!, "base64") : undefined;
    if (!bytes || bytes.length !== 32) {
      throw new RunnerDepotError(
        "HEADER_INVALID",
        "Content-Digest: the sha-256 member must be sha-256=:<base64 of 32 bytes>:",
      );
    }
    const digest = `sha256:${bytes.toString("hex")}`;
    if (found !== undefined && found !== digest) {
      throw new RunnerDepotError("HEADER_INVALID", "Content-Digest names two different sha-256 digests");
    }
    found = digest;
  }
  return found;
}
