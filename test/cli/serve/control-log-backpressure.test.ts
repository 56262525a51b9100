/**
 * GET /-/jobs/:id/log over real HTTP on a real PostgreSQL log store: a client that
 * connects and then never reads holds the server's store reads back (the body is
 * pull-driven), with and without ?follow. Before, the whole log was read and queued in
 * serve's memory (a 300 MB log took serve from 105 to 623 MB RSS).
 */
import http from "node:http";
import { randomUUID } from "node:crypto";
import { describe, expect, it } from "vitest";
import { createMemoryQueue } from "../../../src/adapters/memory/index.js";
import { createPostgresLogStore } from "../../../src/adapters/postgres/index.js";
import { createRunnerService } from "../../../src/runner/index.js";
import type { JobLogStore, LogEntry } from "../../../src/runner/ports.js";
import { createTestSchema, needs } from "../../fixtures/backends.js";
import { serveControlApi } from "../../fixtures/control-http.js";

needs("postgres");

const LINES = 20_000;
const LINE = "y".repeat(2000); // 40 MB of log, far more than the sockets' buffers hold

/** Counts the characters handed out by the store's reads (what serve pulled). */
function countingReads(store: JobLogStore): { store: JobLogStore; chars: () => number } {
  let chars = 0;
  return {
    store: {
      ...store,
      async read(id, from, limit) {
        const page = await store.read(id, from, limit);
        for (const line of page) chars += line.line.length;
        return page;
      },
    },
    chars: () => chars,
  };
}

/** Resolves once `value()` has not moved for 10 checks in a row (the server stalled). */
async function settled(value: () => number): Promise<number> {
  let last = -1;
  for (let still = 0; still < 10;) {
    await new Promise((r) => setTimeout(r, 50));
    const now = value();
    still = now === last ? still + 1 : 0;
    last = now;
  }
  return last;
}

describe("control API: a job log to a client that does not read", () => {
  it.each([
    ["stored log", ""],
    ["?follow", "?follow"],
  ])(
    "%s: the server reads only what the sockets hold, then stops; the rest is still served once the client reads",
    async (_name, query) => {
      const db = await createTestSchema();
      const pgStore = createPostgresLogStore({ pool: db.pool, schema: db.schema });
      const counted = countingReads(pgStore);
      const runner = createRunnerService(createMemoryQueue(), { logs: counted.store });
      const server = await serveControlApi({ runner, logs: counted.store });
      const id = randomUUID();
      try {
        await runner.expectJob(id);
        for (let at = 0; at < LINES; at += 2000) {
          const entries: LogEntry[] = Array.from(
            { length: 2000 },
            () => ({ stored: [{ line: LINE, stderr: false }] }) as LogEntry,
          );
          await pgStore.append(id, at, entries);
        }
        await runner.cancelJob(id); // ended, so ?follow ends at the last line too
        const total = LINES * LINE.length;
        const response = await new Promise<http.IncomingMessage>((resolve, reject) => {
          const request = http.get(
            `${server.url}/-/jobs/${id}/log${query}`,
            { headers: { authorization: "Bearer admin" } },
            resolve,
          );
          request.on("error", reject);
        });
        expect(response.statusCode).toBe(200);
        response.pause(); // never reads while paused
        const pulled = await settled(counted.chars);
        // The kernel's socket buffers take a few MB; the rest stays in the store.
        expect(pulled).toBeLessThan(total / 4);
        // Reading on gets every line and the end.
        let lines = 0;
        let tail = "";
        response.setEncoding("utf8");
        for await (const chunk of response as AsyncIterable<string>) {
          const text = tail + chunk;
          const parts = text.split("\n");
          tail = parts.pop()!;
          for (const part of parts) if (part.startsWith('{"line"')) lines++;
        }
        expect(lines).toBe(LINES);
        expect(counted.chars()).toBe(total);
      } finally {
        await server.close();
        await runner.close();
        await db.drop();
      }
    },
    120_000,
  );
});
