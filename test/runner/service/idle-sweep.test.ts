/**
 * The idle limit of StreamLogs calls runs on one timer per service (runner/service/idle-sweep.ts), not one
 * per call: open calls add no timer, and every idle call is still ended DEADLINE_EXCEEDED
 * with its committed count. Calls through real HTTP/2 sockets, one connection each, as a
 * fleet's agents open them.
 */
import { describe, expect, it } from "vitest";
import { createMemoryLogStore, createMemoryQueue } from "../../../src/adapters/memory/index.js";
import { createRunnerService, startRunnerServer } from "../../../src/runner/index.js";
import { until } from "../../fixtures/runner-service.js";
import { openLogCall } from "../../fixtures/open-log-call.js";

const CALLS = 20;
const IDLE_MS = 5_000;

/** Timers keeping this process's event loop alive. */
const timers = () => process.getActiveResourcesInfo().filter((r) => r === "Timeout").length;

/** One connection holding one StreamLogs call that sent one line; its trailers once ended. */
const openCall = (url: string) => openLogCall(url, "started");

describe("runner idle limit: one sweep for every call", () => {
  it(`${CALLS} open calls add no timer, and each is ended DEADLINE_EXCEEDED after ${IDLE_MS} ms without an item`, async () => {
    const runner = createRunnerService(createMemoryQueue(), {
      logs: createMemoryLogStore(),
      limits: { idleMs: IDLE_MS },
    });
    const server = await startRunnerServer(runner, { port: 0 });
    const calls: ReturnType<typeof openCall>[] = [];
    try {
      // The sweep's own timer runs from the first call on.
      calls.push(openCall(server.url));
      await until(() => runner.activeCalls === 1, "the first call");
      const before = timers();
      for (let i = 1; i < CALLS; i++) calls.push(openCall(server.url));
      await until(() => runner.activeCalls === CALLS, `${CALLS} open calls`);
      // With a timer per call this grew by CALLS - 1; allow a few of the runtime's own.
      expect(timers() - before).toBeLessThan(5);

      const answers = await Promise.all(calls.map((c) => c.trailers));
      for (const headers of answers) {
        expect(headers["grpc-status"]).toBe("4");
        expect(headers["runner-committed"]).toBe("1");
      }
    } finally {
      for (const c of calls) c.session.destroy();
      await server.close();
      await runner.close();
    }
  }, 60_000);
});
