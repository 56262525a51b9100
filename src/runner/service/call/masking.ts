/**
 * The service's masking step on a call's lines (docs/runner-protocol.md §14): the secrets the
 * orchestrator declared with `expectJob`, and those the job registered with `::add-mask::`,
 * masked again on arrival, so an agent that does not mask leaks nothing the service knows.
 */
import type { JobEnd } from "../../../gen/runner/v1/runner_pb.js";
import type { RunnerCore } from "../job-table.js";
import { ReceivedLine } from "../../protocol/received-line.js";
import { ADD_MASK_PREFIX, maskLine, maskLineBytes, mayBeAddMask } from "../../masking/add-mask.js";
import { jobMasker, type JobMasker } from "../../masking/job-masker.js";

/** The job's masker; one is made when a line may register a value (`::add-mask::`). O(1). */
function maskerFor(core: RunnerCore, id: string, mayRegister: boolean): JobMasker | undefined {
  let job = core.maskers.get(id);
  if (job === undefined && mayRegister) core.maskers.set(id, (job = jobMasker([])));
  return job;
}

/** A received line masked: itself when it holds no secret, else a new one over the masked bytes. O(bytes) expected. */
export function maskReceived(core: RunnerCore, id: string, line: ReceivedLine): ReceivedLine {
  const job = maskerFor(core, id, mayBeAddMask(line.buf, line.start, line.end));
  if (job === undefined) return line;
  const masked = maskLineBytes(job.masker, line.buf, line.start, line.end, undefined, job.limits);
  return masked === null ? line : new ReceivedLine(line.requestId, masked, 0, masked.length, line.stderr);
}

/** A line's text masked (the same string when it holds no secret). O(line) expected. */
export function maskText(core: RunnerCore, id: string, text: string): string {
  const job = maskerFor(core, id, text.includes(ADD_MASK_PREFIX));
  return job === undefined ? text : maskLine(job.masker, text, undefined, job.limits);
}

/** The end item with its repo_url and commit_sha masked (they reach the result message). O(fields). */
export function maskEnd(core: RunnerCore, id: string, end: JobEnd): JobEnd {
  const masker = core.maskers.get(id)?.masker;
  if (masker === undefined) return end;
  const repoUrl = masker.mask(end.repoUrl);
  const commitSha = masker.mask(end.commitSha);
  return repoUrl === end.repoUrl && commitSha === end.commitSha ? end : { ...end, repoUrl, commitSha };
}
