/**
 * A store that answers a manifest read with an endless body (an S3 endpoint gone hostile; an attack round of
 * 2026-12-02 grew a depot by 260 MB on one delta read): every whole read of a blob the depot wrote is bounded, so
 * `GET /data` answers 503 STORE_UNAVAILABLE once it passes the version's archive size (the manifest is inside the
 * archive), over real HTTP on the fs store.
 */
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createFsStore } from "../../../src/adapters/fs/store.js";
import { createDepotClient } from "../../../src/depot/client/depot-client.js";
import type { PackageStore } from "../../../src/depot/ports.js";
import { createPackageRouter } from "../../../src/depot/server/router.js";
import { servePackageRouter } from "../../../src/depot/server/serve.js";
import { keys } from "../../../src/depot/store/records.js";

describe("a manifest read from a store that never ends it", () => {
  let dir: string;
  let store: PackageStore;
  let http: Awaited<ReturnType<typeof servePackageRouter>>;
  let manifest: string;
  /** The version's archive size: the manifest is inside it, so no more of it is read. */
  let archiveSize: number;
  const served = { bytes: 0 };

  beforeAll(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), "endless-blob-"));
    store = createFsStore(dir, { unsafeNoSync: true });
    const hostile: PackageStore = Object.create(store);
    // The manifest's blob, once known, is answered with 1 MiB chunks that never end.
    hostile.getBlob = async (digest, ...rest) => {
      if (digest !== manifest) return store.getBlob(digest, ...rest);
      const chunk = new Uint8Array(2 ** 20).fill(0x20);
      return (async function* () {
        for (;;) {
          served.bytes += chunk.length;
          yield chunk;
        }
      })();
    };
    http = await servePackageRouter(createPackageRouter(hostile), { host: "127.0.0.1", port: 0 });
    const client = createDepotClient({ baseUrl: http.url });
    await client.publish({ name: "tool", version: "1.0.0", items: [{ type: "file", path: "a", content: "a\n" }] });
    const record = (await store.getRecord<{ manifest: string; size: number }>(keys.version("tool", "1.0.0")))!.value;
    archiveSize = record.size;
    manifest = record.manifest;
  }, 60_000);

  afterAll(async () => {
    await http?.close();
    await store?.close?.();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  it("GET /data answers 503 STORE_UNAVAILABLE, having read no more than the archive's size of it", async () => {
    const answer = await fetch(`${http.url}/data/tool@1.0.0`);
    expect(answer.status).toBe(503);
    expect(await answer.json()).toMatchObject({ code: "STORE_UNAVAILABLE" });
    expect(served.bytes).toBeGreaterThan(0);
    // One chunk past the archive's size, and no more.
    expect(served.bytes).toBeLessThanOrEqual(archiveSize + 2 ** 20);
  });
});
