/**
 * Store operation latency (`depot.store.duration`): the router talks to its store through
 * this wrapper. Each promise-returning operation costs two clock reads and one histogram
 * record (a no-op without a meter provider); every other method, including one a store
 * adds beyond the port, is the store's own, bound to it. The wrapper is a plain object
 * built once (no Proxy trap on every property read).
 */
import type { Histogram } from "@opentelemetry/api";
import type { PackageStore } from "../ports.js";

/**
 * The timed operations: everything on the port that returns a promise.
 * Why: docs/decisions/depot-publish-durability.md, "metrics.ts: TIMED".
 */
const TIMED = new Set([
  "putBlob",
  "getBlob",
  "openBlob",
  "statBlob",
  "deleteBlob",
  "signBlobUrl",
  "getRecord",
  "putRecord",
  "deleteRecord",
  "listRecords",
  "syncRecords",
]);

/**
 * Wraps `store` so every timed operation records its latency with `operation` and
 * `outcome` (`ok` or `error`). getBlob is timed to the opened stream, not its last byte.
 * Methods are looked up once, when the wrapper is made. O(methods) once, O(1) per call.
 *
 * @example
 * const timed = timeStore(store, meter.createHistogram("depot.store.duration", { unit: "s" }));
 * await timed.getRecord("format"); // records { operation: "getRecord", outcome: "ok" }
 */
export function timeStore(store: PackageStore, histogram: Histogram): PackageStore {
  const wrapper: Record<string, unknown> = {};
  for (const name of methodNames(store)) {
    const method = (store as unknown as Record<string, unknown>)[name] as (...args: unknown[]) => unknown;
    wrapper[name] = TIMED.has(name) ? timed(store, method, name, histogram) : method.bind(store);
  }
  // The one data member of the port (ports.ts): what the router reads of it must pass through.
  if (store.unsignedMaxBytes !== undefined) wrapper.unsignedMaxBytes = store.unsignedMaxBytes;
  return wrapper as unknown as PackageStore;
}

/** Every method name of `store`: own properties and its prototype chain's, Object's excluded. */
function methodNames(store: object): Set<string> {
  const names = new Set<string>();
  for (
    let o: object | null = store;
    o !== null && o !== Object.prototype;
    o = Object.getPrototypeOf(o) as object | null
  ) {
    for (const name of Object.getOwnPropertyNames(o)) {
      if (name === "constructor" || names.has(name)) continue;
      const descriptor = Object.getOwnPropertyDescriptor(o, name);
      if (descriptor && typeof descriptor.value === "function") names.add(name);
    }
  }
  return names;
}

function timed(target: PackageStore, method: (...args: unknown[]) => unknown, operation: string, histogram: Histogram) {
  const ok = { operation, outcome: "ok" };
  const failed = { operation, outcome: "error" };
  return (...args: unknown[]) => {
    const started = performance.now();
    // Promise.resolve hands a native promise back as it is (no extra tick).
    return Promise.resolve(method.apply(target, args)).then(
      (value) => {
        histogram.record((performance.now() - started) / 1000, ok);
        return value;
      },
      (error: unknown) => {
        histogram.record((performance.now() - started) / 1000, failed);
        throw error;
      },
    );
  };
}
