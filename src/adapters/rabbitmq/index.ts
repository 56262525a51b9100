/** runner-depot/adapters/rabbitmq: the job-result queue on RabbitMQ (amqplib). */
export { createRabbitMqQueue, JOB_RESULT_MESSAGE_TYPE } from "./queue.js";
export type { RabbitMqQueue, RabbitMqQueueOptions } from "./queue.js";
