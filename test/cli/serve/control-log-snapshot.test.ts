/**
 * GET /-/jobs/:id/log without ?follow over real HTTP: the lines stored when it was asked, whatever the job stores
 * while the answer is read. A page short by its byte bound is not the log's end, so the review of 2026-12-02 found
 * the reader chasing a job that kept logging (it stopped only at an empty page); ?follow is for what comes after.
 */
import { randomUUID } from "node:crypto";
import { describe, expect, it } from "vitest";
import { createMemoryLogStore, createMemoryQueue } from "../../../src/adapters/memory/index.js";
import { createRunnerService } from "../../../src/runner/index.js";
import type { LogEntry } from "../../../src/runner/ports.js";
import { serveControlApi } from "../../fixtures/control-http.js";

/** Lines of 100 KB: a 1 MiB page holds ten, so the answer is many pages. */
const LINE = (i: number) => `${i} `.padEnd(100_000, "z");
const entries = (from: number, count: number): LogEntry[] =>
  Array.from({ length: count }, (_, k) => ({ stored: [{ line: LINE(from + k), stderr: false }] }) as LogEntry);

describe("control API: the stored log of a job still writing", () => {
  it("answers the lines stored when it was asked, not those stored while it is read", async () => {
    const logs = createMemoryLogStore();
    const runner = createRunnerService(createMemoryQueue(), { logs });
    const server = await serveControlApi({ runner, logs });
    const id = randomUUID();
    try {
      await runner.expectJob(id);
      await logs.append(id, 0, entries(0, 100));
      const answer = await fetch(`${server.url}/-/jobs/${id}/log`, { headers: { authorization: "Bearer admin" } });
      expect(answer.status).toBe(200);
      const reader = answer.body!.getReader();
      const first = await reader.read();
      // The job goes on: 200 more lines while the answer is still being read.
      await logs.append(id, 100, entries(100, 200));
      let text = Buffer.from(first.value!).toString("utf8");
      for (let next = await reader.read(); !next.done; next = await reader.read())
        text += Buffer.from(next.value).toString("utf8");
      const lines = text
        .trim()
        .split("\n")
        .map((l) => JSON.parse(l) as { line?: string });
      expect(lines.map((l) => l.line)).toEqual(Array.from({ length: 100 }, (_, i) => LINE(i)));
    } finally {
      await server.close();
      await runner.close();
    }
  });
});
