/**
 * The lost-job sweep: every `sweepEveryMs`, jobs silent for `lostAfterMs` are declared
 * lost, and ended jobs past their retention are pruned. One sweep at a time.
 */
import type { RunnerCore } from "./job-table.js";
import { endFromHost } from "./host-ending.js";

/** Starts the sweep timer (unref'd); clear it on close. */
export function startLostSweep(core: RunnerCore): NodeJS.Timeout {
  let sweeping = false;
  const timer = setInterval(() => {
    if (sweeping || core.closed) return;
    sweeping = true;
    sweepOnce(core)
      .catch(core.report)
      .finally(() => {
        sweeping = false;
      });
  }, core.config.sweepEveryMs);
  timer.unref?.();
  return timer;
}

/** One sweep: O(stale jobs) store reads, each lost job ended in the background. */
async function sweepOnce(core: RunnerCore): Promise<void> {
  core.telemetry.lostSweeps.add(1);
  const { lostAfterMs, retentionMs } = core.config;
  const logs = core.logs;
  const before = new Date(Date.now() - lostAfterMs);
  for (const state of await logs.stale(before)) {
    if (core.closed) break;
    // A job whose end is being published is not silent: that publish decides.
    const id = state.requestId;
    if (core.ending.has(id) || core.inFlight.has(id) || core.slots.get(id)?.active) continue;
    void endFromHost(core, id, "lost", before);
  }
  if (retentionMs !== false && logs.prune) await logs.prune(new Date(Date.now() - retentionMs));
}
