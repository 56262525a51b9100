/** Registration helpers: a case whose capability the adapter lacks is not registered at all. */
import { it } from "vitest";

/** Stands in for `it` when a case does not apply to the adapter (nothing is registered). */
export const skipped = ((() => {}) as unknown) as typeof it;

/** `it` when `applies`, else {@link skipped}. */
export function only(applies: unknown): typeof it {
  return applies ? it : skipped;
}
