/** RunnerService.listJobs: jobs streamed over real gRPC, listed newest first with their summaries, paged and filtered. */
import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { RunnerDepotError } from "../../../src/errors.js";
import { createRunnerService } from "../../../src/runner/index.js";
import { createMemoryQueue } from "../../../src/adapters/memory/index.js";
import { createMemoryLogStore } from "../../../src/adapters/memory/log-store.js";
import { decodeJobCursor } from "../../../src/runner/service/job-list.js";
import { end, line, send, startHarness, type Harness } from "../../fixtures/runner-service.js";

describe("RunnerService.listJobs (fs log store, real gRPC)", () => {
  let h: Harness;
  const ids: string[] = [];
  beforeAll(async () => {
    h = await startHarness();
    // Four jobs: finished with exit 3, cancelled, open with lines, registered only. Each is
    // created in a later millisecond than the one before (jobs of one millisecond are
    // ordered by request ID).
    for (let i = 0; i < 4; i++) ids.push(randomUUID());
    const tick = () => new Promise((r) => setTimeout(r, 3));
    await h.runner.expectJob(ids[0]!, { repoUrl: "https://git.example/a.git", commitSha: "aaa" });
    await tick();
    expect(
      (await send(h.client, [line(ids[0]!, "one"), line(ids[0]!, "two", true), end(ids[0]!, 3, false, "", "abc")])).ok,
    ).toBe(true);
    await h.runner.expectJob(ids[1]!);
    await h.runner.cancelJob(ids[1]!);
    await tick();
    expect((await send(h.client, [line(ids[2]!, "running")])).ok).toBe(true);
    await tick();
    await h.runner.expectJob(ids[3]!, { repoUrl: "https://git.example/d.git" });
  });
  afterAll(async () => {
    await h.close();
  });

  it("lists newest first with state, outcome, exit code, line counts, repository, commit and duration", async () => {
    const page = await h.runner.listJobs();
    expect(page.next).toBeNull();
    expect(page.jobs.map((j) => j.requestId)).toEqual([...ids].reverse());
    const [registered, running, cancelled, finished] = page.jobs;
    expect(finished).toMatchObject({
      status: "finished",
      outcome: "finished",
      exitCode: 3,
      success: false,
      repoUrl: "https://git.example/a.git",
      commitSha: "abc",
      lines: { stdout: 1, stderr: 1 },
      storedLines: 2,
      logTruncated: false,
      expected: true,
    });
    expect(finished!.durationMs).toBeGreaterThanOrEqual(0);
    expect(finished!.endedAt).toMatch(/Z$/);
    expect(cancelled).toMatchObject({
      status: "cancelled",
      outcome: "cancelled",
      exitCode: -1,
      durationMs: null,
      storedLines: 0,
    });
    expect(running).toMatchObject({
      status: "open",
      outcome: null,
      exitCode: null,
      endedAt: null,
      durationMs: null,
      storedLines: 1,
      expected: false,
    });
    expect(running!.startedAt).toMatch(/Z$/);
    expect(registered).toMatchObject({
      status: "open",
      repoUrl: "https://git.example/d.git",
      commitSha: "",
      startedAt: null,
      storedLines: 0,
    });
  });

  it("pages with a cursor: every job exactly once, in order", async () => {
    const seen: string[] = [];
    let cursor: string | undefined;
    let pages = 0;
    do {
      const page = await h.runner.listJobs({ limit: 1, cursor });
      expect(page.jobs.length).toBeLessThanOrEqual(1);
      seen.push(...page.jobs.map((j) => j.requestId));
      cursor = page.next ?? undefined;
      pages++;
    } while (cursor);
    expect(seen).toEqual([...ids].reverse());
    expect(pages).toBe(4);
  });

  it("filters by one state or several", async () => {
    expect((await h.runner.listJobs({ status: "open" })).jobs.map((j) => j.requestId)).toEqual([ids[3], ids[2]]);
    expect((await h.runner.listJobs({ status: ["cancelled", "finished"] })).jobs.map((j) => j.requestId)).toEqual([
      ids[1],
      ids[0],
    ]);
    expect((await h.runner.listJobs({ status: "lost" })).jobs).toEqual([]);
  });

  it("refuses a bad limit, state or cursor with INVALID_ARGUMENT", async () => {
    for (const options of [
      { limit: 0 },
      { limit: 501 },
      { limit: 1.5 },
      { status: "running" as never },
      { cursor: "nope!" },
      { cursor: "x".repeat(200) },
    ]) {
      const error = await h.runner.listJobs(options).catch((e: unknown) => e);
      expect(error, JSON.stringify(options)).toBeInstanceOf(RunnerDepotError);
      expect((error as RunnerDepotError).code).toBe("INVALID_ARGUMENT");
    }
    const forged = Buffer.from("2026-01-01T00:00:00.000Z|not-a-uuid").toString("base64url");
    expect(() => decodeJobCursor(forged)).toThrow(/cursor/);
  });
});

describe("RunnerService.listJobs: a store without list", () => {
  it("answers FAILED_PRECONDITION", async () => {
    const { list: _drop, ...rest } = createMemoryLogStore();
    const runner = createRunnerService(createMemoryQueue(), { logs: rest });
    try {
      await expect(runner.listJobs()).rejects.toMatchObject({ code: "FAILED_PRECONDITION" });
    } finally {
      await runner.close();
    }
  });
});
