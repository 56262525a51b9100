// Run only by test/setup/global-setup.test.ts (see vitest.config.ts beside it).
import amqp from "amqplib";
import { expect, it } from "vitest";
import { needs, RABBITMQ_URL } from "../../fixtures/backends.js";

const haveBroker = needs("rabbitmq");

it("gets the decided RabbitMQ, which answers", async () => {
  expect(haveBroker).toBe(true);
  const connection = await amqp.connect(RABBITMQ_URL);
  await connection.close();
});

it("a second test of the same file is skipped for the same reason", () => {
  expect(haveBroker).toBe(true);
});
