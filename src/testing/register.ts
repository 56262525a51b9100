/** Registration helpers: a case whose capability the adapter lacks is not registered at all. */
import { afterEach, it } from "vitest";

/** Stands in for `it` when a case does not apply to the adapter (nothing is registered). */
export const skipped = (() => {}) as unknown as typeof it;

/** `it` when `applies`, else {@link skipped}. */
export function only(applies: unknown): typeof it {
  return applies ? it : skipped;
}

/** Something a suite opens and must close after each case. */
interface Closable {
  close?(): Promise<void>;
}

/**
 * Opens adapters for a suite's cases and closes them (newest first) after each case:
 * `fresh()` from the factory, `again(store)` from the suite's `reopen` option.
 */
export function trackAdapters<P extends Closable, S extends P>(
  factory: () => S | Promise<S>,
  reopen: ((store: S) => P | Promise<P>) | undefined,
): { fresh(): Promise<S>; again(store: S): Promise<P> } {
  const open: P[] = [];
  afterEach(async () => {
    for (const store of open.splice(0).reverse()) await store.close?.();
  });
  return {
    async fresh() {
      const store = await factory();
      open.push(store);
      return store;
    },
    async again(store) {
      if (!reopen) throw new Error("this suite case needs the reopen option");
      const other = await reopen(store);
      open.push(other);
      return other;
    },
  };
}

/**
 * For outage cases: `broken(store)` remembers the store a case is about to break, and
 * after the case it is healed even when the case failed half-way.
 */
export function healAfterEach<S>(heal: (store: S) => void | Promise<void>): { broken(store: S): S } {
  let current: S | null = null;
  afterEach(async () => {
    if (current) await heal(current);
    current = null;
  });
  return {
    broken(store) {
      current = store;
      return store;
    },
  };
}
