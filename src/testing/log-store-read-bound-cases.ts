/** The JobLogStore conformance cases of `read`'s byte bound (`LogReadOptions.maxBytes`). */
import { randomUUID } from "node:crypto";
import { expect, it } from "vitest";
import type { JobLogStore, LogEntry, StoredLine } from "../runner/ports.js";
import { positionAfter } from "../runner/service/log-tail.js";
import { logEntry } from "./helpers.js";
import { lines, type LogStoreCases } from "./log-store-cases.js";

/** Every line of `id` read a page at a time with `maxBytes`, each page checked against the bound. */
async function pagedWithin(store: JobLogStore, id: string, limit: number, maxBytes: number): Promise<StoredLine[]> {
  const out: StoredLine[] = [];
  let position = 0;
  for (let reads = 0; reads < 10_000; reads++) {
    const page = await store.read(id, position, limit, { maxBytes });
    if (page.length === 0) return out;
    expectWithin(page, maxBytes);
    out.push(...page);
    position = positionAfter(position, page);
  }
  throw new Error("paging did not end");
}

/** A page holds at most `maxBytes` of text, unless it is one line alone (the first always comes). */
function expectWithin(page: readonly StoredLine[], maxBytes: number): void {
  expect(page.length).toBeGreaterThan(0);
  if (page.length > 1) expect(page.reduce((n, l) => n + l.line.length, 0)).toBeLessThanOrEqual(maxBytes);
}

/** Registers the cases inside describeJobLogStore's describe. */
export function describeReadBoundCases<S extends JobLogStore>({ fresh }: LogStoreCases<S>): void {
  it("read with maxBytes ends the page at the bound, always returns the first line, and pages through every line", async () => {
    const store = await fresh();
    const id = randomUUID();
    // Every seventh line is 20,000 bytes: a page of 60 lines holds 180 KB of them.
    const texts = Array.from({ length: 60 }, (_, i) => (i % 7 === 3 ? `${i}`.padEnd(20_000, "L") : `line ${i}`));
    await store.append(id, 0, lines(texts.slice(0, 25)));
    await store.append(id, 25, lines(texts.slice(25)));
    const whole = await store.read(id);
    expect(whole.map((l) => l.line)).toEqual(texts);
    // One line larger than the bound still comes, alone.
    expect((await store.read(id, 3, 10, { maxBytes: 100 })).map((l) => l.line)).toEqual([texts[3]]);
    expect((await store.read(id, 3, 10, { maxBytes: 1 })).map((l) => l.line)).toEqual([texts[3]]);
    // A page is a prefix of the unbounded one: cut before the line that would pass the bound.
    const page = await store.read(id, 0, 60, { maxBytes: 50_000 });
    expect(page).toEqual(whole.slice(0, page.length));
    expectWithin(page, 50_000);
    expect(page.length).toBeGreaterThanOrEqual(11); // lines 3 and 10 fit, with the small ones around them
    expect(page.length).toBeLessThan(18); // line 17 would be the third 20,000-byte one
    // Every store reads the option alike: below 1 is 1 (the first line alone), a fraction rounds down, a bound that is
    // not a finite number is none.
    for (const maxBytes of [0, -5, 0.5])
      expect((await store.read(id, 3, 10, { maxBytes })).map((l) => l.line)).toEqual([texts[3]]);
    expect(await store.read(id, 0, 60, { maxBytes: 50_000.9 })).toEqual(
      await store.read(id, 0, 60, { maxBytes: 50_000 }),
    );
    for (const maxBytes of [Number.POSITIVE_INFINITY, Number.NaN])
      expect(await store.read(id, 0, 60, { maxBytes })).toEqual(whole);
    // A bound larger than the lines changes nothing.
    expect(await store.read(id, 5, 30, { maxBytes: 1 << 30 })).toEqual(whole.slice(5, 35));
    // Paging by the bound reads every line once, in order.
    expect(await pagedWithin(store, id, 1000, 30_000)).toEqual(whole);
    expect(await pagedWithin(store, id, 4, 1)).toEqual(whole);
  });

  it("a cut log read with maxBytes pages through head, marker and tail without a gap", async () => {
    const store = await fresh();
    const id = randomUUID();
    const text = (i: number) => `${i}`.padEnd(i % 3 === 0 ? 3000 : 10, "x");
    await store.append(id, 0, lines(Array.from({ length: 6 }, (_, i) => text(i))));
    // Item 6 starts the tail (12,000 bytes in 8 segments); 60 more items drop most of it.
    const tail: LogEntry[] = Array.from({ length: 60 }, (_, k) => logEntry(text(6 + k)));
    tail[0] = { ...tail[0]!, tailBytes: 12_000, capped: true };
    for (let at = 6; at < 66; at += 10) await store.append(id, at, tail.slice(at - 6, at + 4));
    const whole = await store.read(id);
    expect(whole.filter((l) => l.marker)).toHaveLength(1);
    for (const maxBytes of [1, 2_000, 5_000]) expect(await pagedWithin(store, id, 1000, maxBytes)).toEqual(whole);
    // From inside the dropped range: the marker first, then the tail, within the bound.
    const marker = whole.findIndex((l) => l.marker);
    const inside = await store.read(id, marker + 1, 100, { maxBytes: 4_000 });
    expect(inside[0]).toMatchObject({ marker: true });
    expectWithin(inside, 4_000);
  });
}
