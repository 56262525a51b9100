/**
 * BatchList against a plain array as the model: any sequence of pushes, takes and clears hands on the same batches,
 * in order, each a plain array of exactly its items (no holes, its own length), and never a batch handed on before.
 */
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { BatchList } from "../../../src/runner/protocol/batch-list.js";
import { fuzzParams } from "../../fuzz/settings.js";

type Op = { push: number } | { take: true } | { clear: true };

describe("BatchList", () => {
  it("hands on what a plain array would, for any sequence of pushes, takes and clears", () => {
    const op: fc.Arbitrary<Op> = fc.oneof(
      { weight: 8, arbitrary: fc.integer().map((push) => ({ push })) },
      { weight: 2, arbitrary: fc.constant({ take: true as const }) },
      { weight: 1, arbitrary: fc.constant({ clear: true as const }) },
    );
    for (const params of fuzzParams<[Op[]]>("batch list"))
      fc.assert(
        fc.property(fc.array(op, { maxLength: 400 }), (ops) => {
          const list = new BatchList<number>();
          let model: number[] = [];
          const taken: number[][] = [];
          for (const o of ops) {
            if ("push" in o) {
              list.push(o.push);
              model.push(o.push);
            } else if ("take" in o) {
              const batch = list.take();
              expect(batch).toEqual(model);
              expect(batch.length).toBe(model.length);
              // No hole anywhere: every index within its length holds an item.
              for (let i = 0; i < batch.length; i++) expect(i in batch).toBe(true);
              for (const earlier of taken) expect(batch).not.toBe(earlier);
              taken.push(batch);
              model = [];
            } else {
              list.clear();
              model = [];
            }
            expect(list.length).toBe(model.length);
          }
          // A batch handed on is the caller's: later pushes never show in it.
          const before = taken.map((b) => [...b]);
          list.push(1);
          list.push(2);
          list.take();
          expect(taken).toEqual(before);
        }),
        params,
      );
  });

  it("an idle list holds no array of its last batch's size until it is pushed to again", () => {
    const list = new BatchList<number>();
    const held = () => (list as unknown as { items: unknown[] }).items.length;
    for (let i = 0; i < 5_000; i++) list.push(i);
    expect(list.take()).toHaveLength(5_000);
    // A call that streamed fast and then went idle: 1,000 such calls would otherwise hold ~40 MB.
    expect(held()).toBe(0);
    list.push(7);
    expect(held()).toBe(5_000);
    expect(list.take()).toEqual([7]);
  });

  it("a batch larger than the last one grows past the array made ahead, in order", () => {
    const list = new BatchList<number>();
    for (let i = 0; i < 3; i++) list.push(i);
    expect(list.take()).toEqual([0, 1, 2]);
    for (let i = 0; i < 10; i++) list.push(i);
    expect(list.take()).toEqual([0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
    expect(list.take()).toEqual([]);
  });
});
