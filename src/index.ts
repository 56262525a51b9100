/**
 * runner-depot: the runner log-streaming side (gRPC) and the package depot (REST) with
 * the embedded-default adapters (memory, filesystem). Backends with optional peer
 * dependencies live in their own subpaths (`runner-depot/adapters/rabbitmq`, `…/s3`,
 * `…/postgres`), and the conformance kit in `runner-depot/testing`.
 */
export * from "./runner/index.js";
export * from "./depot/index.js";
export * from "./adapters/memory/index.js";
export * from "./adapters/fs/index.js";
export { RunnerDepotError, isRunnerDepotError } from "./errors.js";
export type { ErrorCode, ProblemDocument, RunnerDepotErrorOptions } from "./errors.js";
export { Runner, LogItemSchema, LogChunkSchema, JobEndSchema, AckSchema } from "./gen/runner/v1/runner_pb.js";
export type { LogItem, LogChunk, JobEnd, Ack } from "./gen/runner/v1/runner_pb.js";
