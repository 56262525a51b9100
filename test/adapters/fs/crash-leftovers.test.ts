/**
 * What a machine crash can leave behind on the fs store, and how the depot copes
 * (docs/decisions/depot-publish-durability.md): a transaction whose lazily written item
 * count a crash rolled back is held to the per-transaction item limit at commit (413
 * `TOO_MANY_ITEMS`). The crash is reproduced by writing what it leaves through the store.
 * (Torn record files, which the file layout could leave, no longer exist: records.db
 * loses at most the last commits whole, in order.)
 */
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { createFsStore } from "../../../src/adapters/fs/store.js";
import type { PackageStore } from "../../../src/depot/ports.js";
import { keys, type TransactionRecord } from "../../../src/depot/store/records.js";
import { createPackageRouter } from "../../../src/depot/server/router.js";
import { servePackageRouter, type PackageServer } from "../../../src/depot/server/serve.js";

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

async function start(
  options: Parameters<typeof createPackageRouter>[1] = {},
): Promise<{ url: string; router: ReturnType<typeof createPackageRouter> }> {
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
  it("a transaction whose lost item count let it pass the item limit is refused at commit with 413 TOO_MANY_ITEMS", async () => {
    const { url } = await start({ limits: { items: 3 } });
    const id = await open(url, "counted@1.0.0");
    for (const file of ["a", "b", "c"]) expect((await addFile(url, id, file)).status).toBe(201);
    expect((await addFile(url, id, "d")).status).toBe(413);
    // The crash rolled the lazily written count back (the rename of its last swaps lost).
    const current = (await store.getRecord<TransactionRecord>(keys.trans(id)))!;
    expect(
      await store.putRecord(
        keys.trans(id),
        { ...current.value, itemCount: 0, bytes: 0 },
        { ifRevision: current.revision },
      ),
    ).not.toBeNull();
    for (const file of ["d", "e"]) expect((await addFile(url, id, file)).status).toBe(201);

    const commit = await fetch(`${url}/commit/${id}`, { method: "POST" });
    expect(commit.status).toBe(413);
    expect(await commit.json()).toMatchObject({ code: "TOO_MANY_ITEMS" });
    expect((await fetch(`${url}/version/counted`)).status).toBe(404);
    // Back to open with the count recounted, so no addition passes the limit again.
    const summary = (await (await fetch(`${url}/summary/${id}`)).json()) as {
      state: string;
      totals: { items: number };
    };
    expect(summary).toMatchObject({ state: "open", totals: { items: 5 } });
    expect((await addFile(url, id, "f")).status).toBe(413);
    expect((await fetch(`${url}/trans/${id}`, { method: "DELETE" })).status).toBe(204);
  });
});
