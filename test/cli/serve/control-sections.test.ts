/**
 * Sections through the control API and follow() (docs/decisions/log-sections.md): a job's lines go from the agent's
 * own client over gRPC into a real runner server on the fs store; `GET /-/jobs/<id>/sections` and
 * `GET /-/jobs/<id>/log?section=<name>` answer over real HTTP; `follow(id, { sections: true })` yields each event
 * right after its marker's line, from the start or from the middle. A section name holding a secret the service
 * knows is stored masked: the markers are read after masking.
 */
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { randomUUID } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createFsLogStore } from "../../../src/adapters/fs/index.js";
import { createMemoryQueue } from "../../../src/adapters/memory/index.js";
import {
  createRunnerClient,
  createRunnerService,
  startRunnerServer,
  type RunnerServer,
  type RunnerService,
} from "../../../src/runner/index.js";
import type { LogSectionEvent, StoredLine } from "../../../src/runner/ports.js";
import { serveControlApi } from "../../fixtures/control-http.js";

const SECRET = "hunter2-s3cr3t-value";
const LINES = [
  "before",
  "\x1b[0Ksection_start:1700000000:build\r\x1b[0KBuild",
  "compiling",
  `\x1b[0Ksection_start:1700000001:deploy-${SECRET}\r\x1b[0KDeploy`,
  "pushing",
  `\x1b[0Ksection_end:1700000005:deploy-${SECRET}\r\x1b[0K`,
  "\x1b[0Ksection_end:1700000009:build\r\x1b[0K",
  "::group::Tests",
  "ok 1",
  "not ok 2",
];

async function get(url: string): Promise<{ status: number; text: string }> {
  const response = await fetch(url, { headers: { authorization: "Bearer admin" } });
  return { status: response.status, text: await response.text() };
}

describe("sections through the control API and follow()", () => {
  let dir: string;
  let runner: RunnerService;
  let runnerServer: RunnerServer;
  let server: Awaited<ReturnType<typeof serveControlApi>>;
  const id = randomUUID();

  beforeAll(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), "control-sections-"));
    runner = createRunnerService(createMemoryQueue(), { logs: createFsLogStore(dir, { fsync: false }) });
    runnerServer = await startRunnerServer(runner, { host: "127.0.0.1", port: 0 });
    server = await serveControlApi({ runner, logs: runner.logs, runnerUrl: runnerServer.url });
    // The agent is not told the secret: the service masks it on arrival, before the store reads markers.
    await runner.expectJob(id, { secrets: [SECRET] });
    const client = createRunnerClient({ endpoint: runnerServer.url, requestId: id });
    for (const line of LINES) client.log(line, false);
    await client.end({ exitCode: 1, success: false });
    await client.close();
  });

  afterAll(async () => {
    await server?.close();
    await runnerServer?.close();
    await runner?.close();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  it("GET /-/jobs/<id>/sections answers the record, the secret masked in a name", async () => {
    const { status, text } = await get(`${server.url}/-/jobs/${id}/sections`);
    expect(status).toBe(200);
    expect(text).not.toContain(SECRET);
    const body = JSON.parse(text);
    expect(body).toMatchObject({ storedLines: 10, status: "finished", exitCode: 1, dropped: 0, unmatched: 0 });
    expect(
      body.sections.map((s: { name: string; start: number; end: number | null; depth: number }) => [
        s.name,
        s.start,
        s.end,
        s.depth,
      ]),
    ).toEqual([
      ["build", 1, 6, 0],
      [expect.stringMatching(/^deploy-(?!.*hunter2)/), 3, 5, 1],
      ["Tests", 7, null, 0],
    ]);
    expect(body.sections[0]).toMatchObject({ startTime: 1_700_000_000_000, endTime: 1_700_000_009_000 });
    expect((await get(`${server.url}/-/jobs/${randomUUID()}/sections`)).status).toBe(404);
    expect((await get(`${server.url}/-/jobs/nope/sections`)).status).toBe(400);
  });

  it("GET /-/jobs/<id>/log?section= streams only that section; unknown, too long or with ?follow is refused", async () => {
    const { status, text } = await get(`${server.url}/-/jobs/${id}/log?section=build`);
    expect(status).toBe(200);
    const rows = text
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l));
    const lines = rows.filter((r) => "line" in r).map((r) => r.line as string);
    expect(lines).toHaveLength(6);
    expect(lines[0]).toBe(LINES[1]);
    expect(lines[1]).toBe("compiling");
    expect(lines[5]).toBe(LINES[6]);
    expect(rows.at(-1)).toMatchObject({ result: { exitCode: 1 } });
    // A section still open at the end runs to the last line.
    const open = await get(`${server.url}/-/jobs/${id}/log?section=Tests`);
    expect(
      open.text
        .trim()
        .split("\n")
        .filter((l) => l.includes('"line"'))
        .map((l) => JSON.parse(l).line),
    ).toEqual(LINES.slice(7));
    expect((await get(`${server.url}/-/jobs/${id}/log?section=nope`)).status).toBe(404);
    expect((await get(`${server.url}/-/jobs/${id}/log?section=${"x".repeat(300)}`)).status).toBe(400);
    expect((await get(`${server.url}/-/jobs/${id}/log?section=build&follow`)).status).toBe(400);
  });

  it("answers 400, never 500, to a job ID with a malformed percent-escape on every job route", async () => {
    for (const route of ["log", "sections", "search?q=x"]) {
      const answer = await get(`${server.url}/-/jobs/%E0%A4%A/${route}`);
      expect([route, answer.status]).toEqual([route, 400]);
      expect(answer.text).toContain("not a request ID");
    }
  });

  it("follow(id, { sections: true }) yields each event right after its line, from the start or the middle", async () => {
    const seen = async (from: number) => {
      const out: Array<string | [string, string, number]> = [];
      for await (const item of runner.follow(id, { from, sections: true })) {
        if ("section" in item) {
          const e = item as LogSectionEvent;
          out.push([e.section, e.name.startsWith("deploy-") ? "deploy" : e.name, e.position]);
        } else out.push((item as StoredLine).line);
      }
      return out;
    };
    expect(await seen(0)).toEqual([
      LINES[0],
      LINES[1]!,
      ["start", "build", 1],
      LINES[2],
      expect.stringMatching(/^\x1b\[0Ksection_start:1700000001:deploy-/),
      ["start", "deploy", 3],
      LINES[4],
      expect.any(String),
      ["end", "deploy", 5],
      LINES[6],
      ["end", "build", 6],
      LINES[7],
      ["start", "Tests", 7],
      LINES[8],
      LINES[9],
    ]);
    // From line 4 (inside both): only what comes after, and the ends close what began before.
    expect(await seen(4)).toEqual([
      LINES[4],
      expect.any(String),
      ["end", "deploy", 5],
      LINES[6],
      ["end", "build", 6],
      LINES[7],
      ["start", "Tests", 7],
      LINES[8],
      LINES[9],
    ]);
    // Plain follow is unchanged: lines only.
    const plain: string[] = [];
    for await (const line of runner.follow(id)) plain.push(line.line);
    expect(plain).toHaveLength(10);
  });
});
