/**
 * The two JobLogStore adapters of this package (memory, filesystem) under the port's
 * conformance suite, plus the filesystem store's own durability cases.
 */
import { randomUUID } from "node:crypto";
import { mkdtempSync, rmSync, readFileSync, appendFileSync, writeFileSync, readdirSync, readlinkSync, existsSync, mkdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { open } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { createMemoryLogStore } from "../src/adapters/memory/index.js";
import { createFsLogStore } from "../src/adapters/fs/index.js";
import { MAX_OPEN_LOGS } from "../src/adapters/fs/log-store.js";
import { describeJobLogStore } from "../src/testing/log-store-suite.js";
import { logEntry, sampleJobResult } from "../src/testing/helpers.js";

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
    expect(await b.get(id)).toMatchObject({ committed: 2, storedLines: 2, expected: true, info: { repoUrl: "https://git.example/x.git" } });
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
    await store.append(id, 0, [logEntry("a\nb"), { stored: [{ line: "m", stderr: true, marker: true }], stderr: true, bytes: 0, capped: true }]);
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
    await store.append(id, 0, texts.slice(0, 1000).map((t) => logEntry(t)));
    // The index is built by the first read, then kept current by later appends.
    expect((await store.read(id, 990, 5)).map((l) => l.line)).toEqual(texts.slice(990, 995));
    await store.append(id, 1000, texts.slice(1000).map((t) => logEntry(t)));
    for (const from of [0, 255, 256, 257, 997, 1993, 2999]) {
      expect((await store.read(id, from, 3)).map((l) => l.line)).toEqual(texts.slice(from, from + 3));
    }
    await store.close?.();
    const again = createFsLogStore(dir);
    expect((await again.read(id, 1994, 2)).map((l) => l.line)).toEqual(texts.slice(1994, 1996));
    expect(await again.read(id)).toHaveLength(3000);
    await again.close?.();
  });

  it.skipIf(!existsSync("/proc/self/fd"))("keeps appended jobs' log files open, at most MAX_OPEN_LOGS, none once finished or closed", async () => {
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
  });

  it("an append whose log write fails leaves the state file as it was and no temp file", async () => {
    const dir = freshDir();
    const store = createFsLogStore(dir);
    const id = randomUUID();
    await store.open(id, { expect: true });
    // A directory where the log file should be: opening it for writing fails (EISDIR).
    mkdirSync(join(dir, "jobs", `${id}.log`));
    await expect(store.append(id, 0, [logEntry("lost")])).rejects.toThrow();
    expect(JSON.parse(readFileSync(join(dir, "jobs", `${id}.json`), "utf8"))).toMatchObject({ committed: 0, storedLines: 0, fileBytes: 0 });
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
    const committedOnDisk = (id: string) => (JSON.parse(readFileSync(join(dir, "jobs", `${id}.json`), "utf8")) as { committed: number }).committed;
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
  it.skipIf(!existsSync("/proc/self/fd"))("a burst of appends to more jobs than MAX_OPEN_LOGS at once leaves at most MAX_OPEN_LOGS open", async () => {
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
  });

  it.skipIf(!existsSync("/proc/self/fd"))("close() racing an append never leaves a log file open nor resolves before the append's write", async () => {
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
      const stateAtClose = JSON.parse(readFileSync(join(dir, "jobs", `${id}.json`), "utf8")) as { storedLines: number };
      await append;
      if (appended) expect(stateAtClose.storedLines, `ticks ${ticks}: close resolved before the append it let in`).toBe(2);
      expect(openLogs(dir), `ticks ${ticks}`).toBe(0);
      const again = createFsLogStore(dir, { fsync: false });
      expect((await again.read(id)).map((l) => l.line)).toEqual(appended ? ["first", "second"] : ["first"]);
      await again.close?.();
    }
  });
});
