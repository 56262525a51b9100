/** Option handling shared by the runner's factories. */

/**
 * `value` without its undefined properties, so spreading it over defaults keeps a default
 * where the caller passed `undefined` (as an optional property typed `?:` allows).
 */
export function stripUndefined<T extends object>(value: T): Partial<T> {
  return Object.fromEntries(Object.entries(value).filter(([, v]) => v !== undefined)) as Partial<T>;
}
