/** sharedFlush: concurrent callers share runs, and each caller's run starts after its call. */
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { sharedFlush } from "../../../src/adapters/postgres/shared-flush.js";

/** A flush whose runs are counted and ended by hand, in order. */
function manualFlush() {
  const runs: Array<{ started: number; end(error?: Error): void }> = [];
  let clock = 0;
  const flush = () =>
    new Promise<void>((resolve, reject) => {
      runs.push({ started: clock, end: (error) => (error ? reject(error) : resolve()) });
    });
  return { runs, flush, tick: () => ++clock, now: () => clock };
}

const settle = () => new Promise((resolve) => setImmediate(resolve));

describe("sharedFlush", () => {
  it("callers during a run join one run after it: 10 calls, 2 runs", async () => {
    const m = manualFlush();
    const sync = sharedFlush(m.flush);
    const first = sync();
    const rest = Array.from({ length: 9 }, () => sync());
    await settle();
    expect(m.runs).toHaveLength(1);
    m.runs[0]!.end();
    await first;
    await settle();
    expect(m.runs).toHaveLength(2);
    m.runs[1]!.end();
    await Promise.all(rest);
    expect(m.runs).toHaveLength(2);
  });

  it("a failed run fails its callers only; the queued run still starts and can succeed", async () => {
    const m = manualFlush();
    const sync = sharedFlush(m.flush);
    const first = sync();
    const second = sync();
    m.runs[0]!.end(new Error("flush failed"));
    await expect(first).rejects.toThrow("flush failed");
    await settle();
    m.runs[1]!.end();
    await expect(second).resolves.toBeUndefined();
    const third = sync();
    await settle();
    expect(m.runs).toHaveLength(3);
    m.runs[2]!.end();
    await expect(third).resolves.toBeUndefined();
  });

  it("every caller is answered by a run that started after its call (any interleaving)", async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(fc.boolean(), { minLength: 1, maxLength: 40 }), async (steps) => {
        const m = manualFlush();
        const sync = sharedFlush(m.flush);
        const calls: Array<{ at: number; done: boolean; answeredBy?: number }> = [];
        let ended = 0;
        const endNext = async () => {
          if (ended < m.runs.length) {
            const index = ended++;
            m.runs[index]!.end();
            await settle();
            for (const c of calls) if (c.done && c.answeredBy === undefined) c.answeredBy = m.runs[index]!.started;
          }
        };
        // true: a call; false: the oldest unfinished run ends.
        for (const call of steps) {
          if (call) {
            const c: { at: number; done: boolean; answeredBy?: number } = { at: m.tick(), done: false };
            calls.push(c);
            void sync().then(() => (c.done = true));
            m.tick();
            await settle();
          } else await endNext();
        }
        while (calls.some((c) => !c.done)) await endNext();
        // A run started during the call has the call's time; one started before it, an earlier time.
        for (const c of calls) expect(c.answeredBy!).toBeGreaterThanOrEqual(c.at);
        expect(m.runs.length).toBeLessThanOrEqual(calls.length);
      }),
    );
  });
});
