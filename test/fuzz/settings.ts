/**
 * Settings every property-based (fast-check) target shares. `npm test` runs each target
 * with FUZZ_RUNS (default 2,000) cases under a fixed seed, plus one case set under a random
 * seed that it prints; `npm run fuzz` sets FUZZ_RUNS=100000. A failure prints its seed and
 * path; rerun it with FUZZ_SEED=<seed> (fast-check shrinks it to a minimal case).
 *
 * @example
 * for (const params of fuzzParams("frame splitter")) fc.assert(fc.property(arb, check), params);
 */
import type { Parameters } from "fast-check";

/** The fixed seed of the CI run, so that a red CI run reproduces exactly. */
export const FIXED_SEED = 0x5eed;

/** Cases per target: FUZZ_RUNS, else 2,000. */
export function fuzzRuns(): number {
  const raw = Number(process.env.FUZZ_RUNS);
  return Number.isInteger(raw) && raw > 0 ? raw : 2_000;
}

/**
 * A target's test timeout: `ciMs` is what its CI size (2,000 cases) may take, scaled with
 * FUZZ_RUNS, so `npm run fuzz` (100,000) is not cut by a timeout sized for CI.
 */
export function fuzzTimeout(ciMs: number): number {
  return Math.round(ciMs * Math.max(1, fuzzRuns() / 2_000));
}

/**
 * The fast-check parameter sets to run a target with: the fixed seed, then (unless
 * FUZZ_SEED pins one) a random seed, printed so a failure can be replayed.
 */
export function fuzzParams<T>(target: string, extra: Parameters<T> = {}): Parameters<T>[] {
  const runs = fuzzRuns();
  const pinned = process.env.FUZZ_SEED;
  if (pinned !== undefined && pinned !== "") return [{ ...extra, numRuns: runs, seed: Number(pinned) }];
  const random = (Math.random() * 2 ** 31) | 0;
  console.log(
    `fuzz ${target}: ${runs} runs with seed ${FIXED_SEED}, then seed ${random} (FUZZ_SEED=${random} replays it)`,
  );
  return [
    { ...extra, numRuns: runs, seed: FIXED_SEED },
    { ...extra, numRuns: Math.max(1, Math.round(runs / 10)), seed: random },
  ];
}
