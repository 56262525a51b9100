/**
 * The service's masking step on a call's lines (docs/runner-protocol.md §14): the secrets the
 * orchestrator declared with `expectJob`, and those the job registered with `::add-mask::`,
 * masked again on arrival, so an agent that does not mask leaks nothing the service knows.
 */
import type { Buffer } from "node:buffer";
import type { JobEnd } from "../../../gen/runner/v1/runner_pb.js";
import type { RunnerCore } from "../job-table.js";
import type { Registered } from "../job-maskers.js";
import { ReceivedLine } from "../../protocol/received-line.js";
import { ADD_MASK_PREFIX, mayBeAddMask } from "../../masking/add-mask.js";

/** A received line masked: itself when it holds no secret, else a new one over the masked bytes. O(bytes) expected. */
export function maskReceived(core: RunnerCore, id: string, line: ReceivedLine): ReceivedLine {
  let masked: Buffer | null;
  if (mayBeAddMask(line.buf, line.start, line.end)) {
    masked = registered(core, id, core.maskers.maskCommandBytes(id, line.buf, line.start, line.end));
  } else {
    const job = core.maskers.get(id);
    if (job === undefined) return line;
    // Not a command (checked above): the masker alone, without maskLineBytes' second look for one.
    masked = job.masker.maskBytes(line.buf, line.start, line.end);
  }
  return masked === null ? line : new ReceivedLine(line.requestId, masked, 0, masked.length, line.stderr);
}

/** A line's text masked (the same string when it holds no secret). O(line) expected. */
export function maskText(core: RunnerCore, id: string, text: string): string {
  if (text.includes(ADD_MASK_PREFIX)) return registered(core, id, core.maskers.maskCommandText(id, text));
  const job = core.maskers.get(id);
  return job === undefined ? text : job.masker.mask(text);
}

/** What a command line became; an operator hears of a value the server-wide bound kept out. O(1). */
function registered<T>(core: RunnerCore, id: string, r: Registered<T>): T {
  if (r.refusedUnderBudget) {
    const { registeredBytes, maxRegisteredBytes } = core.maskers;
    core.telemetry.logger.warn(
      { requestId: id, registeredBytes, maxRegisteredBytes },
      "::add-mask:: value not registered by the service: the server-wide bound on registered forms is reached " +
        "(limits.addMaskFormBytes; the agent's own masking still applies; told once a job)",
    );
  }
  return r.masked;
}

/** The end item with its repo_url and commit_sha masked (they reach the result message). O(fields). */
export function maskEnd(core: RunnerCore, id: string, end: JobEnd): JobEnd {
  const masker = core.maskers.get(id)?.masker;
  if (masker === undefined) return end;
  const repoUrl = masker.mask(end.repoUrl);
  const commitSha = masker.mask(end.commitSha);
  return repoUrl === end.repoUrl && commitSha === end.commitSha ? end : { ...end, repoUrl, commitSha };
}

/**
 * Drops the job's masker when the store says the job is over (its result recorded): a late call of the job may have
 * made it anew after the result dropped it, and it would hold its share of the server-wide bound for good. One store
 * read, only for a job with a masker. O(1).
 */
export async function forgetMaskerIfOver(core: RunnerCore, id: string): Promise<void> {
  if (core.maskers.get(id) === undefined) return;
  const state = await core.logs.get(id).catch(() => null);
  if (state !== null && state.status !== "open") core.maskers.delete(id);
}
