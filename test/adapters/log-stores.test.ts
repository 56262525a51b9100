/**
 * The two JobLogStore adapters of this package (memory, filesystem) under the port's
 * conformance suite, plus the filesystem store's own durability cases.
 */
import { randomUUID } from "node:crypto";
import {
  mkdtempSync,
  rmSync,
  readFileSync,
  appendFileSync,
  writeFileSync,
  readdirSync,
  readlinkSync,
  existsSync,
  mkdirSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { open } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { createMemoryLogStore } from "../../src/adapters/memory/index.js";
import { createFsLogStore } from "../../src/adapters/fs/index.js";
import { MAX_OPEN_LOGS } from "../../src/adapters/fs/log-store.js";
import { describeJobLogStore } from "../../src/testing/log-store-suite.js";
import { logEntry, sampleJobResult } from "../../src/testing/helpers.js";
import { errno, replaceDirSync } from "../fixtures/dir-sync.js";

const root = mkdtempSync(join(tmpdir(), "runner-depot-log-store-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));
let n = 0;
const freshDir = () => join(root, `store-${n++}`);
const dirs = new WeakMap<object, string>();

/** Log files of `dir` this process has open (Linux: /proc/self/fd). */
function openLogs(dir: string): number {
  let count = 0;
  for (const fd of readdirSync("/proc/self/fd")) {
    try {
      const target = readlinkSync(`/proc/self/fd/${fd}`);
      if (target.startsWith(join(dir, "jobs")) && target.endsWith(".log")) count++;
    } catch {
      // The descriptor of the readdir itself, already closed.
    }
  }
  return count;
}

describeJobLogStore("memory", () => createMemoryLogStore());

describeJobLogStore(
  "fs",
  () => {
    const dir = freshDir();
    const store = createFsLogStore(dir);
    dirs.set(store, dir);
    return store;
  },
  { reopen: (store) => createFsLogStore(dirs.get(store)!) },
);

describe("fs log store: durability on disk", () => {
  it("a new store on the same directory sees jobs written by a closed one (a process restart)", async () => {
    const dir = freshDir();
    const a = createFsLogStore(dir);
    const id = randomUUID();
    await a.open(id, { expect: true, info: { repoUrl: "https://git.example/x.git" } });
    await a.append(id, 0, [logEntry("one"), logEntry("twø", true)]);
    await a.close?.();
    const b = createFsLogStore(dir);
    expect(await b.get(id)).toMatchObject({
      committed: 2,
      storedLines: 2,
      expected: true,
      info: { repoUrl: "https://git.example/x.git" },
    });
    expect(await b.read(id)).toEqual([
      { line: "one", stderr: false },
      { line: "twø", stderr: true },
    ]);
    await b.close?.();
  });

  it("a torn write past the recorded length (crash before the state file) is dropped on restart", async () => {
    const dir = freshDir();
    const a = createFsLogStore(dir);
    const id = randomUUID();
    await a.append(id, 0, [logEntry("kept")]);
    await a.close?.();
    // Bytes that reached the log file but never the state file.
    appendFileSync(join(dir, "jobs", `${id}.log`), 'o"torn half-wri');
    writeFileSync(join(dir, "jobs", `${id}.json.123.tmp`), "{ half a state");
    const b = createFsLogStore(dir);
    expect((await b.get(id))?.committed).toBe(1);
    expect(await b.read(id)).toEqual([{ line: "kept", stderr: false }]);
    await b.append(id, 1, [logEntry("next")]);
    expect((await b.read(id)).map((l) => l.line)).toEqual(["kept", "next"]);
    expect(readdirSync(join(dir, "jobs")).filter((f) => f.endsWith(".tmp"))).toEqual([]);
    await b.close?.();
    const c = createFsLogStore(dir);
    expect((await c.read(id)).map((l) => l.line)).toEqual(["kept", "next"]);
    await c.close?.();
  });

  it("the state file is plain JSON and the log is append-only records, one per stored line", async () => {
    const dir = freshDir();
    const store = createFsLogStore(dir);
    const id = randomUUID();
    await store.append(id, 0, [
      logEntry("a\nb"),
      { stored: [{ line: "m", stderr: true, marker: true }], stderr: true, bytes: 0, capped: true },
    ]);
    await store.finish(id, sampleJobResult({ requestId: id }), { at: 2 });
    const state = JSON.parse(readFileSync(join(dir, "jobs", `${id}.json`), "utf8"));
    expect(state).toMatchObject({ requestId: id, status: "finished", committed: 3, logTruncated: true });
    expect(readFileSync(join(dir, "jobs", `${id}.log`), "utf8").split("\n")).toHaveLength(3);
    await store.close?.();
  });

  it("reads from any offset across index checkpoints and large records", async () => {
    const dir = freshDir();
    const store = createFsLogStore(dir);
    const id = randomUUID();
    const texts = Array.from({ length: 3000 }, (_, i) => (i % 997 === 0 ? "é".repeat(300_000) : `line ${i}`));
    await store.append(
      id,
      0,
      texts.slice(0, 1000).map((t) => logEntry(t)),
    );
    // The index is built by the first read, then kept current by later appends.
    expect((await store.read(id, 990, 5)).map((l) => l.line)).toEqual(texts.slice(990, 995));
    await store.append(
      id,
      1000,
      texts.slice(1000).map((t) => logEntry(t)),
    );
    for (const from of [0, 255, 256, 257, 997, 1993, 2999]) {
      expect((await store.read(id, from, 3)).map((l) => l.line)).toEqual(texts.slice(from, from + 3));
    }
    await store.close?.();
    const again = createFsLogStore(dir);
    expect((await again.read(id, 1994, 2)).map((l) => l.line)).toEqual(texts.slice(1994, 1996));
    expect(await again.read(id)).toHaveLength(3000);
    await again.close?.();
  });

  it.skipIf(!existsSync("/proc/self/fd"))(
    "keeps appended jobs' log files open, at most MAX_OPEN_LOGS, none once finished or closed",
    async () => {
      const dir = freshDir();
      const store = createFsLogStore(dir);
      const ids = Array.from({ length: MAX_OPEN_LOGS + 8 }, () => randomUUID());
      for (const id of ids) await store.append(id, 0, [logEntry("first")]);
      expect(openLogs(dir)).toBe(MAX_OPEN_LOGS);
      // The first job's file was closed to stay within the bound: its next append opens it again.
      await store.append(ids[0]!, 1, [logEntry("second")]);
      expect((await store.read(ids[0]!)).map((l) => l.line)).toEqual(["first", "second"]);
      expect(openLogs(dir)).toBe(MAX_OPEN_LOGS);
      await store.finish(ids[0]!, sampleJobResult({ requestId: ids[0]! }), { at: 2 });
      expect(openLogs(dir)).toBe(MAX_OPEN_LOGS - 1);
      await store.close?.();
      expect(openLogs(dir)).toBe(0);
      const again = createFsLogStore(dir);
      expect((await again.read(ids[0]!)).map((l) => l.line)).toEqual(["first", "second"]);
      expect(await again.read(ids.at(-1)!)).toEqual([{ line: "first", stderr: false }]);
      await again.close?.();
    },
  );

  it("an append whose log write fails leaves the state file as it was and no temp file", async () => {
    const dir = freshDir();
    const store = createFsLogStore(dir);
    const id = randomUUID();
    await store.open(id, { expect: true });
    // A directory where the log file should be: opening it for writing fails (EISDIR).
    mkdirSync(join(dir, "jobs", `${id}.log`));
    await expect(store.append(id, 0, [logEntry("lost")])).rejects.toThrow();
    expect(JSON.parse(readFileSync(join(dir, "jobs", `${id}.json`), "utf8"))).toMatchObject({
      committed: 0,
      storedLines: 0,
      fileBytes: 0,
    });
    expect(readdirSync(join(dir, "jobs")).filter((f) => f.endsWith(".tmp"))).toEqual([]);
    expect((await store.get(id))?.committed).toBe(0);
    rmSync(join(dir, "jobs", `${id}.log`), { recursive: true });
    await store.append(id, 0, [logEntry("kept")]);
    expect(await store.read(id)).toEqual([{ line: "kept", stderr: false }]);
    await store.close?.();
  });
});

describe("fs log store: the rename of the state reaches the disk before an append answers", () => {
  /** Polls `check` until it holds (20 s at most). */
  async function until(check: () => boolean): Promise<void> {
    for (let i = 0; i < 4000 && !check(); i++) await new Promise((resolve) => setTimeout(resolve, 5));
    expect(check()).toBe(true);
  }

  it("appends resolve only after a fsync of the jobs directory that ran after their rename (held here), and appends made meanwhile share one", async () => {
    const dir = freshDir();
    const store = createFsLogStore(dir);
    const ids = Array.from({ length: 8 }, () => randomUUID());
    for (const id of ids) await store.append(id, 0, [logEntry("first")]);
    const committedOnDisk = (id: string) =>
      (JSON.parse(readFileSync(join(dir, "jobs", `${id}.json`), "utf8")) as { committed: number }).committed;
    // Directory fsyncs go through FileHandle#sync (the log and state files use fd calls):
    // hold them and count them.
    const probe = await open(join(dir, "jobs"), "r");
    const proto = Object.getPrototypeOf(probe) as { sync: () => Promise<void> };
    await probe.close();
    const original = proto.sync;
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    let syncs = 0;
    proto.sync = async function (this: unknown) {
      syncs++;
      await gate;
      return original.call(this);
    };
    try {
      let answered = 0;
      const appends = ids.map((id) => store.append(id, 1, [logEntry("second")]).then((state) => (answered++, state)));
      // Every state is renamed (on disk each says 2) while the first directory fsync is held,
      // and no append has answered.
      await until(() => syncs > 0 && ids.every((id) => committedOnDisk(id) === 2));
      expect(answered).toBe(0);
      release();
      for (const state of await Promise.all(appends)) expect(state.committed).toBe(2);
      // The held sync and one queued behind it for every rename made meanwhile.
      expect(syncs).toBe(2);
    } finally {
      proto.sync = original;
      release();
      await store.close?.();
    }
  });
});

describe("fs log store: open log files under concurrency (review)", () => {
  it.skipIf(!existsSync("/proc/self/fd"))(
    "a burst of appends to more jobs than MAX_OPEN_LOGS at once leaves at most MAX_OPEN_LOGS open",
    async () => {
      const dir = freshDir();
      const store = createFsLogStore(dir, { fsync: false });
      const ids = Array.from({ length: MAX_OPEN_LOGS * 3 }, () => randomUUID());
      for (const id of ids) await store.open(id, { expect: true });
      // All at once: every append's write is in flight when the next one opens its file.
      await Promise.all(ids.map((id) => store.append(id, 0, [logEntry("burst")])));
      expect(openLogs(dir)).toBeLessThanOrEqual(MAX_OPEN_LOGS);
      // And it stays bounded when the burst repeats.
      await Promise.all(ids.map((id) => store.append(id, 1, [logEntry("again")])));
      expect(openLogs(dir)).toBeLessThanOrEqual(MAX_OPEN_LOGS);
      for (const id of ids) expect((await store.read(id)).map((l) => l.line)).toEqual(["burst", "again"]);
      await store.close?.();
      expect(openLogs(dir)).toBe(0);
    },
  );

  it.skipIf(!existsSync("/proc/self/fd"))(
    "close() racing an append never leaves a log file open nor resolves before the append's write",
    async () => {
      for (let ticks = 0; ticks < 24; ticks++) {
        const dir = freshDir();
        const store = createFsLogStore(dir, { fsync: false });
        const id = randomUUID();
        await store.append(id, 0, [logEntry("first")]);
        let appended = false;
        const append = store.append(id, 1, [logEntry("second")]).then(
          () => (appended = true),
          () => undefined,
        );
        for (let i = 0; i < ticks; i++) await Promise.resolve();
        await store.close?.();
        // What the directory says once close() resolved: an append it let in is written by then.
        const stateAtClose = JSON.parse(readFileSync(join(dir, "jobs", `${id}.json`), "utf8")) as {
          storedLines: number;
        };
        await append;
        if (appended)
          expect(stateAtClose.storedLines, `ticks ${ticks}: close resolved before the append it let in`).toBe(2);
        expect(openLogs(dir), `ticks ${ticks}`).toBe(0);
        const again = createFsLogStore(dir, { fsync: false });
        expect((await again.read(id)).map((l) => l.line)).toEqual(appended ? ["first", "second"] : ["first"]);
        await again.close?.();
      }
    },
  );
});

/** Polls `check` until it holds (20 s at most). */
async function until(check: () => boolean): Promise<void> {
  for (let i = 0; i < 4000 && !check(); i++) await new Promise((resolve) => setTimeout(resolve, 5));
  expect(check()).toBe(true);
}

/** A job with one stored line that ended in 2020 (prunable at any later time). */
async function endedJob(store: ReturnType<typeof createFsLogStore>): Promise<string> {
  const id = randomUUID();
  await store.append(id, 0, [logEntry("old")]);
  await store.finish(id, sampleJobResult({ requestId: id, endedAt: "2020-01-01T00:00:00.000Z" }), { at: 1 });
  return id;
}

describe("fs log store: prune's crash order (session 9 review)", () => {
  const PRUNE_AT = new Date("2021-01-01T00:00:00.000Z");

  it("the log file is removed only once the state file's removal is on disk (the jobs directory's fsync, held here)", async () => {
    const dir = freshDir();
    const store = createFsLogStore(dir);
    const id = await endedJob(store);
    const jobs = join(dir, "jobs");
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    let held = 0;
    const undo = await replaceDirSync(async (original) => {
      held++;
      await gate;
      return original();
    });
    try {
      let pruned: number | null = null;
      const prune = store.prune!(PRUNE_AT).then((n) => (pruned = n));
      await until(() => held > 0);
      // Between the two steps: the state is gone, the log is still there, prune has not answered.
      expect(existsSync(join(jobs, `${id}.json`))).toBe(false);
      expect(existsSync(join(jobs, `${id}.log`))).toBe(true);
      expect(pruned).toBeNull();
      release();
      await prune;
      expect(pruned).toBe(1);
      expect(readdirSync(jobs)).toEqual([]);
    } finally {
      undo();
      release();
      await store.close?.();
    }
  });

  it("a directory fsync failing between the steps (a crash there) leaves an orphan log, which the next open removes; the job is gone", async () => {
    const dir = freshDir();
    const store = createFsLogStore(dir);
    const id = await endedJob(store);
    const kept = await endedJob(store);
    const jobs = join(dir, "jobs");
    const undo = await replaceDirSync(() => Promise.reject(errno("EIO")));
    try {
      await expect(store.prune!(PRUNE_AT)).rejects.toThrow(/EIO/);
    } finally {
      undo();
    }
    // Where a crash at that point leaves the directory: no state, the log.
    expect(existsSync(join(jobs, `${id}.json`))).toBe(false);
    expect(existsSync(join(jobs, `${id}.log`))).toBe(true);
    await store.close?.();
    // The restart: the orphan log goes, nothing names it; no job without its lines.
    const again = createFsLogStore(dir);
    expect(await again.get(id)).toBeNull();
    expect(await again.get(kept)).toBeNull();
    expect(readdirSync(jobs).filter((f) => f.startsWith(id) || f.startsWith(kept))).toEqual([]);
    await again.close?.();
  });

  it("a failed prune keeps the job held and readable, and the next prune removes it", async () => {
    const dir = freshDir();
    const store = createFsLogStore(dir);
    const id = await endedJob(store);
    const undo = await replaceDirSync(() => Promise.reject(errno("EIO")));
    try {
      await expect(store.prune!(PRUNE_AT)).rejects.toThrow(/EIO/);
    } finally {
      undo();
    }
    expect((await store.read(id)).map((l) => l.line)).toEqual(["old"]);
    expect(await store.prune!(PRUNE_AT)).toBe(1);
    expect(await store.get(id)).toBeNull();
    expect(readdirSync(join(dir, "jobs"))).toEqual([]);
    await store.close?.();
  });

  it("an orphan log (no state names it) is removed when a store opens the directory; other files stay", async () => {
    const dir = freshDir();
    const jobs = join(dir, "jobs");
    mkdirSync(jobs, { recursive: true });
    const orphan = randomUUID();
    writeFileSync(join(jobs, `${orphan}.log`), 'o"lost"\n');
    writeFileSync(join(jobs, "notes.log"), "not ours\n");
    const store = createFsLogStore(dir);
    expect(await store.get(orphan)).toBeNull();
    expect(readdirSync(jobs).sort()).toEqual(["notes.log"]);
    await store.close?.();
  });

  it("pruning many jobs shares the directory fsyncs (far fewer than one per job)", async () => {
    const dir = freshDir();
    const store = createFsLogStore(dir);
    const ids: string[] = [];
    for (let i = 0; i < 40; i++) ids.push(await endedJob(store));
    let syncs = 0;
    const undo = await replaceDirSync((original) => (syncs++, original()));
    try {
      expect(await store.prune!(PRUNE_AT)).toBe(40);
    } finally {
      undo();
    }
    expect(syncs).toBeGreaterThan(0);
    expect(syncs).toBeLessThanOrEqual(4);
    expect(readdirSync(join(dir, "jobs"))).toEqual([]);
    await store.close?.();
  });
});

describe.skipIf(!existsSync("/proc/self/fd"))(
  "fs log store: directories it creates reach the disk (session 9 review)",
  () => {
    it("the first open fsyncs the parent of every directory it made; a later open only the jobs directory and its parent", async () => {
      const parent = join(root, `nested-${n++}`);
      const dir = join(parent, "logs");
      const synced: string[] = [];
      const undo = await replaceDirSync((original, path) => (synced.push(path), original()));
      try {
        const store = createFsLogStore(dir);
        expect(await store.get(randomUUID())).toBeNull();
        // `parent`, `logs` and `jobs` were made: root holds parent's entry, parent logs', logs jobs'.
        // And jobs itself (review 2): what a process that died before its fsync renamed there.
        expect(synced.sort()).toEqual([root, parent, dir, join(dir, "jobs")].sort());
        await store.close?.();
        synced.length = 0;
        const again = createFsLogStore(dir);
        expect(await again.get(randomUUID())).toBeNull();
        // Made before, maybe by a process that died before its fsync: two fsyncs a store open.
        expect(synced).toEqual([dir, join(dir, "jobs")]);
        synced.length = 0;
        // The first append syncs the jobs directory only (its first state, its rename).
        await again.append(randomUUID(), 0, [logEntry("x")]);
        expect(new Set(synced)).toEqual(new Set([join(dir, "jobs")]));
        await again.close?.();
      } finally {
        undo();
      }
    });

    it("without fsync, no directory is synced", async () => {
      const dir = freshDir();
      let syncs = 0;
      const undo = await replaceDirSync((original) => (syncs++, original()));
      try {
        const store = createFsLogStore(dir, { fsync: false });
        await store.append(randomUUID(), 0, [logEntry("x")]);
        await store.close?.();
      } finally {
        undo();
      }
      expect(syncs).toBe(0);
    });
  },
);

describe("fs log store: a filesystem that cannot fsync a directory (session 9 review)", () => {
  it("EINVAL from the directory fsync: appends succeed, one warning, and no directory fsync is tried again", async () => {
    const dir = freshDir();
    const store = createFsLogStore(dir);
    const id = randomUUID();
    await store.append(id, 0, [logEntry("before")]);
    const warnings: Error[] = [];
    const onWarning = (w: Error) => warnings.push(w);
    process.on("warning", onWarning);
    let tries = 0;
    const undo = await replaceDirSync(() => (tries++, Promise.reject(errno("EINVAL"))));
    try {
      for (let at = 1; at <= 5; at++)
        expect((await store.append(id, at, [logEntry(`line ${at}`)])).committed).toBe(at + 1);
      await new Promise((resolve) => setImmediate(resolve));
    } finally {
      undo();
      process.off("warning", onWarning);
    }
    // The kept handle, then a fresh one (a closed handle of ours says EBADF too): refused twice, then never tried again.
    expect(tries).toBe(2);
    expect(warnings.map((w) => (w as NodeJS.ErrnoException).code)).toEqual(["RUNNER_DEPOT_DIR_FSYNC_UNSUPPORTED"]);
    expect((await store.read(id)).map((l) => l.line)).toEqual([
      "before",
      "line 1",
      "line 2",
      "line 3",
      "line 4",
      "line 5",
    ]);
    await store.close?.();
    const again = createFsLogStore(dir);
    expect((await again.get(id))?.committed).toBe(6);
    await again.close?.();
  });

  it("EBADF once on the kept handle only (a handle gone bad, not the filesystem): the fresh one syncs, and later appends still sync", async () => {
    const dir = freshDir();
    const store = createFsLogStore(dir);
    const id = randomUUID();
    await store.append(id, 0, [logEntry("before")]);
    let calls = 0;
    const undo = await replaceDirSync((original) => (++calls === 1 ? Promise.reject(errno("EBADF")) : original()));
    try {
      await store.append(id, 1, [logEntry("one")]);
      await store.append(id, 2, [logEntry("two")]);
    } finally {
      undo();
    }
    // The refused one, its retry on a fresh descriptor, and the next append's.
    expect(calls).toBe(3);
    await store.close?.();
  });

  it("EIO from the directory fsync: the append fails and acknowledges nothing, every time; the store appends again once the disk does", async () => {
    const dir = freshDir();
    const store = createFsLogStore(dir);
    const id = randomUUID();
    await store.append(id, 0, [logEntry("before")]);
    let failing = true;
    const undo = await replaceDirSync((original) => (failing ? Promise.reject(errno("EIO")) : original()));
    try {
      for (let i = 0; i < 3; i++) {
        await expect(store.append(id, 1, [logEntry("lost")])).rejects.toThrow(/EIO/);
        expect((await store.get(id))?.committed).toBe(1);
      }
      failing = false;
      expect((await store.append(id, 1, [logEntry("kept")])).committed).toBe(2);
    } finally {
      undo();
    }
    expect((await store.read(id)).map((l) => l.line)).toEqual(["before", "kept"]);
    await store.close?.();
  });
});

describe("fs log store: an open whose directory fsync fails (review 2)", () => {
  it("EIO at the open fails the calls of the moment, not every call for the rest of the process: the next call opens again", async () => {
    const dir = freshDir();
    const id = randomUUID();
    const seed = createFsLogStore(dir);
    await seed.append(id, 0, [logEntry("kept")]);
    await seed.close?.();
    const store = createFsLogStore(dir);
    const undo = await replaceDirSync(() => Promise.reject(errno("EIO")));
    try {
      await expect(store.get(id)).rejects.toThrow(/EIO/);
      await expect(store.append(id, 1, [logEntry("refused")])).rejects.toThrow(/EIO/);
    } finally {
      undo();
    }
    // The disk answers again: the store opens, with the job as it was.
    expect((await store.get(id))?.committed).toBe(1);
    expect((await store.append(id, 1, [logEntry("next")])).committed).toBe(2);
    expect((await store.read(id)).map((l) => l.line)).toEqual(["kept", "next"]);
    expect((await store.list!({ limit: 10 })).map((s) => s.requestId)).toEqual([id]);
    await store.close?.();
  });
});
