/** runner-depot/runner: the runner log-streaming side (orchestrator service and server, VM agent and client, cloud-init). */
export type * from "./ports.js";
export { createRunnerService, COMMITTED_HEADER, REASON_HEADER, OFFSET_HEADER, DEFAULT_RUNNER_LIMITS } from "./service.js";
export type { RunnerService, RunnerServiceOptions, RunnerLimits, RunnerAuthorizeContext, PublishRetryOptions, EndedReason, ExpectJobInfo } from "./service.js";
export { startRunnerServer, createRunnerHandler } from "./server.js";
export type { RunnerServer, RunnerServerSettings, RunnerTlsSettings, RunnerHandler, RunnerHandlerOptions } from "./server.js";
export { mintJobToken, verifyJobToken } from "./token.js";
export type { JobTokenSecret } from "./token.js";
export { isRequestId, normalizeRequestId } from "./uuid.js";
export { createRunnerClient } from "./client.js";
export type { RunnerClient, RunnerClientOptions, RunnerClientTlsOptions, RunnerClientStats, RunnerStop } from "./client.js";
export { runJob } from "./agent.js";
export type { RunJobOptions } from "./agent.js";
export { renderCloudInit, readJobConfig, DEFAULT_JOB_CONFIG_PATH } from "./cloud-init.js";
export type { CloudInitJob, JobConfig } from "./cloud-init.js";
export type { JobEndFields } from "./encoder.js";
