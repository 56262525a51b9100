/**
 * bench/aim-bound.ts: the parser of a shell's `times` (the child's CPU in the limit's runs) and the aim's CPU
 * bound that bench/runner-line-time.ts prints from it.
 */
import { spawn } from "node:child_process";
import { once } from "node:events";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { aimBudget, childSecondsOf } from "../../bench/aim-bound.js";

/** A `times` field as dash (`0m0.010000s`) or bash (`0m0.010s`) prints it, for a whole number of ms. */
const field = (ms: number, digits: 3 | 6) => `${Math.floor(ms / 60_000)}m${((ms % 60_000) / 1000).toFixed(digits)}s`;

describe("childSecondsOf", () => {
  it("reads the children's user + system from a real shell's times", async () => {
    // The inner shell is the outer one's child: its busy loop is what the second line counts.
    const child = spawn("sh", ["-c", "sh -c 'i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done'; times"], {
      stdio: ["ignore", "pipe", "inherit"],
    });
    let out = "";
    child.stdout.setEncoding("utf8").on("data", (s: string) => (out += s));
    const t0 = performance.now();
    await once(child, "close");
    const wall = (performance.now() - t0) / 1000;
    const seconds = childSecondsOf(out);
    expect(seconds).toBeGreaterThan(0.02);
    // One core's time at most, plus a tick either side of the kernel's accounting.
    expect(seconds).toBeLessThanOrEqual(wall + 0.02);
  });

  it("sums the second line's two fields, as dash and bash print them", () => {
    fc.assert(
      fc.property(
        fc.nat(10_000_000),
        fc.nat(10_000_000),
        fc.nat(100_000),
        fc.constantFrom(3 as const, 6 as const),
        (user, system, own, digits) => {
          const text = `${field(own, digits)} ${field(own, digits)}\n${field(user, digits)} ${field(system, digits)}\n`;
          expect(childSecondsOf(text)).toBeCloseTo((user + system) / 1000, 6);
        },
      ),
    );
  });

  it("takes the last line, after anything written before the two, and a decimal comma", () => {
    const warning = "bash: warning: setlocale: LC_ALL: cannot change locale (de_DE.UTF-8)\n";
    expect(childSecondsOf(`${warning}0m0.001s 0m0.002s\n0m0.010s 0m0.030s\n`)).toBeCloseTo(0.04, 9);
    expect(childSecondsOf("0m0,001s 0m0,002s\n1m0,250s 0m0,030s\n")).toBeCloseTo(60.28, 9);
  });

  it("refuses text that does not end with times' two lines of two fields", () => {
    for (const text of [
      "",
      "0m0.01s 0m0.02s\n",
      "0m0s 0m0s\n0m0.01s\n",
      "a b\n0m0.01s 0m0.02s 0m0.03s\n",
      "x\n1s 2s\n",
      "0m0.01s 0m0.02s\n0m0.01s 0m0.02s\ndone\n",
      "0m0.01s x\n0m0.01s 0m0.02s\n",
    ]) {
      expect(() => childSecondsOf(text), JSON.stringify(text)).toThrow(/no children's times/);
    }
  });
});

describe("aimBudget", () => {
  it("is the cores' time at half the limit less the child's", () => {
    expect(aimBudget(5e6, 0.1, 2)).toBeCloseTo(0.7, 12);
    expect(aimBudget(2e6, 0.3, 2)).toBeCloseTo(1.7, 12);
    expect(aimBudget(5e6, 0.1, 4)).toBeCloseTo(1.5, 12);
  });

  it("shrinks as the limit rises and as the child costs more", () => {
    fc.assert(
      fc.property(
        fc.double({ min: 1e5, max: 1e8, noNaN: true }),
        fc.double({ min: 0, max: 1, noNaN: true }),
        (l, c) => {
          expect(aimBudget(l * 1.5, c, 2)).toBeLessThan(aimBudget(l, c, 2));
          expect(aimBudget(l, c + 0.1, 2)).toBeLessThan(aimBudget(l, c, 2));
        },
      ),
    );
  });
});
