/**
 * The runner side of runner-depot: `runner.v1.Runner/StreamLogs` over gRPC.
 *
 * - **Orchestrator:** {@link createRunnerService} holds the protocol rules (exactly-once
 *   storage across reconnects, one job result per job on the queue, cancel, lost-job
 *   detection, limits); {@link startRunnerServer} serves it on HTTP/2 (h2c, TLS, mutual
 *   TLS), {@link createRunnerHandler} mounts it on a host's own `node:http2` server.
 * - **Launching a job:** {@link mintJobToken} signs a per-job token and
 *   {@link renderCloudInit} turns endpoint, request ID, token and command into the VM's
 *   `#cloud-config` user data.
 * - **Inside the VM:** {@link readJobConfig} reads the job config cloud-init wrote,
 *   {@link createRunnerClient} streams items with a spool and replay, and {@link runJob}
 *   runs the job's process and streams its output.
 *
 * The wire protocol these implement is specified in
 * [docs/runner-protocol.md](../../docs/runner-protocol.md).
 *
 * @example
 * ```ts
 * import { createRunnerService, startRunnerServer, mintJobToken, renderCloudInit } from "runner-depot/runner";
 * import { createMemoryQueue } from "runner-depot/adapters/memory";
 *
 * const secret = process.env.JOB_SECRET!;
 * const runner = createRunnerService(createMemoryQueue(), { secret });
 * const server = await startRunnerServer(runner, { port: 50051 });
 *
 * const requestId = crypto.randomUUID();
 * await runner.expectJob(requestId);
 * const userData = renderCloudInit({
 *   endpoint: server.url,
 *   requestId,
 *   token: mintJobToken(secret, requestId),
 *   command: ["make", "test"],
 * });
 * for await (const line of runner.follow(requestId)) console.log(line.line);
 * ```
 *
 * @module runner-depot/runner
 */
// First: throws on an unsupported Node before the rest loads (node-support.ts).
import "../node-check.js";
import { createMemoryLogStore } from "../adapters/memory/log-store.js";
import type { JobResultQueue } from "./ports.js";
import type { RunnerService, RunnerServiceOptions } from "./service/contract.js";
import { assembleRunnerService } from "./service/runner-service.js";

/**
 * Creates the orchestrator's runner service. Without `options.logs` it keeps the job logs in memory
 * (`createMemoryLogStore()`): nothing survives the process.
 *
 * @example
 * const queue = createMemoryQueue();
 * const runner = createRunnerService(queue, { secret: process.env.RUNNER_SECRET });
 * const server = await startRunnerServer(runner, { port: 50051 });
 * // or mount it yourself: connectNodeAdapter({ routes: (r) => r.service(Runner, runner) })
 */
export function createRunnerService(queue: JobResultQueue, options: RunnerServiceOptions = {}): RunnerService {
  return assembleRunnerService(queue, options, createMemoryLogStore);
}

export type * from "./ports.js";
export { silentLogger } from "../telemetry.js";
export type { Logger, LogFn, TelemetryOptions } from "../telemetry.js";
export type {
  RunnerService,
  RunnerServiceOptions,
  RunnerLimits,
  RunnerAuthorizeContext,
  PublishRetryOptions,
  ExpectJobInfo,
} from "./service/runner-service.js";
export type { JobSummary, JobPage, ListJobsOptions } from "./service/job-list.js";
export { createArchivingLogStore } from "./archive/archiving-store.js";
export type { FollowOptions } from "./service/fanout.js";
export type { ArchivingLogStore, LogArchiveOptions } from "./archive/archiving-store.js";
export { startRunnerServer } from "./server/start-server.js";
export type {
  RunnerServer,
  RunnerServerSettings,
  RunnerTlsSettings,
  RunnerDrainOptions,
} from "./server/start-server.js";
export { createRunnerHandler } from "./server/handler.js";
export type { RunnerHandler, RunnerHandlerOptions, RunnerDrainReport } from "./server/handler.js";
export { createRunnerHealth } from "./server/health.js";
export type { RunnerHealth, RunnerHealthOptions, HealthStatus } from "./server/health.js";
export {
  Health,
  HealthCheckRequestSchema,
  HealthCheckResponseSchema,
  HealthCheckResponse_ServingStatus,
  HealthListRequestSchema,
  HealthListResponseSchema,
} from "../gen/grpc/health/v1/health_pb.js";
export type {
  HealthCheckRequest,
  HealthCheckResponse,
  HealthListRequest,
  HealthListResponse,
} from "../gen/grpc/health/v1/health_pb.js";
export type { RunnerReadLimits } from "./server/read-budget.js";
export { mintJobToken } from "./protocol/token.js";
export type { JobTokenSecret } from "./protocol/token.js";
export { createRunnerClient } from "./client/runner-client.js";
export type {
  RunnerClient,
  RunnerClientOptions,
  RunnerClientTlsOptions,
  RunnerClientStats,
  RunnerStop,
} from "./client/runner-client.js";
export { checkJobCredentials } from "./client/credentials-probe.js";
export type { CredentialsCheckOptions, CredentialsCheckResult } from "./client/credentials-probe.js";
export { runJob } from "./agent/run-job.js";
export type { RunJobOptions } from "./agent/run-job.js";
export { renderCloudInit, readJobConfig } from "./agent/cloud-init.js";
export type { CloudInitJob, CloudInitAgent, JobConfig } from "./agent/cloud-init.js";
export { publishAgent, agentFromDepot, agentPackageName } from "./agent/agent-package.js";
export type { AgentPlatform, PublishedAgent } from "./agent/agent-package.js";
export type { JobEndFields } from "./protocol/encoder.js";
