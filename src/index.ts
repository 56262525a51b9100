/**
 * Everything most hosts need from one import: the runner side (`runner-depot/runner`),
 * the depot (`runner-depot/depot`), the embedded-default adapters (memory and
 * filesystem), the error type {@link RunnerDepotError}, and the generated `runner.v1`
 * messages. Backends with optional peer dependencies live in their own subpaths
 * (`runner-depot/adapters/rabbitmq`, `…/s3`, `…/postgres`), and the conformance kit in
 * `runner-depot/testing`.
 *
 * @example
 * ```ts
 * import { createRunnerService, createMemoryQueue, createFsLogStore, isRunnerDepotError } from "runner-depot";
 *
 * const runner = createRunnerService(createMemoryQueue(), { logs: createFsLogStore("./logs") });
 * try {
 *   await runner.expectJob("not-a-uuid");
 * } catch (error) {
 *   if (isRunnerDepotError(error, "INVALID_ARGUMENT")) console.log(error.message);
 * }
 * ```
 *
 * @module runner-depot
 */
// First: throws on an unsupported Node before the rest loads (node-support.ts).
import "./node-check.js";
export * from "./runner/index.js";
export * from "./depot/index.js";
export * from "./adapters/memory/index.js";
export * from "./adapters/fs/index.js";
export { RunnerDepotError, isRunnerDepotError } from "./errors.js";
export type { ErrorCode, ProblemDocument, RunnerDepotErrorOptions } from "./errors.js";
export {
  Runner,
  LogItemSchema,
  LogChunkSchema,
  LogRunSchema,
  JobEndSchema,
  AckSchema,
} from "./gen/runner/v1/runner_pb.js";
export type { LogItem, LogChunk, LogRun, JobEnd, Ack } from "./gen/runner/v1/runner_pb.js";
