/**
 * Log archiving on real backends: a job streamed over gRPC into the PostgreSQL log store
 * moves to S3 (s3rver) at its end as one compressed, indexed object; follow() and the
 * store's windows and the console over HTTP give the same lines as before, its rows leave PostgreSQL, a tail costs
 * Range reads; the fs pair (the embedded default) survives a restart; a job whose archiving
 * was missed is swept; retention removes object and job together.
 */
import { randomUUID } from "node:crypto";
import { mkdtemp, readdir, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { HeadObjectCommand } from "@aws-sdk/client-s3";
import { createMemoryQueue } from "../../../src/adapters/memory/index.js";
import { createPostgresLogStore } from "../../../src/adapters/postgres/index.js";
import { createFsLogStore } from "../../../src/adapters/fs/index.js";
import { createFsLogArchive } from "../../../src/adapters/fs/log-archive.js";
import { createS3LogArchive } from "../../../src/adapters/s3/log-archive.js";
import { createRunnerService, startRunnerServer } from "../../../src/runner/index.js";
import { createRunnerClient } from "../../../src/runner/client/runner-client.js";
import {
  archiveKey,
  createArchivingLogStore,
  type ArchivingLogStore,
} from "../../../src/runner/archive/archiving-store.js";
import type { JobLogStore, LogArchiveStore, StoredLine } from "../../../src/runner/ports.js";
import { READS_LINE_ENTRIES } from "../../../src/runner/protocol/received-line.js";
import { collectAll, sampleJobResult, logEntry } from "../../../src/testing/helpers.js";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { toNodeHandler } from "srvx/node";
import { createConsole } from "../../../src/console/index.js";
import { createTestSchema, needs, startS3, type S3Fixture } from "../../fixtures/backends.js";

const hasPostgres = needs("postgres");

async function until(check: () => boolean | Promise<boolean>, what: string): Promise<void> {
  for (let i = 0; i < 1200; i++) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`timed out waiting for ${what}`);
}

/**
 * The live log file goes after the state says "archived" (the fs store writes the state first, then
 * removes the file), so a reader can see the one before the other: wait for the file, bounded by until's.
 */
async function untilLiveLogGone(dir: string, id: string): Promise<void> {
  await until(
    async () => !(await readdir(join(dir, "logs", "jobs"))).includes(`${id}.log`),
    "the live log file to be removed",
  );
}

/** Text of line i: varied lengths and characters so chunks compress like real output. */
const textOf = (i: number) => `step ${i} ${"é∂".repeat(i % 7)} ${"x".repeat((i * 37) % 300)} done`;

/** Streams `count` lines (every 5th to stderr) and one 70 KiB line through a real gRPC call, then ends. */
async function streamJob(url: string, requestId: string, count: number): Promise<void> {
  const client = createRunnerClient({ endpoint: url, requestId });
  try {
    for (let i = 0; i < count; i++) {
      client.log(textOf(i), i % 5 === 0);
      if (i === 100) client.log("L".repeat(70 * 1024));
    }
    await client.end({ exitCode: 0, success: true });
  } finally {
    await client.close();
  }
}

/** Reads a job's whole log through `read` windows of `size` (and `maxBytes`, each page checked against it). */
async function windows(logs: JobLogStore, id: string, size: number, maxBytes?: number): Promise<StoredLine[]> {
  const out: StoredLine[] = [];
  for (;;) {
    const page = await logs.read(id, out.length, size, maxBytes === undefined ? undefined : { maxBytes });
    if (page.length === 0) return out;
    if (maxBytes !== undefined && page.length > 1)
      expect(page.reduce((n, l) => n + l.line.length, 0)).toBeLessThanOrEqual(maxBytes);
    out.push(...page);
  }
}

/** A LogArchiveStore in a Map (the object's bytes by key), for tests of what the archiver reads and writes. */
function inMemoryArchive(): { objects: Map<string, Buffer>; archive: LogArchiveStore } {
  const objects = new Map<string, Buffer>();
  const archive: LogArchiveStore = {
    async put(key, body) {
      const parts: Buffer[] = [];
      for await (const part of body) parts.push(Buffer.from(part));
      objects.set(key, Buffer.concat(parts));
    },
    async read(key, start, end) {
      return objects.get(key)?.subarray(start, end) ?? null;
    },
    async delete(key) {
      objects.delete(key);
    },
  };
  return { objects, archive };
}

/** Counts the archive's reads (and their bytes), to show a tail is a few Range reads. */
function counting(archive: LogArchiveStore) {
  const stats = { reads: 0, bytes: 0 };
  const wrapped: LogArchiveStore = {
    ...archive,
    put: (key, body) => archive.put(key, body),
    async read(key, start, end) {
      stats.reads++;
      stats.bytes += end - start;
      return archive.read(key, start, end);
    },
    delete: (key) => archive.delete(key),
    prune: archive.prune && ((before) => archive.prune!(before)),
  };
  return { wrapped, stats };
}

describe("log archive: PostgreSQL log store → S3 (s3rver)", () => {
  let s3: S3Fixture;
  let db: Awaited<ReturnType<typeof createTestSchema>>;
  beforeAll(async () => {
    if (!hasPostgres) return;
    s3 = await startS3();
    db = await createTestSchema();
  });
  afterAll(async () => {
    if (!hasPostgres) return;
    await db.drop();
    await s3.close();
  });

  it("a finished job moves to one object: follow() yields the same lines, the rows leave PostgreSQL, a tail is Range reads", async () => {
    const { wrapped: archive, stats } = counting(
      createS3LogArchive({ bucket: s3.bucket, prefix: "logs/", client: s3.client }),
    );
    const live = createPostgresLogStore({ pool: db.pool, schema: db.schema });
    const logs = createArchivingLogStore(live, { archive });
    // It hands entries through to this package's store, so it keeps that store's mark (runner/protocol/received-line.ts).
    expect((logs as { [READS_LINE_ENTRIES]?: boolean })[READS_LINE_ENTRIES]).toBe(true);
    const runner = createRunnerService(createMemoryQueue(), { logs });
    const server = await startRunnerServer(runner, { port: 0 });
    const id = randomUUID();
    try {
      // A follower from the start sees the job live, from PostgreSQL.
      const liveFollow = collectAll(runner.follow(id));
      await streamJob(server.url, id, 20_000);
      const followed = await liveFollow;
      expect(followed).toHaveLength(20_002);
      // The client sends the 70 KiB line in two parts (its own split, under the line limit).
      expect(
        followed
          .filter((l) => l.line.startsWith("LLLL"))
          .map((l) => l.line.length)
          .reduce((a, b) => a + b),
      ).toBe(70 * 1024);
      expect(followed.filter((l) => l.stderr)).toHaveLength(4_000);
      // Every line has the client's stamp, so the comparisons below hold the times too (PostgreSQL → S3 object).
      expect(followed.every((l) => l.time! > 0 && l.serverTime === undefined)).toBe(true);

      await until(async () => (await logs.get(id))?.archived !== undefined, "the job to be archived");
      const state = (await logs.get(id))!;
      expect(state.archived).toMatchObject({ lines: 20_002 });
      for (const table of ["job_lines", "job_chunks"]) {
        const rows = await db.pool.query(
          `SELECT count(*)::int AS n FROM "${db.schema}".${table} WHERE request_id = $1`,
          [id],
        );
        expect(rows.rows[0].n).toBe(0);
      }
      const head = await s3.client.send(new HeadObjectCommand({ Bucket: s3.bucket, Key: `logs/${archiveKey(id)}` }));
      expect(head.ContentLength).toBe(state.archived!.bytes);
      expect(state.archived!.bytes).toBeLessThan(state.archived!.rawBytes / 2);

      // The same lines through follow() (an ended job: to its end, then done) and windows.
      expect(await collectAll(runner.follow(id))).toEqual(followed);
      expect(await windows(logs, id, 777)).toEqual(followed);

      // The console (over real HTTP) reads the archived job through the runner: a window, the raw log.
      const web = createConsole({ runner });
      const console_ = http.createServer(
        toNodeHandler((request: Request) => web.fetch(request)) as unknown as http.RequestListener,
      );
      await new Promise<void>((resolve) => console_.listen(0, "127.0.0.1", resolve));
      try {
        const base = `http://127.0.0.1:${(console_.address() as AddressInfo).port}`;
        const window = (await (await fetch(`${base}/api/jobs/${id}/lines?from=19990&limit=5`)).json()) as {
          lines: Array<[string, number]>;
        };
        expect(window.lines.map(([text]) => text)).toEqual(followed.slice(19_990, 19_995).map((l) => l.line));
        const raw = await (await fetch(`${base}/api/jobs/${id}/raw`)).text();
        expect(raw).toBe(followed.map((l) => `${l.line}\n`).join(""));
      } finally {
        console_.closeAllConnections();
        await new Promise((resolve) => console_.close(resolve));
      }

      // The tail: the index and one chunk, nothing else.
      const fresh = createArchivingLogStore(createPostgresLogStore({ pool: db.pool, schema: db.schema }), { archive });
      stats.reads = 0;
      stats.bytes = 0;
      const tail = await fresh.read(id, 20_002 - 10, 100);
      expect(tail).toEqual(followed.slice(-10));
      expect(stats.reads).toBe(2);
      expect(stats.bytes).toBeLessThan(state.archived!.bytes / 4);
      await fresh.close();
    } finally {
      await server.close();
      await runner.close();
      await logs.close();
    }
  });

  it("stored bytes move as they are (readRaw): the object is byte for byte the one built from decoded lines", async () => {
    const { objects, archive: memoryArchive } = inMemoryArchive();
    // Lines of 0–800 bytes, non-ASCII, stderr and markers: several 256 KiB chunks close
    // within one 2,048-line read page, so several are compressed at once.
    const lines: StoredLine[] = Array.from({ length: 6_000 }, (_, i) => ({
      line: i % 500 === 0 ? "" : `${textOf(i)} ${"y".repeat((i * 53) % 500)}`,
      stderr: i % 3 === 0,
      ...(i % 997 === 0 ? { marker: true } : {}),
    }));
    const entries = lines.map((l) => ({ stored: [l], stderr: l.stderr, bytes: Buffer.byteLength(l.line) }));
    const [raw, decoded] = [randomUUID(), randomUUID()];
    const live = createPostgresLogStore({ pool: db.pool, schema: db.schema });
    for (const id of [raw, decoded]) {
      for (let at = 0; at < entries.length; at += 1_000) await live.append(id, at, entries.slice(at, at + 1_000));
      await live.finish(id, sampleJobResult({ requestId: id }), { at: entries.length });
    }
    expect(typeof live.readRaw).toBe("function");
    const viaRaw = createArchivingLogStore(live, { archive: memoryArchive, keepLiveMs: 3_600_000 });
    const viaLines = createArchivingLogStore(
      { ...live, readRaw: undefined },
      { archive: memoryArchive, keepLiveMs: 3_600_000 },
    );
    try {
      const a = await viaRaw.archiveJob(raw);
      const b = await viaLines.archiveJob(decoded);
      expect(a?.archived?.chunks).toBeGreaterThan(3);
      expect({ ...a!.archived!, at: "" }).toEqual({ ...b!.archived!, at: "" });
      expect(objects.get(archiveKey(raw))!.equals(objects.get(archiveKey(decoded))!)).toBe(true);
      expect(await viaRaw.read(raw)).toEqual(lines);
    } finally {
      await viaRaw.close();
      await viaLines.close();
    }
  });

  it("archiving reads pages of at most 4 MiB though short lines came first (readRaw and read)", async () => {
    const { objects, archive: memoryArchive } = inMemoryArchive();
    // 20,000 lines of one byte set the page at 16,384 lines; then 300 of 60,000 bytes (18 MB) follow.
    const texts = [
      ...Array.from({ length: 20_000 }, () => "x"),
      ...Array.from({ length: 300 }, (_, i) => `${i} `.padEnd(60_000, "L")),
    ];
    const entries = texts.map((line) => ({ stored: [{ line, stderr: false }], stderr: false, bytes: line.length }));
    const pages: number[] = [];
    /** The PostgreSQL store with each page it reads recorded (its bytes of text); `close` closes the store. */
    const recorded = (live: JobLogStore): JobLogStore => ({
      ...live,
      async readRaw(id, from, limit, options) {
        const page = await live.readRaw!(id, from, limit, options);
        let bytes = 0;
        page.each((_text, start, end) => (bytes += end - start));
        pages.push(bytes);
        return page;
      },
      async read(id, from, limit, options) {
        const page = await live.read(id, from, limit, options);
        pages.push(page.reduce((n, l) => n + l.line.length, 0));
        return page;
      },
    });
    for (const raw of [true, false]) {
      const live = createPostgresLogStore({ pool: db.pool, schema: db.schema });
      const id = randomUUID();
      for (let at = 0; at < entries.length; at += 2_000) await live.append(id, at, entries.slice(at, at + 2_000));
      await live.finish(id, sampleJobResult({ requestId: id }), { at: entries.length });
      pages.length = 0;
      const store = recorded(live);
      const logs = createArchivingLogStore(raw ? store : { ...store, readRaw: undefined }, {
        archive: memoryArchive,
        keepLiveMs: 3_600_000,
      });
      try {
        expect((await logs.archiveJob(id))?.archived?.lines).toBe(texts.length);
        expect(pages.length).toBeGreaterThan(4);
        expect(Math.max(...pages)).toBeLessThanOrEqual(4 * 2 ** 20 + 60_000);
        expect((await windows(logs, id, 5_000, 8 * 2 ** 20)).map((l) => l.line)).toEqual(texts);
      } finally {
        await logs.close();
      }
    }
  });

  it("a job whose end was recorded without archiving is swept; retention removes its object and its state", async () => {
    const live = createPostgresLogStore({ pool: db.pool, schema: db.schema });
    const id = randomUUID();
    await live.append(id, 0, [logEntry("one"), logEntry("two", true)]);
    await live.finish(id, sampleJobResult({ requestId: id, endedAt: new Date(Date.now() - 60_000).toISOString() }), {
      at: 2,
    });
    expect(await live.archivable!(new Date(), 1000)).toEqual(
      expect.arrayContaining([expect.objectContaining({ requestId: id })]),
    );
    const archive = createS3LogArchive({ bucket: s3.bucket, prefix: "sweep/", client: s3.client });
    const logs: ArchivingLogStore = createArchivingLogStore(live, { archive, sweepIntervalMs: 50 });
    try {
      await until(async () => (await logs.get(id))?.archived !== undefined, "the sweep to archive the job");
      expect(await logs.read(id)).toEqual([
        { line: "one", stderr: false },
        { line: "two", stderr: true },
      ]);
      expect((await live.archivable!(new Date(), 1000)).some((s) => s.requestId === id)).toBe(false);
      // Retention: the job ended a minute ago; a cutoff after it forgets job and object.
      expect(await logs.prune!(new Date())).toBeGreaterThanOrEqual(1);
      expect(await logs.get(id)).toBeNull();
      expect(await archive.read(archiveKey(id), 0, 1)).toBeNull();
    } finally {
      await logs.close();
    }
  });
});

describe("log archive: fs log store → fs archive (the embedded default)", () => {
  it("archives at the end, reads back after a restart, and a missing object is LOG_ARCHIVE_GONE", async () => {
    const dir = await mkdtemp(join(tmpdir(), "rd-archive-"));
    try {
      const open = () =>
        createArchivingLogStore(createFsLogStore(join(dir, "logs")), {
          archive: createFsLogArchive(join(dir, "archive")),
        });
      let logs = open();
      const runner = createRunnerService(createMemoryQueue(), { logs });
      const server = await startRunnerServer(runner, { port: 0 });
      const id = randomUUID();
      let before: StoredLine[];
      try {
        await streamJob(server.url, id, 3_000);
        await until(async () => (await logs.get(id))?.archived !== undefined, "the job to be archived");
        before = await collectAll(runner.follow(id));
        expect(before).toHaveLength(3_002);
        await untilLiveLogGone(dir, id);
      } finally {
        await server.close();
        await runner.close();
        await logs.close();
      }
      logs = open();
      expect(await windows(logs, id, 500)).toEqual(before);
      // The archive's reader keeps a read's byte bound too: pages of ~2,000 bytes, not 500 lines.
      const bounded = await logs.read(id, 0, 500, { maxBytes: 2_000 });
      expect(bounded.length).toBeGreaterThan(0);
      expect(bounded.length).toBeLessThan(100);
      expect(await windows(logs, id, 500, 2_000)).toEqual(before);
      await rm(join(dir, "archive", archiveKey(id)));
      const again = open();
      // Issue 31: an empty answer would read as a job that printed nothing.
      await expect(again.read(id, 0, 10)).rejects.toMatchObject({ code: "LOG_ARCHIVE_GONE", status: 410 });
      // follow() of a job whose object is gone fails with the code; it does not wait forever.
      const reader = createRunnerService(createMemoryQueue(), { logs: again });
      await expect(collectAll(reader.follow(id))).rejects.toMatchObject({ code: "LOG_ARCHIVE_GONE" });
      // Past the job's last line there is nothing to read, so nothing to miss: follow() ends.
      expect(await collectAll(reader.follow(id, { from: 3_002 }))).toEqual([]);
      await reader.close();
      await again.close();
      await logs.close();
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it("keeps a job's sections through archiving, and a section's lines read back from the archive", async () => {
    const dir = await mkdtemp(join(tmpdir(), "rd-archive-sections-"));
    const logs = createArchivingLogStore(createFsLogStore(join(dir, "logs")), {
      archive: createFsLogArchive(join(dir, "archive")),
    });
    const runner = createRunnerService(createMemoryQueue(), { logs });
    const server = await startRunnerServer(runner, { port: 0 });
    const id = randomUUID();
    try {
      const client = createRunnerClient({ endpoint: server.url, requestId: id });
      const lines = ["a", "::group::Build", "b1", "b2", "::endgroup::", "section_start:1700000000:deploy", "d1"];
      for (const line of lines) client.log(line, false);
      await client.end({ exitCode: 1, success: false });
      await client.close();
      await until(async () => (await logs.get(id))?.archived !== undefined, "the job to be archived");
      await untilLiveLogGone(dir, id);
      const record = await logs.sections!(id);
      expect(record!.sections.map((s) => [s.name, s.start, s.end])).toEqual([
        ["Build", 1, 4],
        ["deploy", 5, null],
      ]);
      // The same record after a restart, and the section's lines from the archive object.
      const reopened = createArchivingLogStore(createFsLogStore(join(dir, "logs")), {
        archive: createFsLogArchive(join(dir, "archive")),
      });
      expect(await reopened.sections!(id)).toEqual(record);
      const build = record!.sections[0]!;
      expect((await reopened.read(id, build.start, build.end! - build.start + 1)).map((l) => l.line)).toEqual(
        lines.slice(1, 5),
      );
      await reopened.close();
    } finally {
      await server.close();
      await runner.close();
      await logs.close();
      await rm(dir, { recursive: true, force: true });
    }
  });
});
