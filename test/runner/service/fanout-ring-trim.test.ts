/**
 * follow(): the shared ring of a followed job keeps no line every follower has passed. A
 * ring of 4 096 lines a job was mostly lines nobody would read again (followers at the live
 * end keep up), and in the fleet bench it was the most memory of a loud job. A follower that
 * joins later gets those lines from the store. Lines arrive through a real HTTP/2 socket
 * (createRunnerClient → startRunnerServer); store reads are counted through a wrapper.
 */
import { randomUUID } from "node:crypto";
import { describe, expect, it } from "vitest";
import { createMemoryLogStore, createMemoryQueue } from "../../../src/adapters/memory/index.js";
import { createRunnerClient, createRunnerService, startRunnerServer } from "../../../src/runner/index.js";
import { countingReads } from "../../fixtures/log-reads.js";

const LINES = 200;

async function until(check: () => boolean, what: string): Promise<void> {
  for (let i = 0; i < 3000 && !check(); i++) await new Promise((r) => setTimeout(r, 10));
  if (!check()) throw new Error(`timed out waiting for ${what}`);
}

describe("follow(): the ring drops what every follower has passed", () => {
  it("a follower joining after the first one passed the lines reads them from the store, and both get every line", async () => {
    const counted = countingReads(createMemoryLogStore());
    const runner = createRunnerService(createMemoryQueue(), { logs: counted.store });
    const server = await startRunnerServer(runner, { port: 0 });
    const id = randomUUID();
    const client = createRunnerClient({ endpoint: server.url, requestId: id });
    try {
      await runner.expectJob(id);
      const first: string[] = [];
      const firstDone = (async () => {
        for await (const line of runner.follow(id)) first.push(line.line);
      })();
      for (let i = 0; i < LINES; i++) client.log(`line ${i}`);
      await client.flush();
      await until(() => first.length === LINES, "the first follower's lines");

      // Every line is behind the only follower: none is kept for a newcomer.
      const before = counted.reads();
      const stop = new AbortController();
      const second: string[] = [];
      for await (const line of runner.follow(id, { signal: stop.signal })) {
        second.push(line.line);
        if (second.length === LINES) break;
      }
      stop.abort();
      expect(counted.reads() - before).toBeGreaterThanOrEqual(1);
      expect(second).toEqual(first);

      await client.end({ exitCode: 0, success: true });
      await firstDone;
      expect(first).toEqual(Array.from({ length: LINES }, (_, i) => `line ${i}`));
    } finally {
      await client.close();
      await server.close();
      await runner.close();
    }
  }, 60_000);
});
