/**
 * GET /-/jobs/:id/log?follow over real HTTP (issue 31, item 10): followers are capped
 * (each costs the fan-out work on every line); a follower that goes away frees its slot.
 */
import http from "node:http";
import { randomUUID } from "node:crypto";
import { describe, expect, it } from "vitest";
import { createMemoryQueue } from "../../../src/adapters/memory/index.js";
import { createRunnerService } from "../../../src/runner/index.js";
import type { LogEntry } from "../../../src/runner/ports.js";
import { until } from "../../fixtures/runner-service.js";
import { serveControlApi } from "../../fixtures/control-http.js";

function get(url: string): Promise<{ response: http.IncomingMessage; request: http.ClientRequest }> {
  return new Promise((resolve, reject) => {
    const request = http.get(url, { headers: { authorization: "Bearer admin" } }, (response) =>
      resolve({ response, request }),
    );
    request.on("error", reject);
  });
}

async function bodyOf(response: http.IncomingMessage): Promise<string> {
  let text = "";
  for await (const chunk of response) text += String(chunk);
  return text;
}

describe("control API: ?follow responses are capped (issue 31, item 10)", () => {
  it("past maxFollowers a follow answers 413 RESOURCE_EXHAUSTED; a closed follower frees its slot; plain reads are not counted", async () => {
    const runner = createRunnerService(createMemoryQueue());
    const server = await serveControlApi({ runner, logs: runner.logs, maxFollowers: 2 });
    const id = randomUUID();
    const open: http.ClientRequest[] = [];
    try {
      await runner.expectJob(id);
      // A stored line, so that each follower's response starts at once.
      await runner.logs.append(id, 0, [{ stored: [{ line: "first", stderr: false }] } as LogEntry]);
      const url = `${server.url}/-/jobs/${id}/log`;
      for (let i = 0; i < 2; i++) {
        const { response, request } = await get(`${url}?follow`);
        expect(response.statusCode).toBe(200);
        open.push(request);
      }
      // Before: every follow was served (500 followers cost 2.5 µs a line each).
      const third = await get(`${url}?follow`);
      expect(third.response.statusCode).toBe(413);
      expect(await bodyOf(third.response)).toMatch(/resource-exhausted.*2 job logs are being followed/);
      const plain = await get(url);
      expect(plain.response.statusCode).toBe(200);
      await bodyOf(plain.response);
      open.shift()!.destroy();
      let status = 0;
      await until(async () => {
        const next = await get(`${url}?follow`);
        status = next.response.statusCode!;
        if (status === 200) open.push(next.request);
        else await bodyOf(next.response);
        return status === 200;
      }, "a follow in the freed slot");
      expect(status).toBe(200);
    } finally {
      for (const request of open) request.destroy();
      await server.close();
      await runner.close();
    }
  });
});
