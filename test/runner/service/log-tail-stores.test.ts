/**
 * The tail kept (issue 24, item 1), through a real server (startRunnerServer, gRPC over a real HTTP/2 socket) on
 * the memory, fs and PostgreSQL stores and the archive (fs, S3 on s3rver): a 100 MiB job under a 1 MiB limit keeps
 * its last line, FATAL, and the console's raw download ends with it and holds exactly one drop marker whose counts
 * are the lines and bytes missing between head and tail. A call cut and resumed past the limit stores every line
 * once (no duplicate, none lost) in head + tail.
 */
import { randomUUID } from "node:crypto";
import { mkdtemp, readdir, rm, stat } from "node:fs/promises";
import http from "node:http";
import type * as http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { toNodeHandler } from "srvx/node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createMemoryQueue } from "../../../src/adapters/memory/index.js";
import { createMemoryLogStore } from "../../../src/adapters/memory/log-store.js";
import { createFsLogArchive, createFsLogStore } from "../../../src/adapters/fs/index.js";
import { createPostgresLogStore } from "../../../src/adapters/postgres/index.js";
import { createS3LogArchive } from "../../../src/adapters/s3/log-archive.js";
import { createArchivingLogStore, type ArchivingLogStore } from "../../../src/runner/archive/archiving-store.js";
import { createConsole } from "../../../src/console/index.js";
import { createRunnerService, startRunnerServer, type RunnerService } from "../../../src/runner/index.js";
import type { JobLogStore } from "../../../src/runner/ports.js";
import { LINE_RECORD_OVERHEAD } from "../../../src/runner/service/log-cap.js";
import { connect, frame, openCall, type Status } from "../../fixtures/runner-raw-calls.js";
import { end, line } from "../../fixtures/runner-service.js";
import { createTestSchema, needs, startS3, type S3Fixture } from "../../fixtures/backends.js";

const MiB = 1024 * 1024;
/** The limit: 1 MiB, so the tail is 256 KiB and the head 768 KiB. */
const LIMIT = MiB;
/** Bytes of each line sent (1,016 counted), and how many make 100 MiB. */
const LINE = 1000;
const LINES = Math.ceil((100 * MiB) / LINE);
const FATAL = "FATAL: the build failed (exit 1)";

const haveDatabase = needs("postgres");
let db: Awaited<ReturnType<typeof createTestSchema>> | undefined;
let s3: S3Fixture | undefined;
let scratch: string;

beforeAll(async () => {
  scratch = await mkdtemp(join(tmpdir(), "runner-depot-tail-"));
  if (haveDatabase) db = await createTestSchema();
  s3 = await startS3();
}, 60_000);
afterAll(async () => {
  await db?.drop();
  await s3?.close();
  await rm(scratch, { recursive: true, force: true });
});

/** Line `i` of the job: its number first, padded to LINE bytes. */
function text(i: number): string {
  const head = `line ${i} `;
  return head + ".".repeat(LINE - head.length);
}

/** Frames of lines `from` … `to - 1`, then FATAL when `fatal`. */
function* frames(id: string, from: number, to: number, fatal: boolean): Iterable<Buffer> {
  for (let i = from; i < to; i++) yield frame(line(id, text(i)));
  if (fatal) yield frame(line(id, FATAL, true));
}

/**
 * Writes `items` to a raw gRPC call (offset `offset`) in 1 MiB blocks, honouring back-pressure; then the end item and
 * the end of the stream, or (with `cut`) a reset of the stream. Its status.
 */
async function stream(
  url: string,
  id: string,
  items: Iterable<Buffer>,
  options: { offset?: number; end?: boolean; cut?: boolean; progress?: () => Promise<void> } = {},
): Promise<Status> {
  const session = connect(url);
  try {
    const call = openCall(session, "grpc", "any", { "runner-offset": String(options.offset ?? 0) });
    const block: Buffer[] = [];
    let size = 0;
    const flush = async (s: http2.ClientHttp2Stream) => {
      if (!s.write(Buffer.concat(block))) await new Promise((resolve) => s.once("drain", resolve));
      block.length = 0;
      size = 0;
    };
    for (const f of items) {
      block.push(f);
      size += f.length;
      if (size >= MiB) await flush(call.stream);
    }
    if (options.end !== false) block.push(frame(end(id, 1)));
    await flush(call.stream);
    if (options.cut) {
      // Once the server has stored some of it, the connection drops: what the server stored is all the next call can
      // count on (some or all of what was sent).
      await options.progress?.();
      session.destroy();
      return await call.status;
    }
    call.stream.end();
    return await call.status;
  } finally {
    session.close();
  }
}

/** The console's raw download of a job, over real HTTP. */
async function rawDownload(runner: RunnerService, id: string): Promise<string> {
  const web = createConsole({ runner });
  const server = http.createServer(
    toNodeHandler((request: Request) => web.fetch(request)) as unknown as http.RequestListener,
  );
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  try {
    const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    const response = await fetch(`${base}/api/jobs/${id}/raw`);
    expect(response.status).toBe(200);
    return await response.text();
  } finally {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  }
}

/**
 * Checks a raw log: head lines 0…h−1, one marker whose counts are exactly the lines (and their bytes) missing
 * before the tail, then tail lines t…LINES−1 in order, then FATAL last. Returns the head and tail line counts.
 */
function checkHeadMarkerTail(raw: string, fatal = true): { head: number; tail: number; dropped: number } {
  const lines = raw.split("\n");
  expect(lines.pop()).toBe("");
  if (fatal) expect(lines.at(-1)).toBe(FATAL);
  const markers = lines.flatMap((l, i) => (l.startsWith("[runner-depot] log cut:") ? [i] : []));
  expect(markers).toHaveLength(1);
  const at = markers[0]!;
  const numberOf = (l: string) => Number(/^line (\d+) /.exec(l)![1]);
  const head = lines.slice(0, at);
  head.forEach((l, i) => expect(numberOf(l)).toBe(i));
  const tail = lines.slice(at + 1, fatal ? -1 : undefined);
  const first = numberOf(tail[0]!);
  tail.forEach((l, k) => expect(numberOf(l)).toBe(first + k));
  const [, count, bytes] = /log cut: (\d+) lines \((\d+) bytes\) dropped/.exec(lines[at]!)!;
  // The marker counts what is missing: every line between the head's last and the tail's first.
  expect(Number(count)).toBe(first - head.length);
  expect(Number(bytes)).toBe((first - head.length) * (LINE + LINE_RECORD_OVERHEAD));
  return { head: head.length, tail: tail.length, dropped: Number(count) };
}

interface Case {
  name: string;
  needs?: "postgres";
  make(): Promise<{ logs: JobLogStore; archive?: ArchivingLogStore; held(id: string): Promise<number | null> }>;
}

/** Bytes of the fs store's files for job `id` (its head log and tail segments). */
async function fsBytes(dir: string, id: string): Promise<number> {
  let total = 0;
  for (const name of await readdir(join(dir, "jobs")))
    if (name.startsWith(id) && !name.endsWith(".json")) total += (await stat(join(dir, "jobs", name))).size;
  return total;
}

async function pgBytes(id: string): Promise<number> {
  const rows = await db!.pool.query(
    `SELECT COALESCE(sum(octet_length(bytes)), 0)::int AS n FROM "${db!.schema}".job_chunks WHERE request_id = $1`,
    [id],
  );
  return rows.rows[0].n as number;
}

const cases: Case[] = [
  { name: "memory", make: async () => ({ logs: createMemoryLogStore(), held: async () => null }) },
  {
    name: "fs",
    make: async () => {
      const dir = await mkdtemp(join(scratch, "fs-"));
      return { logs: createFsLogStore(dir, { fsync: false }), held: (id) => fsBytes(dir, id) };
    },
  },
  {
    name: "PostgreSQL",
    needs: "postgres",
    make: async () => ({ logs: createPostgresLogStore({ schema: db!.schema, pool: db!.pool }), held: pgBytes }),
  },
  {
    name: "fs + fs archive",
    make: async () => {
      const dir = await mkdtemp(join(scratch, "fsa-"));
      const archive = createArchivingLogStore(createFsLogStore(join(dir, "live"), { fsync: false }), {
        archive: createFsLogArchive(join(dir, "archive"), { fsync: false }),
      });
      return { logs: archive, archive, held: (id) => fsBytes(join(dir, "live"), id) };
    },
  },
  {
    name: "PostgreSQL + S3 archive",
    needs: "postgres",
    make: async () => {
      const archive = createArchivingLogStore(createPostgresLogStore({ schema: db!.schema, pool: db!.pool }), {
        archive: createS3LogArchive({ bucket: s3!.bucket, prefix: "tail/", client: s3!.client }),
      });
      return { logs: archive, archive, held: pgBytes };
    },
  },
];

describe.each(cases)("the tail kept on the $name store", (c) => {
  it("a 100 MiB job under a 1 MiB limit keeps its last line, FATAL; the raw download holds one marker with the right counts", async (ctx) => {
    if (c.needs === "postgres" && !haveDatabase) ctx.skip();
    const { logs, archive, held } = await c.make();
    const runner = createRunnerService(createMemoryQueue(), { logs, limits: { jobLogBytes: LIMIT } });
    const server = await startRunnerServer(runner, { host: "127.0.0.1", port: 0 });
    try {
      const id = randomUUID();
      const status = await stream(server.url, id, frames(id, 0, LINES, true));
      expect(status).toMatchObject({ code: 0, committed: String(LINES + 2) });
      let state = (await logs.get(id))!;
      expect(state).toMatchObject({ status: "finished", logTruncated: true, lines: { stdout: LINES, stderr: 1 } });
      expect(state.result).toMatchObject({ logTruncated: true, exitCode: 1 });
      const cut = state.cut!;
      // The head fills its 768 KiB share; the tail keeps 7/8 to all of its 256 KiB.
      const cost = LINE + LINE_RECORD_OVERHEAD;
      expect(cut.at).toBe(Math.floor((LIMIT * 3) / 4 / cost));
      const tailKept = cut.segments.reduce((sum, s) => sum + s.bytes, 0);
      expect(tailKept).toBeLessThanOrEqual(LIMIT / 4);
      expect(tailKept).toBeGreaterThanOrEqual((LIMIT / 4) * (7 / 8) - cost);
      // What the store holds is bounded by the limit, whatever was sent: plus, on fs, the ring's free part, which
      // holds one append (at most the tail) and a segment (docs/decisions/log-tail.md, "fs: one ring file a job").
      const bytes = await held(id);
      const ringFree = c.name.startsWith("fs") ? LIMIT / 4 + LIMIT / 32 : 0;
      if (bytes !== null) expect(bytes).toBeLessThanOrEqual(LIMIT + 64 * 1024 + ringFree);
      if (archive) {
        state = (await archive.archiveJob(id))!;
        expect(state.archived).toMatchObject({ lines: state.storedLines - cut.lines, cut: { at: cut.at } });
        expect(state.archived!.rawBytes).toBeLessThanOrEqual(LIMIT + 64 * 1024);
        expect(await held(id)).toBe(0);
      }
      const raw = await rawDownload(runner, id);
      const shape = checkHeadMarkerTail(raw);
      expect(shape).toMatchObject({ head: cut.at, dropped: cut.lines });
      expect(shape.head + 1 + shape.dropped + shape.tail + 1).toBe(state.storedLines);
      // A read by position from inside the dropped range: the marker, standing for the rest of it, then the tail.
      const inside = await logs.read(id, cut.at + 10, 2);
      expect(inside[0]).toMatchObject({ marker: true, skipped: cut.lines - 10 });
      expect(inside[1]!.line).toBe(text(cut.at + cut.lines));
    } finally {
      await server.close();
      await runner.close();
      await logs.close?.();
    }
  }, 600_000);
});

describe.each(cases.filter((c) => !c.name.includes("archive")))("exactly once across cuts on the $name store", (c) => {
  it("a call cut past the limit and resumed from an earlier offset: every line once in head + tail, none lost", async (ctx) => {
    if (c.needs === "postgres" && !haveDatabase) ctx.skip();
    const { logs } = await c.make();
    // 64 KiB: a 48 KiB head (48 lines), a 16 KiB tail (16 lines of 1,016 counted), segments of 2 KiB.
    const runner = createRunnerService(createMemoryQueue(), { logs, limits: { jobLogBytes: 64 * 1024 } });
    const server = await startRunnerServer(runner, { host: "127.0.0.1", port: 0 });
    try {
      const id = randomUUID();
      const total = 400;
      // Three calls, each cut by a dropped connection; each resumes 10 items before what the store counts.
      for (const to of [30, 150, 320]) {
        const before = (await logs.get(id))?.committed ?? 0;
        const from = Math.max(0, before - 10);
        const progress = async () => {
          for (let i = 0; i < 2000 && ((await logs.get(id))?.committed ?? 0) <= before; i++)
            await new Promise((resolve) => setTimeout(resolve, 5));
        };
        await stream(server.url, id, frames(id, from, to, false), { offset: from, end: false, cut: true, progress });
        // Never more than was sent: the resent overlap is skipped, not stored again.
        expect((await logs.get(id))!.committed).toBeLessThanOrEqual(to);
      }
      const resumeAt = (await logs.get(id))!.committed;
      expect(resumeAt).toBeGreaterThan(48);
      const status = await stream(server.url, id, frames(id, resumeAt - 5, total, true), { offset: resumeAt - 5 });
      expect(status).toMatchObject({ code: 0, committed: String(total + 2) });
      const state = (await logs.get(id))!;
      expect(state.lines).toEqual({ stdout: total, stderr: 1 });
      const raw = await rawDownload(runner, id);
      const shape = checkHeadMarkerTail(raw);
      // Every line counted once: head + dropped + tail + FATAL is what was sent.
      expect(shape.head + shape.dropped + shape.tail).toBe(total);
      expect(shape.head).toBe(Math.floor((48 * 1024) / (LINE + LINE_RECORD_OVERHEAD)));
    } finally {
      await server.close();
      await runner.close();
      await logs.close?.();
    }
  }, 120_000);
});
