/**
 * A slice of a host's orchestrator, the code its unit test (host.test.ts) exercises:
 * launching a job renders the VM's user data and registers the job with the runner
 * service, so that only launched jobs may stream (requireKnownJobs).
 */
import { randomUUID } from "node:crypto";
import { mintJobToken, renderCloudInit, type RunnerService } from "runner-depot/runner";

/** What the host launches. */
export interface CiJob {
  repoUrl: string;
  commitSha: string;
  command: string[];
}

/** A launched job: its ID and the user data the VM boots with. */
export interface LaunchedJob {
  requestId: string;
  userData: string;
}

/**
 * Registers a job with the runner service and renders its cloud-init user data.
 *
 * @example
 * const { requestId, userData } = await launchJob(runner, secret, "https://ci.internal:50051", job);
 * await cloud.createVm({ userData });
 */
export async function launchJob(
  runner: RunnerService,
  secret: string,
  endpoint: string,
  job: CiJob,
): Promise<LaunchedJob> {
  const requestId = randomUUID();
  await runner.expectJob(requestId, { repoUrl: job.repoUrl, commitSha: job.commitSha });
  const userData = renderCloudInit({
    endpoint,
    requestId,
    token: mintJobToken(secret, requestId),
    repoUrl: job.repoUrl,
    commitSha: job.commitSha,
    command: job.command,
  });
  return { requestId, userData };
}
