/**
 * A job the orchestrator no longer wants: the signal that ends a call with ok = false,
 * and how a call learns that its job ended (host cancel, lost sweep, another replica).
 */
import { RunnerDepotError } from "../../../errors.js";
import type { JobLogStore } from "../../ports.js";
import type { EndedReason } from "../contract.js";
import type { CallHandle, RunnerCore } from "../job-table.js";

/** Thrown inside a call to end it with ok=false. */
export class EndedSignal {
  constructor(readonly reason: EndedReason) {}
}

/** A store refusal because the job ended meanwhile (cancel, lost, another replica) is an ok=false, not an error. */
export async function explainRefusal(logs: JobLogStore, id: string, error: unknown): Promise<unknown> {
  if (!(error instanceof RunnerDepotError) || error.code !== "FAILED_PRECONDITION") return error;
  const state = await logs.get(id).catch(() => null);
  if (!state || state.status === "open") return error;
  return new EndedSignal(state.status === "finished" ? "ended" : state.status);
}

/** Why the call's job is over from the host's side (cancel, lost), or null. */
export function endedReasonOf(core: RunnerCore, call: CallHandle): EndedReason | null {
  const hostReason = core.ending.get(call.id);
  if (hostReason) return hostReason;
  const status = call.state?.status;
  if (status === "cancelled" || status === "lost") return status;
  return null;
}
