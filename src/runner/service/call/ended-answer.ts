/** The ok = false answer of a call whose job the orchestrator no longer wants (§6). */
import { create } from "@bufbuild/protobuf";
import { AckSchema, type Ack } from "../../../gen/runner/v1/runner_pb.js";
import type { CallRun } from "./run.js";
import type { RunnerCore } from "../job-table.js";
import { COMMITTED_HEADER, REASON_HEADER, type EndedReason } from "../contract.js";

/** Drops what the call still had queued and answers ok = false with `runner-committed` and `runner-reason`. */
export async function endedAck(core: RunnerCore, call: CallRun, reason: EndedReason): Promise<Ack> {
  call.endedReason = reason;
  // The job is over: a late line of it may have made its masker anew (its result already dropped the first).
  core.maskers.delete(call.id);
  // Queued entries of a job the orchestrator dropped are not stored.
  call.pending.clear();
  call.pendingReceivedBytes = 0;
  try {
    await call.flush();
  } catch {
    // The flush was refused because the job ended; the state below says where it stands.
  }
  // Read without the job's lock: a cancel may hold it while it publishes.
  call.state = (await core.logs.get(call.id).catch(() => null)) ?? call.state;
  call.ctx.responseTrailer.set(COMMITTED_HEADER, String(call.committed));
  call.ctx.responseTrailer.set(REASON_HEADER, reason);
  return create(AckSchema, { ok: false });
}
