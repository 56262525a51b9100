/**
 * The job-result queue on RabbitMQ (needs the optional peer dependency `amqplib`). Each
 * result is a persistent JSON message on a durable queue (default `runner.job-results`),
 * published on a confirm channel with `messageId` = the request ID and
 * `type` = {@link JOB_RESULT_MESSAGE_TYPE}; `publishJobResult` resolves once the broker
 * confirmed it. The adapter reconnects with back-off after a broker restart.
 *
 * @example
 * ```ts
 * import { createRabbitMqQueue } from "runner-depot/adapters/rabbitmq";
 * import { createRunnerService } from "runner-depot/runner";
 *
 * const queue = createRabbitMqQueue({ url: "amqp://guest:guest@127.0.0.1:5672" });
 * await queue.ready();
 * const runner = createRunnerService(queue, { secret: process.env.JOB_SECRET! });
 * // … on shutdown
 * await runner.close();
 * await queue.close();
 * ```
 *
 * @module runner-depot/adapters/rabbitmq
 */
// First: throws on an unsupported Node before the rest loads (node-support.ts).
import "../../node-check.js";
export { createRabbitMqQueue, JOB_RESULT_MESSAGE_TYPE } from "./queue.js";
export type { RabbitMqQueue, RabbitMqQueueOptions } from "./queue.js";
