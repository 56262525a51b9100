/**
 * Ending a job from the orchestrator's side: a host's cancel or the sweep's lost verdict.
 * The job is marked at once (calls in flight stop storing), its result published until
 * the queue accepts, then recorded.
 */
import type { JobResult, JobState } from "../ports.js";
import type { RunnerCore } from "./job-table.js";
import { hostResult } from "./job-results.js";
import { publishPersistent, recordAccepted } from "./result-publish.js";

/**
 * Ends a job from the orchestrator's side (cancel or lost): publish, then record.
 * Resolves with the result, or null when the job had already ended (or, with
 * `mustBeStale`, spoke after that time).
 */
export function endFromHost(
  core: RunnerCore,
  id: string,
  outcome: "cancelled" | "lost",
  mustBeStale?: Date,
): Promise<JobResult | null> {
  let marked = false;
  const work = (async () => {
    try {
      return await core.locked(id, async () => {
        const state = await core.logs.get(id);
        if (state && state.status !== "open") return null;
        // A job that spoke since the sweep looked is not lost after all.
        if (mustBeStale && state && Date.parse(state.lastSeenAt) >= mustBeStale.getTime()) return null;
        if (mustBeStale && core.slots.get(id)?.active) return null;
        // The runner's end may still be on its way to the queue (the call that sent it
        // stopped waiting): that publish decides first, so the job yields one result.
        const pendingEnd = core.inFlight.get(id);
        let current = state;
        if (pendingEnd) {
          if (await pendingEnd.settled) {
            await recordAccepted(core, id, pendingEnd);
            return null;
          }
          current = await core.logs.get(id);
        }
        // A failed publish of the end may still reach the queue: the job's one result is that end's.
        const uncertain = core.maybePublished.get(id);
        if (uncertain) {
          // Recorded at the items stored now (an agent may have sent lines after its failed end).
          const at = uncertain.at === undefined ? undefined : (current?.committed ?? uncertain.at);
          const attempt = await publishPersistent(core, id, uncertain.result, at);
          await recordAccepted(core, id, attempt);
          return null;
        }
        core.ending.set(id, outcome);
        marked = true;
        const result = hostResult(current, id, outcome, new Date());
        const attempt = await publishPersistent(core, id, result);
        const finished = await recordAccepted(core, id, attempt);
        if (finished.first) logHostEnd(core, current, result);
        return finished.first ? result : null;
      });
    } finally {
      if (marked || outcome === "cancelled") core.ending.delete(id);
    }
  })();
  core.track(id, work);
  return work;
}

/** A cancel is the host's own decision (info); a lost job is worth a look (warn). */
function logHostEnd(core: RunnerCore, state: JobState | null, result: JobResult): void {
  const { logger } = core.telemetry;
  const lines = result.lines.stdout + result.lines.stderr;
  if (result.outcome === "cancelled") logger.info({ requestId: result.requestId, lines }, "job cancelled");
  else logger.warn({ requestId: result.requestId, lines, lastSeenAt: state?.lastSeenAt ?? null }, "job lost");
}
