/**
 * The change sequence, the paged catalog and `since`, crash roll-forward and the store
 * format upgrade, over real HTTP on the fs store (PostgreSQL + S3: depot/catalog/feed-on-postgres-s3.test.ts).
 */
import { execFile } from "node:child_process";
import { cp, readFile } from "node:fs/promises";
import { promisify } from "node:util";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createFsStore } from "../../../src/adapters/fs/store.js";
import { createMemoryStore } from "../../../src/adapters/memory/store.js";
import { STORE_FORMAT, upgradeStore, type FormatRecord } from "../../../src/depot/store/format.js";
import type { PackageStore } from "../../../src/depot/ports.js";
import {
  concurrentCommitsLandOnceInOrder,
  pagedWalkWhileCommitsLand,
  walkChanges,
  type SinceAnswer,
} from "../../fixtures/catalog-feed.js";
import {
  add,
  openTransaction,
  publish,
  startDepot,
  storeDigest,
  tempDir,
  type LiveDepot,
} from "../../fixtures/depot.js";
import { bundleDepotServer, spawnDepot, type DepotProcess } from "../../fixtures/depot-process.js";

async function expectProblem(
  response: Response | Promise<Response>,
  status: number,
  code: string,
): Promise<Record<string, unknown>> {
  const r = await response;
  expect(r.headers.get("content-type")).toBe("application/problem+json");
  const body = (await r.json()) as Record<string, unknown>;
  expect({ status: r.status, code: body.code }).toEqual({ status, code });
  return body;
}

const execFileP = promisify(execFile);

const cleanups: Array<() => Promise<unknown>> = [];
afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
});

describe("change sequence and paged catalog (fs store)", () => {
  let depot: LiveDepot;
  let store: PackageStore;
  beforeAll(async () => {
    const tmp = await tempDir("depot-feed-");
    cleanups.push(tmp.cleanup);
    // fsync off keeps this quick; the crash tests below run with it on.
    store = createFsStore(tmp.dir, { unsafeNoSync: true });
    depot = await startDepot(store);
    cleanups.push(() => depot.close());
  });

  it("commits of 50 different packages at concurrency 16 all land, each exactly once in the change feed, in one order", async () => {
    await concurrentCommitsLandOnceInOrder([depot.url], "fifty");
  }, 180_000);

  it("a paged walk of the catalog while commits land sees every package that existed at its start exactly once", async () => {
    await pagedWalkWhileCommitsLand(depot.url, "walk");
  }, 180_000);

  it("answers 304 from the sequence head alone: the ETag moves with every commit and with nothing else", async () => {
    const first = await fetch(`${depot.url}/catalog?limit=1`);
    const etag = first.headers.get("etag")!;
    await first.arrayBuffer();
    // Reads of packages, a failed commit and an abandoned transaction change nothing.
    await (await fetch(`${depot.url}/version/fifty-1`)).arrayBuffer();
    await expectProblem(fetch(`${depot.url}/trans/fifty-1@1.0.0`, { method: "POST" }), 409, "VERSION_EXISTS");
    const id = await openTransaction(depot.url, "abandoned@1.0.0");
    expect((await fetch(`${depot.url}/trans/${id}`, { method: "DELETE" })).status).toBe(204);
    for (const query of ["", "?limit=3", "?since=1"]) {
      expect((await fetch(`${depot.url}/catalog${query}`, { headers: { "If-None-Match": etag } })).status, query).toBe(
        304,
      );
    }
    expect((await publish(depot.url, "fifty-1@1.0.1", [{ type: "file", path: "f", body: "x" }])).status).toBe(201);
    const after = await fetch(`${depot.url}/catalog?limit=1`, { headers: { "If-None-Match": etag } });
    expect(after.status).toBe(200);
    expect(after.headers.get("etag")).not.toBe(etag);
    const body = (await after.json()) as SinceAnswer;
    // since = the old head: exactly the one change, with the package's current versions.
    const since = (await (await fetch(`${depot.url}/catalog?since=${body.position - 1}`)).json()) as SinceAnswer;
    expect(since.changes).toEqual([{ position: body.position, name: "fifty-1", version: "1.0.1" }]);
    expect(since.packages).toEqual({
      "fifty-1": expect.objectContaining({ latest: "1.0.1", versions: ["1.0.0", "1.0.1"] }),
    });
  });

  it("a repeated commit of the same transaction appends nothing", async () => {
    const id = await openTransaction(depot.url, "twice@1.0.0");
    expect((await add(depot.url, id, { type: "file", path: "f", body: "f" })).status).toBe(201);
    const head = ((await (await fetch(`${depot.url}/catalog?limit=1`)).json()) as SinceAnswer).position;
    const answers = await Promise.all([1, 2, 3].map(() => fetch(`${depot.url}/commit/${id}`, { method: "POST" })));
    expect(answers.map((a) => a.status).sort()).toEqual(expect.arrayContaining([201]));
    for (const a of answers) expect([200, 201, 409]).toContain(a.status);
    expect((await fetch(`${depot.url}/commit/${id}`, { method: "POST" })).status).toBe(200);
    const { changes } = await walkChanges(depot.url, head, 100);
    expect(changes.filter((c) => c.name === "twice")).toHaveLength(1);
  });
});

describe("a commit whose process was killed (fs store, child process)", () => {
  let dir: string;
  let bundle: string | null;
  let server: DepotProcess | undefined;
  beforeAll(async () => {
    const tmp = await tempDir("depot-kill-");
    cleanups.push(tmp.cleanup);
    dir = tmp.dir;
    const bin = await tempDir("depot-kill-bin-");
    cleanups.push(bin.cleanup);
    bundle = await bundleDepotServer(bin.dir);
    cleanups.push(async () => server?.kill());
  });

  /** Opens `spec` with one file and commits it on a server that dies before writing a record under `prefix`. */
  async function commitThatDies(spec: string, prefix: string): Promise<string> {
    server = await spawnDepot(dir, 0, bundle, { DEPOT_DIE_BEFORE_PUT: "never/" });
    const id = await openTransaction(server.url, spec);
    expect((await add(server.url, id, { type: "file", path: "bin/tool", body: `${spec}\n` })).status).toBe(201);
    await server.kill();
    server = await spawnDepot(dir, 0, bundle, { DEPOT_DIE_BEFORE_PUT: prefix });
    const answer = await fetch(`${server.url}/commit/${id}`, { method: "POST" }).then(
      (r) => r.status,
      () => "connection lost",
    );
    expect(answer).toBe("connection lost");
    await server.kill();
    return id;
  }

  it("killed between the version write and the sequence write: on restart `since` has it once, the summary says committed, the slot is free", async () => {
    server = await spawnDepot(dir, 0, bundle);
    expect((await publish(server.url, "before@1.0.0", [{ type: "file", path: "f", body: "b" }])).status).toBe(201);
    const head = ((await (await fetch(`${server.url}/catalog?limit=1`)).json()) as SinceAnswer).position;
    await server.kill();

    const id = await commitThatDies("killed@1.0.0", "seq/");
    server = await spawnDepot(dir, 0, bundle);
    // No retry and no waiting: the restart rolled it forward.
    const since = await walkChanges(server.url, head, 10);
    expect(since.changes).toEqual([{ position: head + 1, name: "killed", version: "1.0.0" }]);
    const summary = (await (await fetch(`${server.url}/summary/${id}`)).json()) as { state: string; digest: string };
    expect(summary.state).toBe("committed");
    const data = await fetch(`${server.url}/data/killed@1.0.0`);
    expect(storeDigest(new Uint8Array(await data.arrayBuffer()))).toBe(summary.digest);
    // The slot is free and the transaction answers as committed: 410 for changes, 200 for a repeated commit.
    expect((await fetch(`${server.url}/trans/${id}`, { method: "DELETE" })).status).toBe(410);
    expect((await fetch(`${server.url}/commit/${id}`, { method: "POST" })).status).toBe(200);
    const slots = await readSlots(dir);
    expect(slots.flat()).not.toContain(id);
    // And it is still there exactly once after another restart.
    await server.kill();
    server = await spawnDepot(dir, 0, bundle);
    expect((await walkChanges(server.url, head, 10)).changes).toHaveLength(1);
    await server.kill();
  });

  it("killed before its version record: on restart the transaction is open again at once (DELETE 204, no lease wait)", async () => {
    const id = await commitThatDies("early@1.0.0", "version/");
    server = await spawnDepot(dir, 0, bundle);
    const summary = (await (await fetch(`${server.url}/summary/${id}`)).json()) as {
      state: string;
      totals: { items: number };
    };
    expect(summary).toMatchObject({ state: "open", totals: { items: 1 } });
    expect((await add(server.url, id, { type: "file", path: "more", body: "m" })).status).toBe(201);
    expect((await fetch(`${server.url}/trans/${id}`, { method: "DELETE" })).status).toBe(204);
    expect((await readSlots(dir)).flat()).not.toContain(id);
    await server.kill();
  });

  it("killed after its sequence write, before its claim is cleared and the transaction committed: not appended twice", async () => {
    server = await spawnDepot(dir, 0, bundle);
    const head = ((await (await fetch(`${server.url}/catalog?limit=1`)).json()) as SinceAnswer).position;
    await server.kill();
    // The second write of pkg/ in the commit is the one after the sequence entry.
    const id = await commitThatDies("late@1.0.0", "pkg/#2");
    server = await spawnDepot(dir, 0, bundle);
    expect((await walkChanges(server.url, head, 10)).changes.map((c) => c.name)).toEqual(["late"]);
    expect(((await (await fetch(`${server.url}/summary/${id}`)).json()) as { state: string }).state).toBe("committed");
    await server.kill();
  });
});

/** The ids in every slot record of an fs store. */
async function readSlots(dir: string): Promise<string[][]> {
  const store = createFsStore(dir);
  const out: string[][] = [];
  for (const key of (await store.listRecords("slots/")).keys)
    out.push((await store.getRecord<{ ids: string[] }>(key))!.value.ids);
  await store.close?.();
  return out;
}

describe("store format", () => {
  const fixture = join(import.meta.dirname, "..", "..", "fixtures", "store-0.1.0");

  it("a 0.1.0 store (written by 0.1.0's code) is upgraded on open and serves every version with its old digest", async () => {
    const tmp = await tempDir("depot-upgrade-");
    cleanups.push(tmp.cleanup);
    await cp(join(fixture, "store"), tmp.dir, { recursive: true });
    const expected = JSON.parse(await readFile(join(fixture, "expected.json"), "utf8")) as {
      versions: Record<string, { digest: string; bytes: string }>;
      delta: Record<string, string>;
      catalog: { packages: Record<string, { latest: string; versions: string[] }> };
    };
    const store = createFsStore(tmp.dir);
    const depot = await startDepot(store);
    try {
      for (const [spec, { digest, bytes }] of Object.entries(expected.versions)) {
        const info = (await (await fetch(`${depot.url}/version/${spec}`)).json()) as {
          versions: Array<{ digest: string }>;
        };
        expect(info.versions[0]!.digest, spec).toBe(digest);
        const data = await fetch(`${depot.url}/data/${spec}`);
        expect(data.status, spec).toBe(200);
        expect(storeDigest(new Uint8Array(await data.arrayBuffer())), spec).toBe(bytes);
      }
      for (const [path, digest] of Object.entries(expected.delta)) {
        const delta = await fetch(`${depot.url}/data/${path}`);
        expect(storeDigest(new Uint8Array(await delta.arrayBuffer()))).toBe(digest);
      }
      // The same packages and versions as 0.1.0's catalog; every version once in the sequence.
      const catalog = (await (await fetch(`${depot.url}/catalog`)).json()) as SinceAnswer;
      for (const [name, entry] of Object.entries(expected.catalog.packages)) {
        expect(catalog.packages[name], name).toMatchObject({ latest: entry.latest, versions: entry.versions });
      }
      expect(Object.keys(catalog.packages).sort()).toEqual(Object.keys(expected.catalog.packages).sort());
      const { changes } = await walkChanges(depot.url, 0, 100);
      expect(changes.map((c) => `${c.name}@${c.version}`).sort()).toEqual(Object.keys(expected.versions).sort());
      const format = (await store.getRecord<FormatRecord>("format"))!.value;
      expect(format).toMatchObject({ format: STORE_FORMAT, upgradedFrom: 1 });
      // Publishing goes on where it left off.
      expect((await publish(depot.url, "tools@1.2.0", [{ type: "file", path: "README", body: "1.2\n" }])).status).toBe(
        201,
      );
      expect((await walkChanges(depot.url, changes.length, 10)).changes).toEqual([
        { position: changes.length + 1, name: "tools", version: "1.2.0" },
      ]);
    } finally {
      await depot.close();
      await store.close?.();
    }
  });

  it("upgradeStore resumes a killed upgrade without appending anything twice, and is a no-op on a current store", async () => {
    const tmp = await tempDir("depot-upgrade-resume-");
    cleanups.push(tmp.cleanup);
    await cp(join(fixture, "store"), tmp.dir, { recursive: true });
    // A store whose upgrade died after two versions: it published them, then stopped.
    let writes = 0;
    const inner = createFsStore(tmp.dir);
    const dying: PackageStore = {
      ...inner,
      async putRecord(key, value, cond) {
        if (key.startsWith("seq/") && ++writes > 2) throw new Error("killed");
        return inner.putRecord(key, value, cond);
      },
    };
    await expect(upgradeStore(dying)).rejects.toThrow("killed");
    // (the claim is released by the failed run; a killed process's claim goes stale instead)
    expect(await upgradeStore(inner)).toMatchObject({ from: 1, to: STORE_FORMAT, versions: 5 });
    expect(await upgradeStore(inner)).toMatchObject({ from: STORE_FORMAT, to: STORE_FORMAT, versions: 0 });
    const depot = await startDepot(inner);
    try {
      const { changes } = await walkChanges(depot.url, 0, 100);
      expect(changes.map((c) => `${c.name}@${c.version}`).sort()).toEqual([
        "app@2.0.0",
        "lib@0.1.0",
        "meta@1.0.0",
        "tools@1.0.0",
        "tools@1.1.0",
      ]);
    } finally {
      await depot.close();
      await inner.close?.();
    }
  });

  it("runner-depot migrate <data> upgrades a 0.1.0 serve folder in place, then says there is nothing to do", async () => {
    const tmp = await tempDir("depot-migrate-cli-");
    cleanups.push(tmp.cleanup);
    await cp(join(fixture, "store"), join(tmp.dir, "depot"), { recursive: true });
    const cli = join(import.meta.dirname, "..", "..", "..", "src", "cli", "main.ts");
    const run = (...args: string[]) =>
      execFileP(process.execPath, ["--import", "tsx", cli, ...args], { encoding: "utf8" });
    const first = await run("migrate", tmp.dir);
    expect(first.stdout).toContain(`upgraded from store format 1 to ${STORE_FORMAT} (5 versions listed and sequenced)`);
    expect((await run("migrate", tmp.dir)).stdout).toContain(`already store format ${STORE_FORMAT}; nothing to do`);
    const store = createFsStore(join(tmp.dir, "depot"));
    const depot = await startDepot(store);
    try {
      const expected = JSON.parse(await readFile(join(fixture, "expected.json"), "utf8")) as {
        versions: Record<string, { bytes: string }>;
      };
      for (const [spec, { bytes }] of Object.entries(expected.versions)) {
        expect(storeDigest(new Uint8Array(await (await fetch(`${depot.url}/data/${spec}`)).arrayBuffer())), spec).toBe(
          bytes,
        );
      }
    } finally {
      await depot.close();
      await store.close?.();
    }
    // A newer store: refused with the reason, exit code 1.
    const newer = createFsStore(join(tmp.dir, "depot"));
    const format = (await newer.getRecord<FormatRecord>("format"))!;
    await newer.putRecord("format", { ...format.value, format: STORE_FORMAT + 1 }, { ifRevision: format.revision });
    await newer.close?.();
    const refused = await run("migrate", tmp.dir).then(
      () => null,
      (error: { code: number; stderr: string }) => error,
    );
    expect(refused?.code).toBe(1);
    expect(refused?.stderr).toContain(`format ${STORE_FORMAT + 1}`);
  });

  it("a store of a newer format is refused with a clear error, before anything is read or written", async () => {
    const store = createMemoryStore();
    await store.putRecord(
      "format",
      { format: STORE_FORMAT + 1, storeId: "x", createdAt: new Date().toISOString() },
      { ifRevision: null },
    );
    const depot = await startDepot(store);
    try {
      const problem = await expectProblem(fetch(`${depot.url}/catalog`), 503, "STORE_FORMAT_UNSUPPORTED");
      expect(problem.detail).toContain(`format ${STORE_FORMAT + 1}`);
      await expectProblem(fetch(`${depot.url}/trans/x@1.0.0`, { method: "POST" }), 503, "STORE_FORMAT_UNSUPPORTED");
      expect((await store.listRecords("")).keys).toEqual(["format"]);
    } finally {
      await depot.close();
    }
  });
});
