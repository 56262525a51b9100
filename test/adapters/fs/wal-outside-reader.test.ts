/**
 * The fs store's WAL while another process holds a read transaction on records.db (a
 * backup, an sqlite3 shell; issue 30, item 7): the checkpoints cannot reset the WAL, so
 * past its cap writes are refused (STORE_UNAVAILABLE, a clear problem) instead of growing
 * it without end, a warning with a code says why, and writes resume once the reader ends.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { stat } from "node:fs/promises";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { openRecordDb, type RecordDb } from "../../../src/adapters/fs/record-db.js";
import { createFsStore } from "../../../src/adapters/fs/store.js";
import { isRunnerDepotError } from "../../../src/errors.js";
import { add, startDepot, tempDir } from "../../fixtures/depot.js";

const READER = `
const { DatabaseSync } = require("node:sqlite");
const db = new DatabaseSync(process.argv[1]);
db.exec("BEGIN");
db.prepare("SELECT count(*) AS n FROM records").get();
process.stdout.write("ready\\n");
process.stdin.resume();
process.stdin.on("end", () => { db.exec("COMMIT"); db.close(); process.exit(0); });
`;

/** A second process holding a read transaction on `file` until its stdin ends. */
async function outsideReader(file: string): Promise<ChildProcess> {
  const child = spawn(process.execPath, ["--no-warnings", "-e", READER, file], { stdio: ["pipe", "pipe", "inherit"] });
  await new Promise<void>((resolve, reject) => {
    child.stdout!.on("data", (d: Buffer) => d.toString().includes("ready") && resolve());
    child.once("exit", (code) => reject(new Error(`the reader exited (${code})`)));
  });
  return child;
}

const cleanups: Array<() => Promise<unknown> | unknown> = [];
afterEach(async () => {
  for (const c of cleanups.reverse()) await c();
  cleanups.length = 0;
});

const key = (k: string) => Buffer.from(k, "utf8");
const VALUE = JSON.stringify("x".repeat(64 * 1024)); // about 19 WAL frames a write
const FRAME = 4096 + 24;
const CAP = 2_000;

describe("an outside reader and the fs store's WAL (issue 30, item 7)", () => {
  it("past the cap writes answer STORE_UNAVAILABLE with a warning, the WAL stays bounded, and writes resume after", async () => {
    const tmp = await tempDir("fs-wal-reader-");
    cleanups.push(tmp.cleanup);
    const file = join(tmp.dir, "records.db");
    const db: RecordDb = await openRecordDb(file, { sync: true, lockTimeoutMs: 5_000, walCapFrames: CAP });
    cleanups.push(() => db.close());
    await db.write((s) => s.insert.run(key("first"), "r1", VALUE).changes, true);
    const warnings: Error[] = [];
    const onWarning = (w: Error) => warnings.push(w);
    process.on("warning", onWarning);
    cleanups.push(() => process.off("warning", onWarning));
    const reader = await outsideReader(file);
    cleanups.push(() => reader.kill());

    // 1,000 writes would be 19,000 frames (~75 MiB): the code before the fix took them all.
    let refused: unknown;
    let written = 0;
    for (; written < 1_000 && refused === undefined; written++) {
      await db.write((s) => s.insert.run(key(`k${written}`), "r1", VALUE).changes, true).catch((e) => (refused = e));
    }
    expect(isRunnerDepotError(refused) && refused.code).toBe("STORE_UNAVAILABLE");
    expect((refused as Error).message).toMatch(/past its cap of 2000: another connection's read transaction/);
    // The cap plus the last write (writes are checked before their batch commits).
    expect((await stat(`${file}-wal`)).size).toBeLessThanOrEqual((CAP + 64) * FRAME + 32);
    // The checkpoint worker answers on its own thread: wait for its warning (a refused write asks again).
    const blocked = () =>
      warnings.some((w) => (w as NodeJS.ErrnoException).code === "RUNNER_DEPOT_FS_CHECKPOINT_BLOCKED");
    for (let i = 0; i < 100 && !blocked(); i++) {
      await new Promise((r) => setTimeout(r, 50));
      await db.write((s) => s.insert.run(key("refused"), "r1", VALUE).changes, true).catch(() => undefined);
    }
    expect(blocked()).toBe(true);

    // The reader ends: a checkpoint resets the WAL and writes go through again.
    reader.stdin!.end();
    await new Promise((r) => reader.once("exit", r));
    let again: unknown = null;
    for (let i = 0; i < 200; i++) {
      again = await db.write((s) => s.insert.run(key("after"), "r1", VALUE).changes, true).catch((e) => e);
      if (again === 1) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    expect(again).toBe(1);
    const size = (await stat(`${file}-wal`)).size;
    // Written from its start again: more writes do not grow the file past where it was.
    for (let i = 0; i < 20; i++) await db.write((s) => s.insert.run(key(`z${i}`), "r1", VALUE).changes, true);
    expect((await stat(`${file}-wal`)).size).toBeLessThanOrEqual(size);
  }, 60_000);

  it("through a listening depot: publishes answer 503 STORE_UNAVAILABLE naming the reader, then pass once it ends", async () => {
    const tmp = await tempDir("fs-wal-reader-http-");
    cleanups.push(tmp.cleanup);
    const store = createFsStore(tmp.dir, { walCapFrames: CAP });
    cleanups.push(() => store.close?.());
    const depot = await startDepot(store);
    cleanups.push(() => depot.close());
    // One publish: a transaction and 4 files of 16 KiB (small blobs, rows of records.db): ~20+ WAL frames.
    const body = (n: number) => new Uint8Array(16 * 1024).fill(n % 251);
    const tryPublish = async (n: number): Promise<Response> => {
      const open = await fetch(`${depot.url}/trans/wal${n}@1.0.0`, { method: "POST" });
      if (open.status !== 201) return open;
      const { transaction } = (await open.json()) as { transaction: string };
      for (let f = 0; f < 4; f++) {
        const added = await add(depot.url, transaction, { type: "file", path: `f${f}`, body: body(n * 4 + f) });
        if (added.status !== 201) return added;
      }
      return fetch(`${depot.url}/commit/${transaction}`, { method: "POST" });
    };
    expect((await tryPublish(0)).status).toBe(201);
    const reader = await outsideReader(join(tmp.dir, "records.db"));
    cleanups.push(() => reader.kill());

    // 400 publishes would be ~10,000 frames: without the option the default cap (64,000) took them all.
    let refused: Response | undefined;
    for (let n = 1; n <= 400 && !refused; n++) {
      const answer = await tryPublish(n);
      if (answer.status === 503) refused = answer;
      else expect(answer.status).toBe(201);
    }
    expect(refused?.status).toBe(503);
    expect(refused!.headers.get("content-type")).toBe("application/problem+json");
    const problem = (await refused!.json()) as { code: string; detail?: string; title?: string };
    expect(problem.code).toBe("STORE_UNAVAILABLE");
    expect(JSON.stringify(problem)).toMatch(/another connection's read transaction on .*records\.db/);
    // Reads go on meanwhile.
    expect((await fetch(`${depot.url}/catalog`)).status).toBe(200);

    reader.stdin!.end();
    await new Promise((r) => reader.once("exit", r));
    let status = 0;
    for (let i = 0; i < 200 && status !== 201; i++) {
      status = (await tryPublish(1_000 + i)).status;
      if (status !== 201) await new Promise((r) => setTimeout(r, 50));
    }
    expect(status).toBe(201);
  }, 90_000);
});
