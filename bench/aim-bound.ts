/**
 * The CPU bound behind issue 23's last aim (end-to-end ingest at ≥ 0.5× the physical limit), as
 * bench/runner-line-time.ts prints it each run: what the agent and the server may spend together, a line, when the
 * child, the agent and the server share the machine's cores. Why a bound and what it showed:
 * docs/decisions/ingest-limit.md, "The aim's CPU bound".
 */

/**
 * Seconds of user + system time of a shell's children, from the output of its `times` builtin (POSIX: a line of the
 * shell's own user and system times, then one of its children's, each as `NmS.SSSs`; bash writes the decimal point
 * as its locale does, a comma in some). The children's line is the last one, so text written before it (a warning)
 * cannot shift it. The kernel counts these times in ticks (10 ms on Linux), so a caller sums them over several runs.
 * Throws when the text does not end with two such lines.
 *
 * @example
 * childSecondsOf("0m0.001s 0m0.002s\n0m0.010000s 0m0.030000s\n"); // 0.04
 */
export function childSecondsOf(times: string): number {
  const lines = times.trim().split("\n");
  const [own, children] = lines.slice(-2).map((line) => line.trim().split(/\s+/).map(secondsOf));
  if (lines.length < 2 || own!.length !== 2 || children!.length !== 2 || [...own!, ...children!].some(Number.isNaN)) {
    throw new Error(`no children's times in ${JSON.stringify(times.slice(-200))}`);
  }
  return children![0]! + children![1]!;
}

/** `NmS.SSSs` (or with a decimal comma) in seconds; NaN for anything else. */
function secondsOf(field: string): number {
  const m = /^(\d+)m(\d+(?:[.,]\d+)?)s$/.exec(field);
  return m === null ? Number.NaN : Number(m[1]) * 60 + Number(m[2]!.replace(",", "."));
}

/**
 * The CPU agent and server may spend together, µs a line, for a rate of half `limit` (lines/s) on `cores` cores
 * shared with a child that spends `child` µs a line: cores ÷ (limit ÷ 2) − child. It takes every core as busy the
 * whole job: a pipeline whose CPU a line stays above it cannot reach half the limit however its processes are
 * scheduled; one below it may still not. O(1).
 *
 * @example
 * aimBudget(5e6, 0.1, 2); // 0.7: at 2.5 M lines/s two cores give 0.8 µs a line, the child takes 0.1
 */
export function aimBudget(limit: number, child: number, cores: number): number {
  return (cores * 1e6) / (limit / 2) - child;
}
