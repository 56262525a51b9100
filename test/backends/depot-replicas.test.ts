/**
 * Two depot replicas, each its own process (test/fixtures/depot-replica-server.ts), on one
 * PostgreSQL schema and one S3 bucket (s3rver in its own process), driven by a client that
 * sends each request to the next replica in turn: the depot's contract walk (every kind of
 * addition, summary, commit and its repeat, the race of two transactions, abandon, the
 * catalog and its ETag, the change feed, yank, downloads served and by redirect) answers as on one
 * process, whichever replica takes which request.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createTestSchema, needs } from "../fixtures/backends.js";
import { concurrentCommitsLandOnceInOrder, walkChanges } from "../fixtures/catalog-feed.js";
import { httpDigest, parseTar, storeDigest } from "../fixtures/depot.js";
import { freshPrefix, replicaS3, roundRobin, startReplica, type Replica } from "../fixtures/depot-replicas.js";
import { until } from "../fixtures/runner-service.js";

const haveDatabase = needs("postgres");
let s3: Awaited<ReturnType<typeof replicaS3>>;
let db: Awaited<ReturnType<typeof createTestSchema>>;
let replicas: Replica[] = [];
let rr: ReturnType<typeof roundRobin>;

beforeAll(async () => {
  if (!haveDatabase) return;
  s3 = await replicaS3();
  db = await createTestSchema();
  const prefix = await freshPrefix(s3, "replicas-test");
  replicas = await Promise.all([0, 1].map(() => startReplica(s3, db.schema, prefix)));
  rr = roundRobin(replicas.map((r) => r.url));
}, 60_000);
afterAll(async () => {
  for (const r of replicas) await r.stop();
  await db?.drop();
  await s3?.close();
});

/** A request through the round-robin client, its JSON body parsed when there is one. */
async function call(path: string, init: RequestInit = {}) {
  const response = await rr.fetch(path, init);
  const text = await response.text();
  return { status: response.status, headers: response.headers, json: text ? JSON.parse(text) : undefined };
}

const post = (headers: Record<string, string> = {}, body?: string): RequestInit => ({ method: "POST", headers, body });

describe("two depot replicas on PostgreSQL + S3 behind a round-robin client", () => {
  it("a transaction: open, every kind of addition, summary, commit on another replica, repeated commit", async () => {
    const opened = await call("/trans/Hello@1.0.0", post());
    expect(opened.status).toBe(201);
    const t = opened.json.transaction as string;
    const body = "#!/bin/sh\necho hello\n";
    const file = await call(
      `/add/${t}/file`,
      post({ "Pkg-Path": "bin/hello", "Pkg-Mode": "0755", "Content-Digest": httpDigest(body) }, body),
    );
    expect([file.status, file.json.size]).toEqual([201, body.length]);
    expect((await call(`/add/${t}/dir`, post({ "Pkg-Path": "var/empty", "Pkg-Mode": "0700" }))).status).toBe(201);
    expect((await call(`/add/${t}/link`, post({ "Pkg-Path": "bin/hi", "Pkg-Target": "hello" }))).status).toBe(201);
    expect((await call(`/add/${t}/license`, post({ "Pkg-License": "MIT" }, "MIT License\n"))).status).toBe(201);
    expect((await call(`/add/${t}/set`, post({ "Pkg-Attr": "description=Says%20hello" }))).status).toBe(201);
    expect((await call(`/meta/${t}/require`, post({ "Pkg-Require": "libfoo@^1.2.0" }))).status).toBe(201);
    // By reference: the other replica adds the same content with an empty body.
    const again = await call(`/add/${t}/file`, post({ "Pkg-Path": "bin/copy", "Content-Digest": httpDigest(body) }));
    expect(again.status).toBe(201);
    const summary = await call(`/summary/${t}`);
    expect(summary.json).toMatchObject({ state: "open", name: "hello", version: "1.0.0", problems: [] });

    const commit = await call(`/commit/${t}`, post());
    expect(commit.status).toBe(201);
    const repeat = await call(`/commit/${t}`, post());
    expect([repeat.status, repeat.json]).toEqual([200, commit.json]);
    expect((await call(`/summary/${t}`)).json).toMatchObject({ state: "committed", digest: commit.json.digest });
    expect((await call(`/add/${t}/file`, post({ "Pkg-Path": "late" }, "x"))).json.code).toBe("TRANSACTION_COMMITTED");
    expect((await call("/trans/hello@1.0.0", post())).json.code).toBe("VERSION_EXISTS");

    // Both replicas serve the same version; its archive (under 16 KiB: a row of PostgreSQL) from the replica itself.
    const [a, b] = await Promise.all(replicas.map(async (r) => (await fetch(`${r.url}/version/hello`)).json()));
    expect(b).toEqual(a);
    expect((await call("/depend/hello")).json).toEqual({
      name: "hello",
      version: "1.0.0",
      requires: [{ name: "libfoo", range: "^1.2.0" }],
    });
    const served = await rr.fetch("/data/hello@1.0.0", { redirect: "manual" });
    expect([served.status, served.headers.get("location")]).toEqual([200, null]);
    const bytes = new Uint8Array(await served.arrayBuffer());
    expect(storeDigest(bytes)).toBe(commit.json.digest);
    expect((await parseTar(bytes)).map((e) => e.name)).toEqual([
      ".pkg/manifest.json",
      ".pkg/licenses/MIT",
      "bin/copy",
      "bin/hello",
      "bin/hi",
      "var/empty",
    ]);
  });

  it("a larger archive is served by redirect to S3, once a replica has kept it there", async () => {
    const t = (await call("/trans/large@1.0.0", post())).json.transaction as string;
    const big = "0123456789abcdef".repeat(2048); // 32 KiB: a blob in S3, not a row
    expect((await call(`/add/${t}/file`, post({ "Pkg-Path": "big" }, big))).status).toBe(201);
    const commit = await call(`/commit/${t}`, post());
    expect(commit.status).toBe(201);
    // The archive is copied to S3 after the commit's answer: until then a replica serves it itself.
    let location: string | null = null;
    for (let i = 0; i < 200 && !location; i++) {
      const data = await rr.fetch("/data/large@1.0.0", { redirect: "manual" });
      location = data.headers.get("location");
      const bytes = location ? null : new Uint8Array(await data.arrayBuffer());
      if (bytes) expect(storeDigest(bytes)).toBe(commit.json.digest);
      else await data.arrayBuffer();
      if (!location) await new Promise((resolve) => setTimeout(resolve, 20));
    }
    expect(location).not.toBeNull();
    const bytes = new Uint8Array(await (await fetch(location!)).arrayBuffer());
    expect(storeDigest(bytes)).toBe(commit.json.digest);
    expect((await parseTar(bytes)).find((e) => e.name === "big")!.body.toString()).toBe(big);
  });

  it("two transactions for one version, committed on different replicas: one wins, the other 409; abandon 204 then 410", async () => {
    const ids: string[] = [];
    for (let i = 0; i < 3; i++) ids.push((await call("/trans/raced@1.0.0", post())).json.transaction);
    for (const [i, id] of ids.entries()) {
      expect((await call(`/add/${id}/file`, post({ "Pkg-Path": "who" }, `writer ${i}`))).status).toBe(201);
    }
    const commits = await Promise.all(
      ids.map((id, i) => fetch(`${replicas[i % 2]!.url}/commit/${id}`, { method: "POST" })),
    );
    expect(commits.map((c) => c.status).sort()).toEqual([201, 409, 409]);
    expect((await call("/version/raced")).json.versions).toHaveLength(1);

    const left = (await call("/trans/left@1.0.0", post())).json.transaction as string;
    expect((await call(`/trans/${left}`, { method: "DELETE" })).status).toBe(204);
    expect((await call(`/trans/${left}`, { method: "DELETE" })).json.code).toBe("TRANSACTION_GONE");
    expect((await call(`/commit/${left}`, post())).status).toBe(410);
  });

  it("commits spread over both replicas land once each in one dense feed, the same for either reader", async () => {
    await concurrentCommitsLandOnceInOrder(
      replicas.map((r) => r.url),
      "rr",
      40,
      16,
    );
  }, 180_000);

  it("the catalog's ETag is one across replicas and moves on both after a publish on one; a yank is seen on the other", async () => {
    const etag = (await fetch(`${replicas[0]!.url}/catalog`)).headers.get("etag")!;
    const other = await fetch(`${replicas[1]!.url}/catalog`, { headers: { "If-None-Match": etag } });
    expect(other.status).toBe(304);
    const before = (await call("/catalog?limit=1")).json.position as number;
    const t = (await call("/trans/etagged@1.0.0", post())).json.transaction as string;
    expect((await call(`/add/${t}/file`, post({ "Pkg-Path": "a" }, "a"))).status).toBe(201);
    expect((await call(`/commit/${t}`, post())).status).toBe(201);
    // The other replica learns of the append by NOTIFY as it commits (depot-catalog.md, "head.ts"): soon, not
    // necessarily before the committing replica answers.
    for (const r of replicas) {
      await until(async () => {
        const moved = await fetch(`${r.url}/catalog`, { headers: { "If-None-Match": etag } });
        await moved.arrayBuffer();
        return moved.status === 200;
      }, `the catalog's ETag moves on ${r.url}`);
    }
    const yanked = await fetch(`${replicas[0]!.url}/yank/etagged@1.0.0`, {
      method: "POST",
      headers: { "Pkg-Reason": "broken" },
    });
    expect(yanked.status).toBe(200);
    await until(
      async () => (await walkChanges(replicas[1]!.url, before, 10)).changes.length >= 2,
      "the yank reaches the other replica's feed",
    );
    const feed = await walkChanges(replicas[1]!.url, before, 10);
    expect(feed.changes).toEqual([
      expect.objectContaining({ name: "etagged", version: "1.0.0", position: before + 1 }),
      expect.objectContaining({ name: "etagged", version: "1.0.0", position: before + 2, yanked: "broken" }),
    ]);
    const data = await fetch(`${replicas[1]!.url}/data/etagged@1.0.0`, { redirect: "manual" });
    expect(data.headers.get("pkg-yanked")).toBe("broken");
  });
});
