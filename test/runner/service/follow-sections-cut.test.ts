/**
 * `follow(id, { sections: true })` over a cut log (docs/decisions/log-tail.md): the drop marker stands for itself and
 * the positions after it that hold no line, so a section whose markers are in the kept tail is reported at the
 * positions `read` and the store's own record give it. An attack round (2026-12-02) found follow() counting one a
 * line: the events past the marker were off by the dropped count. The lines go over gRPC from the agent's client into
 * a real runner server whose job log cap cuts the log.
 */
import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createMemoryLogStore, createMemoryQueue } from "../../../src/adapters/memory/index.js";
import {
  createRunnerClient,
  createRunnerService,
  startRunnerServer,
  type RunnerServer,
  type RunnerService,
} from "../../../src/runner/index.js";
import type { LogSectionEvent } from "../../../src/runner/ports.js";
import { positionAfter } from "../../../src/runner/service/log-tail.js";

describe("follow() with sections over a cut log", () => {
  let runner: RunnerService;
  let server: RunnerServer;
  const id = randomUUID();

  beforeAll(async () => {
    runner = createRunnerService(createMemoryQueue(), {
      logs: createMemoryLogStore(),
      limits: { jobLogBytes: 16 * 1024 },
    });
    server = await startRunnerServer(runner, { host: "127.0.0.1", port: 0 });
    const client = createRunnerClient({ endpoint: server.url, requestId: id });
    // 2,000 lines of ~100 bytes: 200 KB against a 16 KiB cap, so most are dropped; the section is in the tail.
    for (let i = 0; i < 2_000; i++) if (!client.log(`line ${i} ${"x".repeat(90)}`, false)) await client.drained();
    client.log("::group::late", false);
    client.log("in the late section", false);
    client.log("::endgroup::", false);
    client.log("after", false);
    await client.end({ exitCode: 0, success: true });
    await client.close();
  }, 60_000);

  afterAll(async () => {
    await server?.close();
    await runner?.close();
  });

  it("reports the tail's section at the positions the store gives it", async () => {
    const state = await runner.logs.get(id);
    expect(state?.cut?.lines).toBeGreaterThan(1_000);
    const record = await runner.logs.sections!(id);
    const late = record!.sections.find((s) => s.name === "late")!;
    // Where `read` puts the marker lines: position after position, the drop marker counting what it stands for.
    const lines = await runner.logs.read(id);
    const positions: number[] = [];
    let position = 0;
    for (const line of lines) {
      positions.push(position);
      position = positionAfter(position, [line]);
    }
    expect(positions[lines.findIndex((l) => l.line === "::group::late")]).toBe(late.start);
    const events: LogSectionEvent[] = [];
    for await (const item of runner.follow(id, { sections: true })) if ("section" in item) events.push(item);
    expect(events.filter((e) => e.name === "late").map((e) => [e.section, e.position])).toEqual([
      ["start", late.start],
      ["end", late.end],
    ]);
  });
});
