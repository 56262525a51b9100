/**
 * The job-log cap bounds what each store really holds (issue 31, item 8), through a real gRPC
 * socket on the memory, fs and PostgreSQL stores and the archive: a million empty lines are
 * truncated at the bound (they used to count 0 bytes and were all stored), and control
 * characters, which the fs store escapes to 6 bytes each, stay within the cap on disk.
 */
import { randomUUID } from "node:crypto";
import { mkdtemp, readdir, rm, stat } from "node:fs/promises";
import type * as http2 from "node:http2";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createMemoryQueue } from "../../../src/adapters/memory/index.js";
import { createMemoryLogStore } from "../../../src/adapters/memory/log-store.js";
import { createFsLogArchive, createFsLogStore } from "../../../src/adapters/fs/index.js";
import { createPostgresLogStore } from "../../../src/adapters/postgres/index.js";
import { createArchivingLogStore } from "../../../src/runner/archive/archiving-store.js";
import { createRunnerService, startRunnerServer } from "../../../src/runner/index.js";
import type { JobLogStore } from "../../../src/runner/ports.js";
import { LINE_RECORD_OVERHEAD } from "../../../src/runner/service/log-cap.js";
import { connect, frame, openCall, type Status } from "../../fixtures/runner-raw-calls.js";
import { end, line } from "../../fixtures/runner-service.js";
import { createTestSchema, needs } from "../../fixtures/backends.js";

/** The cap of these tests: small, so a million lines are far past it. */
const CAP = 256 * 1024;
/** Empty lines sent in one job: what the cap used to let through whole. */
const EMPTY_LINES = 1_000_000;

const haveDatabase = needs("postgres");
let db: Awaited<ReturnType<typeof createTestSchema>> | undefined;
let scratch: string;

beforeAll(async () => {
  scratch = await mkdtemp(join(tmpdir(), "runner-depot-cap-"));
  if (haveDatabase) db = await createTestSchema();
});
afterAll(async () => {
  await db?.drop();
  await rm(scratch, { recursive: true, force: true });
});

/** Writes `frames` to a raw gRPC call in blocks (honouring back-pressure), then ends it; its status. */
async function stream(url: string, requestId: string, frames: Iterable<Buffer>): Promise<Status> {
  const session = connect(url);
  try {
    const call = openCall(session, "grpc", "any");
    const block: Buffer[] = [];
    let size = 0;
    const flush = async (s: http2.ClientHttp2Stream) => {
      if (!s.write(Buffer.concat(block))) await new Promise((resolve) => s.once("drain", resolve));
      block.length = 0;
      size = 0;
    };
    for (const f of frames) {
      block.push(f);
      size += f.length;
      if (size >= 1 << 20) await flush(call.stream);
    }
    block.push(frame(end(requestId, 0)));
    await flush(call.stream);
    call.stream.end();
    return await call.status;
  } finally {
    session.close();
  }
}

function* repeat(buf: Buffer, n: number): Iterable<Buffer> {
  for (let i = 0; i < n; i++) yield buf;
}

interface Case {
  name: string;
  make(): Promise<JobLogStore | null>;
}

const cases: Case[] = [
  { name: "memory", make: async () => createMemoryLogStore() },
  { name: "fs", make: async () => createFsLogStore(await mkdtemp(join(scratch, "fs-")), { fsync: false }) },
  {
    name: "PostgreSQL",
    make: async () => (db ? createPostgresLogStore({ schema: db.schema, pool: db.pool }) : null),
  },
];

describe.each(cases)("the job-log cap on the $name store", ({ name, make }) => {
  it(`a million empty lines are truncated at the cap: each line counts ${LINE_RECORD_OVERHEAD} bytes`, async (ctx) => {
    if (name === "PostgreSQL" && !haveDatabase) ctx.skip();
    const logs = (await make())!;
    const runner = createRunnerService(createMemoryQueue(), { logs, limits: { jobLogBytes: CAP, tailBytes: 0 } });
    const server = await startRunnerServer(runner, { host: "127.0.0.1", port: 0 });
    try {
      const id = randomUUID();
      const status = await stream(server.url, id, repeat(frame(line(id, "")), EMPTY_LINES));
      expect(status).toMatchObject({ code: 0, committed: String(EMPTY_LINES + 1) });
      const state = (await runner.logs.get(id))!;
      const fit = Math.floor(CAP / LINE_RECORD_OVERHEAD);
      // Before: 1,000,000 lines stored, storedBytes 0, logTruncated false.
      expect(state).toMatchObject({
        status: "finished",
        logTruncated: true,
        storedLines: fit + 1,
        storedBytes: fit * LINE_RECORD_OVERHEAD,
        lines: { stdout: EMPTY_LINES, stderr: 0 },
      });
      const tail = await runner.logs.read(id, fit - 1, 2);
      expect(tail[0]).toMatchObject({ line: "", stderr: false });
      expect(tail[1]).toMatchObject({ marker: true });
    } finally {
      await server.close();
      await runner.close();
      await logs.close?.();
    }
  }, 180_000);
});

describe("the job-log cap on the fs store's disk and in its archive", () => {
  it("lines of control characters (6 bytes each once escaped) stay within the cap on disk", async () => {
    const dir = await mkdtemp(join(scratch, "fs-ctl-"));
    const logs = createFsLogStore(dir, { fsync: false });
    const runner = createRunnerService(createMemoryQueue(), { logs, limits: { jobLogBytes: CAP, tailBytes: 0 } });
    const server = await startRunnerServer(runner, { host: "127.0.0.1", port: 0 });
    try {
      const id = randomUUID();
      // 1,000 bytes a line, 6,000 + 4 once escaped; 2 MB sent against a 256 KiB cap.
      const text = "\u0001".repeat(1000);
      const status = await stream(server.url, id, repeat(frame(line(id, text)), 2000));
      expect(status).toMatchObject({ code: 0, committed: "2001" });
      const state = (await runner.logs.get(id))!;
      expect(state.logTruncated).toBe(true);
      expect(state.storedBytes).toBeLessThanOrEqual(CAP);
      // The job's log file: its records are within the cap, plus the one cap marker's record.
      const onDisk = await jobLogBytes(dir, id);
      const marker = (await runner.logs.read(id, state.storedLines - 1, 1))[0]!;
      // Before: 1,048 lines kept (counted 1,000 bytes each), 6.3 MB on disk for a 256 KiB cap.
      expect(onDisk).toBeLessThanOrEqual(CAP + Buffer.byteLength(JSON.stringify(marker.line)) + 2);
      expect(onDisk).toBeGreaterThan(CAP * 0.9);
      expect(state.storedLines - 1).toBe(Math.floor(CAP / (LINE_RECORD_OVERHEAD + 6000)));
    } finally {
      await server.close();
      await runner.close();
      await logs.close?.();
    }
  }, 120_000);

  it("an archived capped log holds no more than the cap (its records before compression)", async () => {
    const dir = await mkdtemp(join(scratch, "fs-arch-"));
    const logs = createArchivingLogStore(createFsLogStore(join(dir, "live"), { fsync: false }), {
      archive: createFsLogArchive(join(dir, "archive"), { fsync: false }),
    });
    const runner = createRunnerService(createMemoryQueue(), { logs, limits: { jobLogBytes: CAP, tailBytes: 0 } });
    const server = await startRunnerServer(runner, { host: "127.0.0.1", port: 0 });
    try {
      const id = randomUUID();
      const status = await stream(server.url, id, repeat(frame(line(id, "")), 100_000));
      expect(status).toMatchObject({ code: 0 });
      const state = (await logs.archiveJob(id))!;
      expect(state.archived).toBeDefined();
      // The cap marker's record (under 200 bytes) is the only thing past the cap.
      expect(state.archived!.rawBytes).toBeLessThanOrEqual(CAP + 200);
      expect(state.archived!.lines).toBe(Math.floor(CAP / LINE_RECORD_OVERHEAD) + 1);
    } finally {
      await server.close();
      await runner.close();
      await logs.close();
    }
  }, 120_000);
});

/** Bytes of the fs store's files for job `id` (its log records). */
async function jobLogBytes(dir: string, id: string): Promise<number> {
  let total = 0;
  for (const name of await readdir(join(dir, "jobs"))) {
    if (name.startsWith(id) && name.endsWith(".log")) total += (await stat(join(dir, "jobs", name))).size;
  }
  return total;
}
