/** The JobResult records the service publishes: a runner's end, a cancel, a lost job. */
import type { JobEnd } from "../../gen/runner/v1/runner_pb.js";
import type { JobResult, JobState } from "../ports.js";

/** The result of a job the runner ended (its end item), with the store's counts. */
export function finishedResult(id: string, state: JobState, end: JobEnd): JobResult {
  const now = new Date();
  return {
    requestId: id,
    outcome: "finished",
    exitCode: end.exitCode,
    success: end.success,
    repoUrl: end.repoUrl || (typeof state.info.repoUrl === "string" ? state.info.repoUrl : ""),
    commitSha: end.commitSha || (typeof state.info.commitSha === "string" ? state.info.commitSha : ""),
    lines: { ...state.lines },
    logTruncated: state.logTruncated,
    startedAt: state.startedAt ?? now.toISOString(),
    endedAt: now.toISOString(),
  };
}

/** The result of a job the host ended (cancelled, or declared lost by the sweep). */
export function hostResult(state: JobState | null, id: string, outcome: "cancelled" | "lost", now: Date): JobResult {
  return {
    requestId: id,
    outcome,
    exitCode: -1,
    success: false,
    repoUrl: typeof state?.info.repoUrl === "string" ? state.info.repoUrl : "",
    commitSha: typeof state?.info.commitSha === "string" ? state.info.commitSha : "",
    lines: { stdout: state?.lines.stdout ?? 0, stderr: state?.lines.stderr ?? 0 },
    logTruncated: state?.logTruncated ?? false,
    startedAt: state?.startedAt ?? null,
    endedAt: now.toISOString(),
  };
}
