/**
 * A call waiting for its next item holds none of the request chunks it read: the fast path
 * keeps a received line as bytes in its chunk (runner/protocol/received-line.ts) until it is stored, so an
 * item the call still referenced while it waited (the reader's last batch, the first item
 * in the call's frame) pinned a whole read (up to 64 KiB) for as long as the stream stayed
 * open. Lines of ~48 KiB through real HTTP/2 sockets into the fs store (which keeps
 * nothing in memory); Node's array-buffer memory after a full GC, with the calls open.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import { describe, expect, it } from "vitest";
import { createFsLogStore } from "../../../src/adapters/fs/index.js";
import { createMemoryQueue } from "../../../src/adapters/memory/index.js";
import { createRunnerService, startRunnerServer } from "../../../src/runner/index.js";
import { until } from "../../fixtures/runner-service.js";
import { openLogCall } from "../../fixtures/open-log-call.js";

const CALLS = 20;
const LINE_BYTES = 48 * 1024;

setFlagsFromString("--expose-gc");
const gc = runInNewContext("gc") as () => void;

function arrayBuffersAfterGc(): number {
  gc();
  gc();
  return process.memoryUsage().arrayBuffers;
}

/** One connection holding one StreamLogs call that sent `items` lines of LINE_BYTES and waits. */
const openCall = (url: string, items: number) => openLogCall(url, "x".repeat(LINE_BYTES), items);

describe("runner: an open call holds no request chunk while it waits", () => {
  it(`${CALLS} calls that sent ~48 KiB lines and wait hold no array-buffer memory for them`, async () => {
    const dir = mkdtempSync(join(tmpdir(), "runner-idle-chunks-"));
    const logs = createFsLogStore(dir);
    const runner = createRunnerService(createMemoryQueue(), { logs });
    const server = await startRunnerServer(runner, { port: 0 });
    const calls: ReturnType<typeof openCall>[] = [];
    // Every line of `some` stored (so nothing is legitimately queued), the calls still open.
    const stored = (some: typeof calls) =>
      until(async () => {
        for (const c of some) if ((await logs.get(c.requestId))?.committed !== c.items) return false;
        return true;
      }, "every line stored");
    try {
      // Warm up (first-use buffers of the runtime), then the baseline.
      calls.push(openCall(server.url, 1));
      await stored(calls);
      const before = arrayBuffersAfterGc();
      for (let i = 0; i < CALLS; i++) calls.push(openCall(server.url, 1 + (i % 3)));
      await until(() => runner.activeCalls === CALLS + 1, `${CALLS} more open calls`);
      await stored(calls);
      const held = arrayBuffersAfterGc() - before;
      // Pinned, each call held at least one ~48 KiB chunk: CALLS × 48 KiB ≈ 960 KiB.
      expect(held).toBeLessThan((CALLS * LINE_BYTES) / 4);
    } finally {
      for (const c of calls) c.session.destroy();
      await server.close();
      await runner.close();
      rmSync(dir, { recursive: true, force: true });
    }
  }, 60_000);
});
