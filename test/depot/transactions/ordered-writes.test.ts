/**
 * A request's writes on the fs store go on at each write's visibility and are flushed once,
 * before the answer (src/depot/transactions/ordered-writes.ts): through real fetch against a listening
 * server over a real fs store, with the WAL's fdatasync held or failing (patched on
 * node:fs, which wal-sync.ts calls; `syncBuiltinESMExports` carries the patch to its import).
 */
import fs from "node:fs";
import { syncBuiltinESMExports } from "node:module";
import { join } from "node:path";
import { afterAll, afterEach, describe, expect, it } from "vitest";
import { createFsStore } from "../../../src/adapters/fs/store.js";
import { walFlushChannel } from "../../../src/adapters/fs/wal-sync.js";
import { changeKey } from "../../../src/depot/catalog/changes.js";
import { packageKey, type PackageRecord } from "../../../src/depot/catalog/packages.js";
import type { PackageStore } from "../../../src/depot/ports.js";
import { keys, type ItemRecord } from "../../../src/depot/store/records.js";
import { startDepot, tempDir, type LiveDepot } from "../../fixtures/depot.js";

const cleanups: Array<() => Promise<void> | void> = [];
afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
});

const realFdatasync = fs.fdatasync;
/** The flushes held now (see holdFlushes), let go when a test ends early. */
let releaseHeld: (() => void) | undefined;
/** Puts node:fs's fdatasync back (and into every ESM import of it); held flushes go on. */
function restoreFdatasync(): void {
  fs.fdatasync = realFdatasync;
  syncBuiltinESMExports();
  releaseHeld?.();
  releaseHeld = undefined;
}
afterEach(restoreFdatasync);

/** Holds every fdatasync of this process until `release()`; later ones then run at once. */
function holdFlushes(): { held(): number; release(): void } {
  let waiting: Array<() => void> | null = [];
  fs.fdatasync = ((fd: number, callback: (error: NodeJS.ErrnoException | null) => void) => {
    if (waiting) waiting.push(() => realFdatasync(fd, callback));
    else realFdatasync(fd, callback);
  }) as typeof fs.fdatasync;
  syncBuiltinESMExports();
  const release = () => {
    const run = waiting ?? [];
    waiting = null;
    for (const go of run) go();
  };
  releaseHeld = release;
  return { held: () => waiting?.length ?? 0, release };
}

/** Polls `check` (no timing assertion: a generous bound, then the message). */
async function until(check: () => Promise<boolean>, message: string): Promise<void> {
  const deadline = Date.now() + 60_000;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(message);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

async function serve(prefix: string): Promise<{ store: PackageStore; depot: LiveDepot; dir: string }> {
  const tmp = await tempDir(prefix);
  const store = createFsStore(tmp.dir);
  const depot = await startDepot(store);
  cleanups.push(
    tmp.cleanup,
    () => store.close?.(),
    () => depot.close(),
  );
  return { store, depot, dir: tmp.dir };
}

async function open(url: string, spec: string): Promise<string> {
  const opened = await fetch(`${url}/trans/${spec}`, { method: "POST" });
  expect(opened.status).toBe(201);
  return ((await opened.json()) as { transaction: string }).transaction;
}

const addFile = (url: string, id: string, body: string) =>
  fetch(`${url}/add/${id}/file`, { method: "POST", headers: { "Pkg-Path": "f" }, body });

/** A request whose settling is observed without awaiting it. */
function watch(request: Promise<Response>): { answered(): boolean; response: Promise<Response> } {
  let answered = false;
  const response = request.finally(() => (answered = true));
  response.catch(() => undefined); // a test that fails before awaiting it leaves no unhandled rejection
  return { answered: () => answered, response };
}

describe("ordered writes on the fs store (one flush per request)", () => {
  it(
    "an addition and a commit answer only after their flush, and go on while it is held",
    { timeout: 120_000 },
    async () => {
      const { store, depot } = await serve("ordered-held-");
      const id = await open(depot.url, "held@1.0.0");

      // The addition: its blob and its confirmed item become visible with the flush held.
      let hold = holdFlushes();
      const added = watch(addFile(depot.url, id, "held bytes\n"));
      await until(
        async () => (await store.getRecord<ItemRecord>(keys.item(id, "f")))?.value.state === "added" && hold.held() > 0,
        "the item never became `added` while the WAL flush was held (each write waited for its own flush)",
      );
      // A round trip through the same server: the addition had every chance to answer.
      expect((await fetch(`${depot.url}/summary/${id}`)).status).toBe(200);
      expect(added.answered()).toBe(false);
      hold.release();
      expect((await added.response).status).toBe(201);
      restoreFdatasync();

      // The commit: the version listed and its change entry written, all with the flush held.
      hold = holdFlushes();
      const committed = watch(fetch(`${depot.url}/commit/${id}`, { method: "POST" }));
      await until(
        async () =>
          (await store.getRecord<PackageRecord>(packageKey("held")))?.value.versions.includes("1.0.0") === true &&
          (await store.getRecord(changeKey(1))) !== null &&
          hold.held() > 0,
        "the version and its change entry never became visible while the WAL flush was held",
      );
      const during = (await (await fetch(`${depot.url}/summary/${id}`)).json()) as { state: string };
      // `committed` is written after the flush: a reader that sees it may rely on the version being durable.
      expect(during.state).toBe("committing");
      expect(committed.answered()).toBe(false);
      hold.release();
      expect((await committed.response).status).toBe(201);
      const after = (await (await fetch(`${depot.url}/summary/${id}`)).json()) as { state: string };
      expect(after.state).toBe("committed");
    },
  );

  it(
    "after a failed WAL flush no request is acknowledged, even once the disk writes again",
    { timeout: 120_000 },
    async () => {
      const { depot } = await serve("ordered-eio-");
      const id = await open(depot.url, "eio@1.0.0");
      fs.fdatasync = ((_fd: number, callback: (error: NodeJS.ErrnoException | null) => void) => {
        setImmediate(() => callback(Object.assign(new Error("EIO: i/o error, fdatasync"), { code: "EIO" })));
      }) as typeof fs.fdatasync;
      syncBuiltinESMExports();
      const added = await addFile(depot.url, id, "lost bytes\n");
      expect(added.status).toBe(503);
      restoreFdatasync();
      // The disk writes again: nothing after the failed flush is acknowledged all the same.
      expect((await fetch(`${depot.url}/commit/${id}`, { method: "POST" })).status).toBe(503);
      expect((await fetch(`${depot.url}/trans/eio2@1.0.0`, { method: "POST" })).status).toBe(503);
    },
  );

  it("a one-file publish costs at most three WAL flushes, one per request", { timeout: 120_000 }, async () => {
    const { depot, dir } = await serve("ordered-count-");
    const wal = join(dir, "records.db-wal");
    let flushes = 0;
    const count = (message: unknown) => {
      if ((message as { wal: string }).wal === wal) flushes++;
    };
    const publish = async (i: number) => {
      const id = await open(depot.url, `count${i}@1.0.0`);
      expect((await addFile(depot.url, id, `count ${i}\n`)).status).toBe(201);
      expect((await fetch(`${depot.url}/commit/${id}`, { method: "POST" })).status).toBe(201);
    };
    await publish(0); // the store's first writes (format record, WAL directory) before counting
    walFlushChannel.subscribe(count);
    try {
      for (let i = 1; i <= 10; i++) await publish(i);
    } finally {
      walFlushChannel.unsubscribe(count);
    }
    // Before ordered writes: 8 a publish (the blob, the item, `committing`, the manifest, the
    // version, the listing and the change entry each waited for their own).
    expect(flushes).toBeGreaterThanOrEqual(10);
    expect(flushes).toBeLessThanOrEqual(30);
  });
});
