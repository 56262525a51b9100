/**
 * The CPU bound behind issue 23's last aim (end-to-end ingest at ≥ 0.5× the physical limit), as
 * bench/runner-line-time.ts prints it each run: what the agent and the server may spend together, a line, when the
 * child, the agent and the server share the machine's cores. Why a bound and what it showed:
 * docs/decisions/ingest-limit.md, "The aim's CPU bound".
 */

/**
 * Seconds of user + system time of a shell's children, from the second line of its `times` builtin (POSIX: the
 * shell's own user and system times, then its children's, each as `NmS.SSSs`). The kernel counts them in ticks (10
 * ms on Linux), so a caller sums them over several runs. Throws when the text holds no such line.
 *
 * @example
 * childSecondsOf("0m0.001s 0m0.002s\n0m0.010000s 0m0.030000s\n"); // 0.04
 */
export function childSecondsOf(times: string): number {
  const fields = (times.trim().split("\n")[1] ?? "").trim().split(/\s+/);
  const parts = fields.map((f) => /^(\d+)m(\d+(?:\.\d+)?)s$/.exec(f));
  if (parts.length !== 2 || parts.some((m) => m === null)) {
    throw new Error(`no children's times in ${JSON.stringify(times.slice(0, 200))}`);
  }
  return parts.reduce((sum, m) => sum + Number(m![1]) * 60 + Number(m![2]), 0);
}

/**
 * The CPU agent and server may spend together, µs a line, for a rate of half `limit` (lines/s) on `cores` cores
 * shared with a child that spends `child` µs a line: cores ÷ (limit ÷ 2) − child. A bound, not an estimate: it
 * takes every core as busy for the whole job, so a pipeline that spends more cannot reach half the limit however its
 * processes are scheduled; one that spends less may still not. O(1).
 *
 * @example
 * aimBudget(5e6, 0.1, 2); // 0.7: at 2.5 M lines/s two cores give 0.8 µs a line, the child takes 0.1
 */
export function aimBudget(limit: number, child: number, cores: number): number {
  return (cores * 1e6) / (limit / 2) - child;
}
