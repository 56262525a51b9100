/** Request-ID helpers: the contract's UUID form (any 8-4-4-4-12 hex string, any case). */

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/** True when `value` is a UUID in text form as the contract accepts it (nil and max included). */
export function isRequestId(value: string): boolean {
  return UUID.test(value);
}

/** The stored (lower-case) form of a request ID, or null when it is not a UUID. */
export function normalizeRequestId(value: string): string | null {
  return UUID.test(value) ? value.toLowerCase() : null;
}
