/**
 * A package's attributes as a publish takes them (`Pkg-Attr`, docs/depot-api.md §8 and §11): the key's form and the
 * value's characters and size. Shared by the publish's header parser (depot/server/request-headers.ts) and the mirror's
 * check of an upstream's manifest (depot/mirror/upstream-manifest.ts).
 */
import { RunnerDepotError } from "../../errors.js";

/**
 * True when `key` is an attribute key a publish takes (`Pkg-Attr`, docs/depot-api.md §8): a letter or digit, then
 * up to 63 letters, digits, `.`, `_` or `-`.
 *
 * @example
 * isAttributeKey("build.id"); // true
 */
export function isAttributeKey(key: string): boolean {
  return /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/.test(key);
}

/**
 * Refuses (HEADER_INVALID) an attribute value (decoded) a publish does not take: a control character other than
 * tab, CR and LF, or more than 4096 UTF-8 bytes (docs/depot-api.md §8 and §11).
 *
 * @example
 * checkAttributeValue("description", "a tool\n"); // passes
 */
export function checkAttributeValue(key: string, value: string): void {
  // Free text may hold tabs and line breaks; no other control character (C0, DEL, C1).
  if (/[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f]/.test(value)) {
    throw new RunnerDepotError(
      "HEADER_INVALID",
      `Pkg-Attr ${key} holds a control character (only tab, CR and LF are allowed)`,
    );
  }
  if (Buffer.byteLength(value) > 4096)
    throw new RunnerDepotError("HEADER_INVALID", `Pkg-Attr ${key} is longer than 4096 bytes`);
}
