/**
 * The fs store's record database when a write fails: a write that fails inside a group
 * commit answers its own error while its batch-mates commit with their own outcomes
 * (record-db.ts), and a failed flush of the WAL fails every later write too (wal-sync.ts),
 * shown on a real device that fails its writes: ext4 on a loop device whose backing file
 * sits on a tmpfs that runs out of space (needs root and mount; skipped without them).
 */
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { openRecordDb } from "../../../src/adapters/fs/record-db.js";
import { createFsStore } from "../../../src/adapters/fs/store.js";
import { isRunnerDepotError } from "../../../src/errors.js";
import { tempDir } from "../../fixtures/depot.js";

const cleanups: Array<() => Promise<void> | void> = [];
afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
});

const key = (k: string) => Buffer.from(k, "utf8");

describe("fs store record batches", () => {
  it("a write failing inside a batch answers its own error; the others commit, in call order, with their own outcomes", async () => {
    const tmp = await tempDir("fs-batch-fail-");
    cleanups.push(tmp.cleanup);
    const db = await openRecordDb(join(tmp.dir, "records.db"), { sync: true, lockTimeoutMs: 5_000 });
    // Issued in one turn: one batch. The second breaks a real constraint (revision NOT NULL).
    const outcomes = await Promise.allSettled([
      db.write((s) => s.insert.run(key("a"), "r1", '"a"').changes, true),
      db.write((s) => s.insert.run(key("b"), null, '"b"').changes, true),
      db.write((s) => s.insert.run(key("a"), "r2", '"again"').changes, false),
      db.write((s) => s.swap.run("r3", '"a3"', key("a"), "r1").changes, true),
    ]);
    expect(outcomes.map((o) => o.status)).toEqual(["fulfilled", "rejected", "fulfilled", "fulfilled"]);
    expect((outcomes[1] as PromiseRejectedResult).reason.message).toMatch(/NOT NULL/);
    // In call order: the create won, the second create of "a" lost, the swap from r1 won.
    expect(
      outcomes.filter((o) => o.status === "fulfilled").map((o) => Number((o as PromiseFulfilledResult<unknown>).value)),
    ).toEqual([1, 0, 1]);
    expect(db.statements.get.get(key("a"))).toEqual({ revision: "r3", value: '"a3"' });
    expect(db.statements.get.get(key("b"))).toBeUndefined();
    // Every write failing: each answers its error, none hangs.
    const all = await Promise.allSettled(
      Array.from({ length: 5 }, (_, i) => db.write((s) => s.insert.run(key(`n${i}`), null, "1"), true)),
    );
    expect(all.every((o) => o.status === "rejected")).toBe(true);
    expect(await db.write((s) => s.insert.run(key("after"), "r", "1").changes, true)).toBe(1);
    await db.close();
  });
});

/** Mounts ext4 on a loop device backed by a file on a small tmpfs; null without root or mount. */
function failingDisk(): { mnt: string; fill(): void; free(): void; cleanup(): void } | null {
  if (process.getuid?.() !== 0) return null;
  const root = mkdtempSync(join(tmpdir(), "fs-eio-"));
  const back = join(root, "back");
  const mnt = join(root, "mnt");
  mkdirSync(back);
  mkdirSync(mnt);
  const unmount = (path: string) => {
    try {
      execFileSync("umount", [path], { stdio: "ignore" });
    } catch {
      // not mounted
    }
  };
  try {
    execFileSync("mount", ["-t", "tmpfs", "-o", "size=24m", "tmpfs", back], { stdio: "ignore" });
    execFileSync("truncate", ["-s", "256M", join(back, "img")]);
    execFileSync("mkfs.ext4", ["-q", "-F", join(back, "img")], { stdio: "ignore" });
    execFileSync("mount", ["-o", "loop", join(back, "img"), mnt], { stdio: "ignore" });
  } catch {
    unmount(mnt);
    unmount(back);
    rmSync(root, { recursive: true, force: true });
    return null;
  }
  const filler = join(back, "fill");
  return {
    mnt,
    fill() {
      try {
        // Until the tmpfs is full: the loop device's writes then fail.
        execFileSync("dd", ["if=/dev/zero", `of=${filler}`, "bs=1M", "status=none"], { stdio: "ignore" });
      } catch {
        // ENOSPC: what we want
      }
    },
    free: () => rmSync(filler, { force: true }),
    cleanup() {
      unmount(mnt);
      unmount(back);
      rmSync(root, { recursive: true, force: true });
    },
  };
}

describe("fs store on a disk that fails its writes", () => {
  it("a failed WAL flush fails its writes and every write after it, even once the disk writes again; reads go on", async (ctx) => {
    const disk = failingDisk();
    if (!disk) return ctx.skip();
    cleanups.push(() => disk.cleanup());
    const store = createFsStore(join(disk.mnt, "store"));
    cleanups.push(async () => {
      await store.close?.().catch(() => undefined);
    });
    const first = await store.putRecord("before", { v: 1 }, { ifRevision: null });
    disk.fill();
    // Big enough values that the WAL's pages must reach the device at the flush.
    const big = "y".repeat(256 * 1024);
    const failed = await Promise.allSettled(
      [0, 1, 2].map((i) => store.putRecord(`during/${i}`, { big, i }, { ifRevision: null })),
    );
    expect(failed.every((o) => o.status === "rejected")).toBe(true);
    for (const o of failed) expect(isRunnerDepotError((o as PromiseRejectedResult).reason, "UNAVAILABLE")).toBe(true);
    disk.free();
    // The device writes again, but the pages it dropped are gone: a commit now would sit
    // behind them in the WAL, so it would not survive a crash either. Refused, lazy too.
    const after = await store.putRecord("after", { v: 2 }, { ifRevision: null }).catch((e: unknown) => e);
    expect(isRunnerDepotError(after, "UNAVAILABLE")).toBe(true);
    expect((after as Error).message).toMatch(/flush/);
    const lazy = await store
      .putRecord("after/lazy", { v: 3 }, { ifRevision: null, lazy: true })
      .catch((e: unknown) => e);
    expect(isRunnerDepotError(lazy, "UNAVAILABLE")).toBe(true);
    const blob = await store
      .putBlob(
        (async function* () {
          yield new TextEncoder().encode("small");
        })(),
      )
      .catch((e: unknown) => e);
    expect(isRunnerDepotError(blob, "UNAVAILABLE")).toBe(true);
    expect(await store.getRecord("before")).toEqual({ value: { v: 1 }, revision: first });
    await store.close?.();
    // Opened again in this process: still refused (a new descriptor would not see the error).
    const again = createFsStore(join(disk.mnt, "store"));
    expect(await again.getRecord("before")).toEqual({ value: { v: 1 }, revision: first });
    expect(
      isRunnerDepotError(
        await again.putRecord("again", 1, { ifRevision: null }).catch((e: unknown) => e),
        "UNAVAILABLE",
      ),
    ).toBe(true);
    await again.close?.();
    writeFileSync(join(disk.mnt, "probe"), "the mount still works");
  });
});
