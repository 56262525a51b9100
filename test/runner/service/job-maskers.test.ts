/**
 * The service's maskers and the server-wide bound on what `::add-mask::` lines register
 * (runner/service/job-maskers.ts): whatever jobs register, declare and end, in any order, the
 * forms held for `::add-mask::` values stay within the bound and are given back with their job.
 */
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { JobMaskers } from "../../../src/runner/service/job-maskers.js";

const JOBS = ["a", "b", "c"];
type Op =
  | { kind: "register"; job: string; value: string }
  | { kind: "declare"; job: string; value: string }
  | { kind: "delete"; job: string };

const op: fc.Arbitrary<Op> = fc.oneof(
  fc.record({
    kind: fc.constant("register" as const),
    job: fc.constantFrom(...JOBS),
    // Plain tokens (few forms) and values whose every encoding differs (many).
    value: fc.oneof(fc.stringMatching(/^[a-z0-9]{4,40}$/), fc.string({ minLength: 4, maxLength: 300, unit: "binary" })),
  }),
  fc.record({
    kind: fc.constant("declare" as const),
    job: fc.constantFrom(...JOBS),
    value: fc.stringMatching(/^[a-z]{4,20}$/),
  }),
  fc.record({ kind: fc.constant("delete" as const), job: fc.constantFrom(...JOBS) }),
);

describe("JobMaskers", () => {
  it("keeps registered forms within the server-wide bound and gives a job's back when it is deleted", () => {
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 20_000 }), fc.array(op, { maxLength: 40 }), (max, ops) => {
        const maskers = new JobMaskers(max);
        // The same operations without the server-wide bound: while its jobs hold no more than the bound, the bounded
        // one must register exactly what it does (a value that fits is never refused).
        const unbounded = new JobMaskers(Infinity);
        let agree = true;
        // The forms each job registered from commands, as the model counts them.
        const model = new Map<string, number>();
        // The jobs that have a masker.
        const live = new Set<string>();
        for (const o of ops) {
          if (o.kind === "delete") {
            maskers.delete(o.job);
            unbounded.delete(o.job);
            model.delete(o.job);
            live.delete(o.job);
            // Gone with its masker: nothing of the job is held any more.
            expect(maskers.get(o.job)).toBeUndefined();
          } else if (o.kind === "declare") {
            live.add(o.job);
            maskers.declare(o.job, [o.value]);
            unbounded.declare(o.job, [o.value]);
          } else {
            live.add(o.job);
            unbounded.maskCommandText(o.job, `::add-mask::${o.value}`);
            const before = maskers.get(o.job)?.masker.formBytes ?? 0;
            // The command line is never kept in clear, registered or not, as text or as bytes (in a wider buffer).
            if (o.value.length % 2 === 0) {
              expect(maskers.maskCommandText(o.job, `::add-mask::${o.value}`).masked).toBe("::add-mask::***");
            } else {
              const buf = Buffer.from(`ab::add-mask::${o.value}cd`);
              const { masked } = maskers.maskCommandBytes(o.job, buf, 2, buf.length - 2);
              expect(masked?.toString()).toBe("::add-mask::***");
            }
            const added = maskers.get(o.job)!.masker.formBytes - before;
            model.set(o.job, (model.get(o.job) ?? 0) + added);
          }
          expect(maskers.size).toBe(live.size);
          const sum = [...model.values()].reduce((n, b) => n + b, 0);
          expect(maskers.registeredBytes).toBe(sum);
          expect(maskers.registeredBytes).toBeLessThanOrEqual(max);
          agree &&= unbounded.registeredBytes <= max;
          if (agree) expect(maskers.registeredBytes).toBe(unbounded.registeredBytes);
        }
      }),
      { numRuns: 300 },
    );
  });

  it("registers a value past the bound once another job's share is given back", () => {
    const value = "run-time-token-0123456789";
    const maskers = new JobMaskers(0);
    expect(maskers.maskCommandText("b", `::add-mask::${value}`).refusedUnderBudget).toBe(true);
    expect(maskers.get("b")!.masker.mask(value)).toBe(value);
    // Told once a job: the job's next refusal is not reported again, another job's first is.
    expect(maskers.maskCommandText("b", `::add-mask::${value}-2`).refusedUnderBudget).toBe(false);
    expect(maskers.maskCommandText("c", `::add-mask::${value}`).refusedUnderBudget).toBe(true);
    // A job deleted and seen again is a new job: told anew.
    maskers.delete("b");
    expect(maskers.maskCommandText("b", `::add-mask::${value}`).refusedUnderBudget).toBe(true);
    const roomy = new JobMaskers(1024 * 1024);
    roomy.maskCommandText("a", `::add-mask::${value}`);
    const held = roomy.registeredBytes;
    expect(held).toBeGreaterThan(0);
    roomy.delete("a");
    expect(roomy.registeredBytes).toBe(0);
    expect(roomy.maskCommandText("b", `::add-mask::${value}`).refusedUnderBudget).toBe(false);
    expect(roomy.get("b")!.masker.mask(`x ${value} y`)).toBe("x *** y");
  });
});
