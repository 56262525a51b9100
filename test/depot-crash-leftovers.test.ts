/**
 * What a machine crash can leave behind on the fs store, and how the depot cleans it up
 * (docs/decisions/depot-publish-durability.md): torn lazy record files (never flushed:
 * empty, NUL-filled, or cut short after the lazy-create mark) are removed by any delete of
 * their key and by garbage collection, and a transaction whose lazily written item count
 * a crash rolled back is held to the per-transaction item limit at commit (413
 * `TOO_MANY_ITEMS`). The crash is reproduced by writing what it leaves, through the
 * store's own file names.
 */
import { mkdir, mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { recordPath } from "../src/adapters/fs/record-keys.js";
import { createFsStore } from "../src/adapters/fs/store.js";
import type { PackageStore } from "../src/depot/ports.js";
import { keys, type TransactionRecord } from "../src/depot/records.js";
import { createPackageRouter } from "../src/depot/router.js";
import { servePackageRouter, type PackageServer } from "../src/depot/serve.js";

let tmp: string;
let store: PackageStore;
let server: PackageServer | undefined;

beforeEach(async () => {
  tmp = await mkdtemp(path.join(os.tmpdir(), "depot-leftovers-"));
  store = createFsStore(path.join(tmp, "store"));
});

afterEach(async () => {
  await server?.close();
  server = undefined;
  await store.close?.();
  await rm(tmp, { recursive: true, force: true });
});

const recordsDir = () => path.join(tmp, "store", "records");

/** What a power loss can leave of a lazy create of `key`: the name with `kind` of body. */
async function tear(key: string, kind: "empty" | "zeros" | "marked"): Promise<string> {
  const file = recordPath(recordsDir(), key);
  await mkdir(path.dirname(file), { recursive: true });
  await writeFile(file, kind === "empty" ? "" : kind === "zeros" ? Buffer.alloc(64) : ' {"key":"cut sh');
  return file;
}

/** Record files under a directory of the store, recursively (lock and temp files aside). */
async function filesUnder(dir: string): Promise<string[]> {
  const entries = await readdir(dir, { recursive: true, withFileTypes: true }).catch(() => []);
  return entries.filter((e) => e.isFile() && e.name.endsWith("~")).map((e) => e.name);
}

describe("a create meeting a torn record another process removes", () => {
  it("creates the record: the torn file gone while it waited for the lock leaves the key free", async () => {
    const key = "titem/lost/0123abcd";
    const file = await tear(key, "marked");
    // Another process's delete of the key holds its lock (another host: judged by age alone).
    const lock = `${file}.lock`;
    await writeFile(lock, JSON.stringify({ pid: 1, host: "another-host", incarnation: "x" }));
    const tmpDir = path.join(tmp, "store", "tmp");
    const created = store.putRecord(key, { v: 1 }, { ifRevision: null, lazy: true });
    // The create's temp file is written before it meets the torn record and waits for the lock.
    for (;;) {
      const names = await readdir(tmpDir).catch(() => [] as string[]);
      if (names.some((n) => !n.startsWith("owner-"))) break;
      await new Promise((r) => setTimeout(r, 5));
    }
    // That delete removes the torn file, then lets the lock go.
    await rm(file);
    await rm(lock);
    const revision = await created;
    expect(revision).not.toBeNull();
    expect(await store.getRecord(key)).toEqual({ value: { v: 1 }, revision });
  });
});

async function start(options: Parameters<typeof createPackageRouter>[1] = {}): Promise<{ url: string; router: ReturnType<typeof createPackageRouter> }> {
  const router = createPackageRouter(store, options);
  server = await servePackageRouter(router, { host: "127.0.0.1", port: 0 });
  return { url: server.url, router };
}

async function open(url: string, spec: string): Promise<string> {
  const response = await fetch(`${url}/trans/${spec}`, { method: "POST" });
  expect(response.status).toBe(201);
  return ((await response.json()) as { transaction: string }).transaction;
}

async function addFile(url: string, id: string, filePath: string): Promise<Response> {
  return fetch(`${url}/add/${id}/file`, { method: "POST", headers: { "Pkg-Path": filePath }, body: `${filePath}\n` });
}

describe("after a machine crash", () => {
  it("a delete removes a torn lazy record file, which still reads as absent", async () => {
    for (const kind of ["empty", "zeros", "marked"] as const) {
      const file = await tear(`leftover/${kind}`, kind);
      expect(await store.getRecord(`leftover/${kind}`)).toBeNull();
      expect(await store.deleteRecord(`leftover/${kind}`)).toBe(false);
      await expect(readFile(file), kind).rejects.toMatchObject({ code: "ENOENT" });
    }
    // A whole record is deleted only as before (its revision must match).
    const revision = await store.putRecord("leftover/whole", { v: 1 }, { ifRevision: null, lazy: true });
    expect(await store.deleteRecord("leftover/whole", { ifRevision: "another" })).toBe(false);
    expect(await store.getRecord("leftover/whole")).toEqual({ value: { v: 1 }, revision });
  });

  it("abandoning a transaction removes its torn item and marker records with the whole ones", async () => {
    const { url } = await start();
    const id = await open(url, "torn-items@1.0.0");
    expect((await addFile(url, id, "bin/tool")).status).toBe(201);
    // Pending creates and markers of additions the crash cut (never answered 201).
    await tear(keys.item(id, "lib/cut.so"), "marked");
    await tear(keys.item(id, "share/empty"), "empty");
    await tear(keys.dirMark(id, "share"), "zeros");
    expect(await filesUnder(path.join(recordsDir(), "titem"))).toHaveLength(3);
    expect((await fetch(`${url}/trans/${id}`, { method: "DELETE" })).status).toBe(204);
    expect(await filesUnder(path.join(recordsDir(), "titem"))).toEqual([]);
    expect(await filesUnder(path.join(recordsDir(), "tdir"))).toEqual([]);
  });

  it("garbage collection removes a torn transaction record and every item record of that lost transaction", async () => {
    const { url, router } = await start();
    // A transaction the crash lost whole: its record torn, its items left behind.
    const id = await open(url, "lost@1.0.0");
    expect((await addFile(url, id, "a/one")).status).toBe(201);
    expect((await addFile(url, id, "b/two")).status).toBe(201);
    await tear(keys.item(id, "c/three"), "marked");
    await writeFile(recordPath(recordsDir(), keys.trans(id)), "");
    expect((await fetch(`${url}/summary/${id}`)).status).toBe(404);
    // One that lives on is left alone.
    const live = await open(url, "kept@1.0.0");
    expect((await addFile(url, live, "x")).status).toBe(201);

    await router.collectGarbage();
    expect(await filesUnder(path.join(recordsDir(), "titem", id))).toEqual([]);
    expect(await filesUnder(path.join(recordsDir(), "tdir", id))).toEqual([]);
    expect((await store.listRecords(keys.transactions)).keys).toEqual([keys.trans(live)]);
    expect(await filesUnder(path.join(recordsDir(), "titem", live))).toHaveLength(1);
    expect((await fetch(`${url}/commit/${live}`, { method: "POST" })).status).toBe(201);
  });

  it("a transaction whose lost item count let it pass the item limit is refused at commit with 413 TOO_MANY_ITEMS", async () => {
    const { url } = await start({ limits: { items: 3 } });
    const id = await open(url, "counted@1.0.0");
    for (const file of ["a", "b", "c"]) expect((await addFile(url, id, file)).status).toBe(201);
    expect((await addFile(url, id, "d")).status).toBe(413);
    // The crash rolled the lazily written count back (the rename of its last swaps lost).
    const current = (await store.getRecord<TransactionRecord>(keys.trans(id)))!;
    expect(await store.putRecord(keys.trans(id), { ...current.value, itemCount: 0, bytes: 0 }, { ifRevision: current.revision })).not.toBeNull();
    for (const file of ["d", "e"]) expect((await addFile(url, id, file)).status).toBe(201);

    const commit = await fetch(`${url}/commit/${id}`, { method: "POST" });
    expect(commit.status).toBe(413);
    expect(await commit.json()).toMatchObject({ code: "TOO_MANY_ITEMS" });
    expect((await fetch(`${url}/version/counted`)).status).toBe(404);
    // Back to open with the count recounted, so no addition passes the limit again.
    const summary = (await (await fetch(`${url}/summary/${id}`)).json()) as { state: string; totals: { items: number } };
    expect(summary).toMatchObject({ state: "open", totals: { items: 5 } });
    expect((await addFile(url, id, "f")).status).toBe(413);
    expect((await fetch(`${url}/trans/${id}`, { method: "DELETE" })).status).toBe(204);
  });
});
