/**
 * The control API's job routes for `runner-depot jobs` and `runner-depot cancel`:
 * `GET /-/jobs` (a page of `RunnerService.listJobs`, newest first),
 * `POST /-/jobs/<id>/cancel` and `GET /-/jobs/<id>/sections`. The admin token is checked by the caller (control.ts).
 */
import { RunnerDepotError } from "../../errors.js";
import type { JobPage, RunnerService } from "../../runner/index.js";
import { normalizeRequestId } from "../../runner/protocol/request-id.js";
import type { JobLogStore, JobResult, JobStatus, LogSections } from "../../runner/ports.js";
import { emptySections } from "../../runner/service/log-sections.js";

/** The answer of `POST /-/jobs/<id>/cancel`. */
export interface CancelJobResponse {
  requestId: string;
  /** The cancelled result, published now. */
  result: JobResult;
}

/**
 * `GET /-/jobs?status=open,finished&limit=20&cursor=…` → {@link JobPage}.
 * O(log jobs + page) in the stores' ordered index (runner/service/job-list.ts).
 */
export async function listJobsRoute(runner: RunnerService, url: URL): Promise<Response> {
  const status = url.searchParams.get("status");
  const limit = url.searchParams.get("limit");
  const page: JobPage = await runner.listJobs({
    status: status ? (status.split(",") as JobStatus[]) : undefined,
    limit: limit === null ? undefined : Number(limit),
    cursor: url.searchParams.get("cursor") ?? undefined,
  });
  return Response.json(page, { headers: { "cache-control": "no-store" } });
}

/** The request ID a path segment names (percent-decoded), or INVALID_ARGUMENT (a malformed escape too). O(segment). */
export function requestIdOf(segment: string): string {
  let rawId = segment;
  try {
    rawId = decodeURIComponent(segment);
  } catch {
    // Malformed escapes: not a request ID either, refused below.
  }
  const requestId = normalizeRequestId(rawId);
  if (!requestId) throw new RunnerDepotError("INVALID_ARGUMENT", `not a request ID: ${rawId.slice(0, 64)}`);
  return requestId;
}

/**
 * `POST /-/jobs/<id>/cancel`: cancels an open job (its result is published at once with
 * outcome `cancelled`; the agent's next call gets ok = false and stops the command).
 * NOT_FOUND for a job never seen; FAILED_PRECONDITION (409) naming how it ended for a
 * job already over.
 */
export async function cancelJobRoute(runner: RunnerService, logs: JobLogStore, segment: string): Promise<Response> {
  const requestId = requestIdOf(segment);
  // cancelJob on an ID never seen would still publish a result: refuse a typo instead.
  const state = await logs.get(requestId);
  if (!state) throw new RunnerDepotError("NOT_FOUND", `no job ${requestId}`);
  const result =
    state.status === "open" ? await runner.cancelJob(requestId, "cancelled with runner-depot cancel") : null;
  if (!result) {
    const after = (await logs.get(requestId))?.result ?? state.result;
    const how = after
      ? `${after.outcome}${after.outcome === "finished" ? `, exit code ${after.exitCode}` : ""}`
      : state.status;
    throw new RunnerDepotError("FAILED_PRECONDITION", `job ${requestId} already ended (${how}); nothing to cancel`);
  }
  const answer: CancelJobResponse = { requestId, result };
  return Response.json(answer);
}

/**
 * `GET /-/jobs/<id>/sections` → the job's {@link LogSections} with `storedLines` and `status`
 * (docs/decisions/log-sections.md). NOT_FOUND for a job never seen. O(sections).
 */
export async function jobSectionsRoute(logs: JobLogStore, segment: string): Promise<Response> {
  const requestId = requestIdOf(segment);
  const state = await logs.get(requestId);
  if (!state) throw new RunnerDepotError("NOT_FOUND", `no job ${requestId}`);
  const record = (logs.sections ? await logs.sections(requestId) : null) ?? emptySections();
  return Response.json(
    { ...record, storedLines: state.storedLines, status: state.status, exitCode: state.result?.exitCode ?? null },
    { headers: { "cache-control": "no-store" } },
  );
}
