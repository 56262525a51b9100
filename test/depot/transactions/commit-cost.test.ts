/**
 * The cost of a commit per item is flat (issue 9, depot 7): committing 4× the items costs
 * at most 4.5× the store operations, and the listings do not multiply. Counted, not timed,
 * so load cannot make it flaky: a counting wrapper over the real fs store, behind a
 * listening server, counts every store call from the commit request until the work the
 * commit goes on with after answering is done.
 *
 * Why listings are asserted on their own: the fs store walks every key under a prefix for
 * each page it answers (a directory cannot be read from a cursor on), so a listing of a
 * transaction's items in 1,000-key pages cost items/1,000 walks of all the items —
 * quadratic, though the number of calls looked linear. The commit now lists in one page.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createFsStore } from "../../../src/adapters/fs/store.js";
import type { PackageStore } from "../../../src/depot/ports.js";
import { add, openTransaction, startDepot, tempDir, type LiveDepot } from "../../fixtures/depot.js";

const N = 300;

/** A store whose calls are counted per method while `on` is set. */
function countingStore(store: PackageStore): {
  store: PackageStore;
  counts: Map<string, number>;
  setOn(on: boolean): void;
} {
  const counts = new Map<string, number>();
  let on = false;
  const wrapped = new Proxy(store, {
    get(target, name, receiver) {
      const value = Reflect.get(target, name, receiver) as unknown;
      if (typeof value !== "function") return value;
      return (...args: unknown[]) => {
        if (on) counts.set(String(name), (counts.get(String(name)) ?? 0) + 1);
        return (value as (...a: unknown[]) => unknown).apply(target, args);
      };
    },
  });
  return { store: wrapped, counts, setOn: (value) => void (on = value) };
}

describe("commit cost per item", () => {
  let depot: LiveDepot;
  let counting: ReturnType<typeof countingStore>;
  let cleanup: () => Promise<void>;

  beforeAll(async () => {
    const temp = await tempDir("depot-commit-cost-");
    cleanup = temp.cleanup;
    // No fsync: it changes no count, only the time the additions take.
    counting = countingStore(createFsStore(temp.dir, { unsafeNoSync: true }));
    depot = await startDepot(counting.store);
  });
  afterAll(async () => {
    await depot?.close();
    await cleanup?.();
  });

  /** Adds `items` files to a fresh transaction, then counts the store calls of its commit. */
  async function commitCounts(name: string, items: number): Promise<Map<string, number>> {
    const id = await openTransaction(depot.url, `${name}@1.0.0`);
    let next = 0;
    const worker = async () => {
      while (next < items) {
        const i = next++;
        const r = await add(depot.url, id, { type: "file", path: `d${i % 10}/f${i}.txt`, body: `${name} ${i}\n` });
        expect(r.status).toBe(201);
        await r.arrayBuffer();
      }
    };
    await Promise.all(Array.from({ length: 8 }, worker));
    counting.counts.clear();
    counting.setOn(true);
    const committed = await fetch(`${depot.url}/commit/${id}`, { method: "POST" });
    expect(committed.status).toBe(201);
    await committed.arrayBuffer();
    await depot.router.idle();
    counting.setOn(false);
    return new Map(counting.counts);
  }

  it("4× the items cost at most 4.5× the store calls, and no more listings", async () => {
    const small = await commitCounts("small", N);
    const large = await commitCounts("large", 4 * N);
    const total = (counts: Map<string, number>) => [...counts.values()].reduce((a, b) => a + b, 0);
    // Every item is read, its blob stated and read once: the commit did touch each item.
    expect(small.get("getRecord") ?? 0).toBeGreaterThanOrEqual(N);
    expect(large.get("getRecord") ?? 0).toBeGreaterThanOrEqual(4 * N);
    expect(total(large) / total(small)).toBeLessThanOrEqual(4.5);
    // And per kind of call (a quadratic kind could hide behind a large linear one).
    const steep = [...large].filter(([method, count]) => count / (small.get(method) ?? 1) > 4.5);
    expect(steep).toEqual([]);
    // Each listing walks all the transaction's items on the fs store: their number must not grow.
    expect(small.get("listRecords") ?? 0).toBeGreaterThan(0);
    expect(large.get("listRecords")).toBe(small.get("listRecords"));
  }, 120_000);
});
