/**
 * The depot router over real HTTP: a real listening server (servePackageRouter on
 * 127.0.0.1:0) and real fetch. Every status and code of depot-api.md is provoked here.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createMemoryStore } from "../../../src/adapters/memory/store.js";
import { createFsStore } from "../../../src/adapters/fs/store.js";
import type { PackageManifest } from "../../../src/depot/package/archive.js";
import { referenceArchive } from "../../fixtures/archive-reference.js";
import { bearerTokens } from "../../../src/depot/server/auth.js";
import type { PackageStore } from "../../../src/depot/ports.js";
import { createPackageRouter } from "../../../src/depot/server/router.js";
import { servePackageRouter } from "../../../src/depot/server/serve.js";
import { isLoopbackHost } from "../../../src/loopback.js";
import { RunnerDepotError } from "../../../src/errors.js";
import {
  add,
  httpDigest,
  openTransaction,
  parseTar,
  publish,
  startDepot,
  storeDigest,
  tempDir,
  type Addition,
  type LiveDepot,
} from "../../fixtures/depot.js";

const FULL: Addition[] = [
  { type: "file", path: "bin/tool", body: "#!/bin/sh\necho hi\n", mode: "0755" },
  { type: "file", path: "share/doc/read me.txt", body: "héllo wörld" },
  { type: "dir", path: "share", mode: "0750" },
  { type: "link", path: "share/tool", target: "../bin/tool" },
  { type: "license", name: "MIT", body: "Permission is hereby granted…" },
  { type: "set", attrs: { description: "A tool, with commas", homepage: "https://example.test/t" } },
  { type: "require", requires: ["libfoo@^1.2.0", "libbar"] },
];

async function problem(response: Response): Promise<Record<string, unknown>> {
  expect(response.headers.get("content-type")).toBe("application/problem+json");
  const body = (await response.json()) as Record<string, unknown>;
  expect(body.status).toBe(response.status);
  expect(typeof body.type).toBe("string");
  expect(typeof body.title).toBe("string");
  expect(typeof body.detail).toBe("string");
  return body;
}

async function expectProblem(
  response: Response | Promise<Response>,
  status: number,
  code: string,
): Promise<Record<string, unknown>> {
  const r = await response;
  const body = await problem(r);
  expect({ status: r.status, code: body.code }).toEqual({ status, code });
  return body;
}

for (const kind of ["memory", "fs"] as const) {
  describe(`publish and read (${kind} store)`, () => {
    let depot: LiveDepot;
    let cleanup = async () => undefined as void;
    let store: PackageStore;
    beforeAll(async () => {
      if (kind === "fs") {
        const tmp = await tempDir();
        cleanup = tmp.cleanup;
        store = createFsStore(tmp.dir);
      } else {
        store = createMemoryStore();
      }
      depot = await startDepot(store);
    });
    afterAll(async () => {
      await depot.close();
      await cleanup();
    });

    it("publishes file, dir, link, licence, attributes and requires, and serves them back", async () => {
      const commit = await publish(depot.url, "Tool@1.0.0", FULL);
      expect(commit.status).toBe(201);
      expect(commit.headers.get("location")).toBe("/data/tool@1.0.0");
      const committed = (await commit.json()) as { url: string; name: string; version: string; digest: string };
      expect(committed).toMatchObject({ url: "/data/tool@1.0.0", name: "tool", version: "1.0.0" });

      const catalog = (await (await fetch(`${depot.url}/catalog`)).json()) as {
        packages: Record<string, { latest: string; versions: string[] }>;
        count: number;
      };
      expect(catalog.count).toBe(1);
      expect(catalog.packages.tool).toMatchObject({ latest: "1.0.0", versions: ["1.0.0"] });

      const version = (await (await fetch(`${depot.url}/version/TOOL`)).json()) as {
        name: string;
        latest: string;
        versions: Array<Record<string, unknown>>;
      };
      expect(version.name).toBe("tool");
      expect(version.versions).toHaveLength(1);
      expect(version.versions[0]).toMatchObject({
        version: "1.0.0",
        digest: committed.digest,
        itemCount: 4,
        attributes: { description: "A tool, with commas", homepage: "https://example.test/t" },
      });

      const depend = await (await fetch(`${depot.url}/depend/tool%401.0.0`)).json();
      expect(depend).toEqual({
        name: "tool",
        version: "1.0.0",
        requires: [
          { name: "libbar", range: "*" },
          { name: "libfoo", range: "^1.2.0" },
        ],
      });

      const data = await fetch(`${depot.url}/data/tool`);
      expect(data.status).toBe(200);
      const bytes = new Uint8Array(await data.arrayBuffer());
      expect(storeDigest(bytes)).toBe(committed.digest);
      expect(data.headers.get("content-length")).toBe(String(bytes.length));
      expect(data.headers.get("cache-control")).toBe("public, max-age=31536000, immutable");
      expect(data.headers.get("etag")).toBe(`"${committed.digest.slice(7)}"`);
      expect(data.headers.get("repr-digest")).toBe(httpDigest(bytes));
      expect(data.headers.get("content-digest")).toBe(httpDigest(bytes));
      expect(data.headers.get("accept-ranges")).toBe("bytes");

      const entries = await parseTar(bytes);
      expect(entries.map((e) => e.name)).toEqual([
        ".pkg/manifest.json",
        ".pkg/licenses/MIT",
        "bin/tool",
        "share",
        "share/doc/read me.txt",
        "share/tool",
      ]);
      const mtime = entries[0]!.mtime;
      expect(Number.isInteger(mtime)).toBe(true);
      for (const e of entries)
        expect({ mtime: e.mtime, uid: e.uid, gid: e.gid, uname: e.uname, gname: e.gname }).toEqual({
          mtime,
          uid: 0,
          gid: 0,
          uname: "",
          gname: "",
        });
      const byName = new Map(entries.map((e) => [e.name, e]));
      expect(byName.get("bin/tool")!.body.toString()).toBe("#!/bin/sh\necho hi\n");
      expect(byName.get("bin/tool")!.mode).toBe(0o755);
      expect(byName.get("share")!.type).toBe("directory");
      expect(byName.get("share")!.mode).toBe(0o750);
      expect(byName.get("share/tool")).toMatchObject({ type: "symlink", linkname: "../bin/tool" });
      expect(byName.get("share/doc/read me.txt")!.body.toString()).toBe("héllo wörld");
      expect(byName.get(".pkg/licenses/MIT")!.body.toString()).toBe("Permission is hereby granted…");
      const manifest = JSON.parse(entries[0]!.body.toString()) as PackageManifest;
      expect(manifest).toMatchObject({
        name: "tool",
        version: "1.0.0",
        attributes: { description: "A tool, with commas", homepage: "https://example.test/t" },
        requires: [
          { name: "libbar", range: "*" },
          { name: "libfoo", range: "^1.2.0" },
        ],
        licenses: [
          {
            name: "MIT",
            path: ".pkg/licenses/MIT",
            size: Buffer.byteLength("Permission is hereby granted…"),
            digest: storeDigest("Permission is hereby granted…"),
          },
        ],
      });
      expect(manifest.items).toEqual([
        { type: "file", path: "bin/tool", mode: 0o755, size: 18, digest: storeDigest("#!/bin/sh\necho hi\n") },
        { type: "dir", path: "share", mode: 0o750, size: 0 },
        {
          type: "file",
          path: "share/doc/read me.txt",
          mode: 0o644,
          size: Buffer.byteLength("héllo wörld"),
          digest: storeDigest("héllo wörld"),
        },
        { type: "link", path: "share/tool", mode: 0o777, size: 0, target: "../bin/tool" },
      ]);

      // Determinism: the same version always yields the same bytes, and rebuilding from the
      // manifest at the same commit time reproduces them exactly.
      const again = new Uint8Array(await (await fetch(`${depot.url}/data/tool@1.0.0`)).arrayBuffer());
      expect(Buffer.compare(Buffer.from(again), Buffer.from(bytes))).toBe(0);
      // …and equal tar-stream's output for the same manifest (the writer digests were published with).
      const rebuilt = await referenceArchive(manifest, mtime, (digest) => store.getBlob(digest), entries[0]!.body);
      expect(Buffer.compare(rebuilt, Buffer.from(bytes))).toBe(0);
    });

    it("treats names case-insensitively and versions by SemVer precedence", async () => {
      expect((await publish(depot.url, "Multi@1.0.0", [{ type: "file", path: "a", body: "1" }])).status).toBe(201);
      expect((await publish(depot.url, "MULTI@1.1.0", [{ type: "file", path: "a", body: "2" }])).status).toBe(201);
      expect((await publish(depot.url, "multi@2.0.0-rc.1", [{ type: "file", path: "a", body: "3" }])).status).toBe(201);
      const v = (await (await fetch(`${depot.url}/version/multi`)).json()) as {
        latest: string;
        versions: Array<{ version: string }>;
      };
      expect(v.latest).toBe("1.1.0");
      expect(v.versions.map((x) => x.version)).toEqual(["1.0.0", "1.1.0", "2.0.0-rc.1"]);
      expect(((await (await fetch(`${depot.url}/depend/multi`)).json()) as { version: string }).version).toBe("1.1.0");
      // Build metadata does not make a new version.
      await expectProblem(fetch(`${depot.url}/trans/multi@1.0.0+build.7`, { method: "POST" }), 409, "VERSION_EXISTS");
      expect(
        ((await (await fetch(`${depot.url}/depend/multi@1.0.0+other`)).json()) as { version: string }).version,
      ).toBe("1.0.0");
      // Only prereleases: the highest prerelease is the newest.
      expect((await publish(depot.url, "pre@0.1.0-alpha.1", [{ type: "file", path: "a", body: "x" }])).status).toBe(
        201,
      );
      expect((await publish(depot.url, "pre@0.1.0-beta", [{ type: "file", path: "a", body: "y" }])).status).toBe(201);
      expect(((await (await fetch(`${depot.url}/version/pre`)).json()) as { latest: string }).latest).toBe(
        "0.1.0-beta",
      );
    });
  });
}

describe("errors, limits and HTTP semantics (memory store)", () => {
  let depot: LiveDepot;
  let store: PackageStore;
  let clock = Date.parse("2030-01-01T00:00:00Z");
  beforeAll(async () => {
    store = createMemoryStore();
    depot = await startDepot(store, {
      limits: { itemBytes: 1024, items: 5, openTransactions: 50, headerBytes: 8 * 1024, requires: 3, attributes: 3 },
      now: () => new Date(clock),
    });
  });
  afterAll(() => depot.close());

  it("400: names, versions, ranges, headers, types, digests, percent-encoding", async () => {
    await expectProblem(fetch(`${depot.url}/trans/-bad@1.0.0`, { method: "POST" }), 400, "NAME_INVALID");
    await expectProblem(fetch(`${depot.url}/trans/${"a".repeat(65)}@1.0.0`, { method: "POST" }), 400, "NAME_INVALID");
    await expectProblem(fetch(`${depot.url}/version/bad%20name`), 400, "NAME_INVALID");
    await expectProblem(fetch(`${depot.url}/trans/app@v1.0.0`, { method: "POST" }), 400, "VERSION_INVALID");
    await expectProblem(fetch(`${depot.url}/trans/app@1.0`, { method: "POST" }), 400, "VERSION_INVALID");
    await expectProblem(fetch(`${depot.url}/trans/app`, { method: "POST" }), 400, "VERSION_INVALID");
    await expectProblem(fetch(`${depot.url}/depend/app%ZZ`), 400, "BAD_REQUEST");
    const id = await openTransaction(depot.url, "errs@1.0.0");
    await expectProblem(add(depot.url, id, { type: "require", requires: ["other@>>>1"] }), 400, "RANGE_INVALID");
    await expectProblem(add(depot.url, id, { type: "require", requires: ["Bad Name@1"] }), 400, "NAME_INVALID");
    await expectProblem(fetch(`${depot.url}/add/${id}/socket`, { method: "POST" }), 400, "TYPE_INVALID");
    await expectProblem(fetch(`${depot.url}/add/${id}/file`, { method: "POST", body: "x" }), 400, "HEADER_INVALID");
    await expectProblem(
      fetch(`${depot.url}/add/${id}/file`, {
        method: "POST",
        headers: { "Pkg-Path": "a", "Pkg-Mode": "9" },
        body: "x",
      }),
      400,
      "HEADER_INVALID",
    );
    await expectProblem(
      fetch(`${depot.url}/add/${id}/file`, {
        method: "POST",
        headers: { "Pkg-Path": "a%E0%A4%A", "Pkg-Mode": "644" },
        body: "x",
      }),
      400,
      "HEADER_INVALID",
    );
    await expectProblem(
      fetch(`${depot.url}/add/${id}/set`, { method: "POST", headers: { "Pkg-Attr": "no-equals-sign" } }),
      400,
      "HEADER_INVALID",
    );
    await expectProblem(
      fetch(`${depot.url}/add/${id}/license`, { method: "POST", headers: { "Pkg-License": "MIT License" }, body: "x" }),
      400,
      "HEADER_INVALID",
    );
    await expectProblem(
      fetch(`${depot.url}/add/${id}/dir`, { method: "POST", headers: { "Pkg-Path": "d" }, body: "not empty" }),
      400,
      "BAD_REQUEST",
    );
    await expectProblem(
      fetch(`${depot.url}/add/${id}/file`, {
        method: "POST",
        headers: { "Pkg-Path": "a", "Content-Digest": httpDigest("something else") },
        body: "the bytes",
      }),
      400,
      "DIGEST_MISMATCH",
    );
    // Nothing of the refused body was kept.
    expect(await store.statBlob(storeDigest("the bytes"))).toBeNull();
    const summary = (await (await fetch(`${depot.url}/summary/${id}`)).json()) as { items: unknown[] };
    expect(summary.items).toEqual([]);
  });

  it("400 PATH_INVALID for every kind of bad path, and 409 PATH_EXISTS for a repeated one", async () => {
    const id = await openTransaction(depot.url, "paths@1.0.0");
    const file = (path: string) =>
      fetch(`${depot.url}/add/${id}/file`, { method: "POST", headers: { "Pkg-Path": path }, body: "x" });
    for (const bad of [
      "..%2Fetc%2Fpasswd",
      "a/../../b",
      "%2Fetc%2Fpasswd",
      "a%00b",
      "a%5Cb",
      "a//b",
      "a/",
      "./a",
      ".pkg/manifest.json",
      ".PKG/x",
      ".pkg",
    ]) {
      const body = await expectProblem(file(bad), 400, "PATH_INVALID");
      expect(typeof body.detail).toBe("string");
    }
    const link = (path: string, target: string) =>
      fetch(`${depot.url}/add/${id}/link`, { method: "POST", headers: { "Pkg-Path": path, "Pkg-Target": target } });
    await expectProblem(link("l1", "..%2Foutside"), 400, "PATH_INVALID");
    await expectProblem(link("a/b/l2", "..%2F..%2F..%2Fetc%2Fpasswd"), 400, "PATH_INVALID");
    await expectProblem(link("l3", "%2Fetc%2Fpasswd"), 400, "PATH_INVALID");
    await expectProblem(link("l4", ".pkg%2Fmanifest.json"), 400, "PATH_INVALID");
    expect((await link("a/b/ok", "..%2F..%2Ftop")).status).toBe(201);
    // Nothing below a file or a link, and no file or link above existing items.
    expect((await file("f")).status).toBe(201);
    await expectProblem(file("f/below"), 400, "PATH_INVALID");
    await expectProblem(file("a/b/ok/below"), 400, "PATH_INVALID");
    await expectProblem(file("a"), 400, "PATH_INVALID");
    await expectProblem(link("a", "f"), 400, "PATH_INVALID");
    await expectProblem(file("f"), 409, "PATH_EXISTS");
    await expectProblem(
      fetch(`${depot.url}/add/${id}/dir`, { method: "POST", headers: { "Pkg-Path": "f" } }),
      409,
      "PATH_EXISTS",
    );
    const summary = (await (await fetch(`${depot.url}/summary/${id}`)).json()) as { items: Array<{ path: string }> };
    expect(summary.items.map((i) => i.path)).toEqual(["a/b/ok", "f"]);
  });

  it("409: existing version, repeated path, unknown digest by reference; a known digest is taken by reference", async () => {
    expect(
      (await publish(depot.url, "conflict@1.0.0", [{ type: "file", path: "x", body: "shared content" }])).status,
    ).toBe(201);
    await expectProblem(fetch(`${depot.url}/trans/conflict@1.0.0`, { method: "POST" }), 409, "VERSION_EXISTS");
    const id = await openTransaction(depot.url, "conflict@1.1.0");
    await expectProblem(
      fetch(`${depot.url}/add/${id}/file`, {
        method: "POST",
        headers: { "Pkg-Path": "y", "Content-Digest": httpDigest("never uploaded") },
      }),
      409,
      "DIGEST_UNKNOWN",
    );
    const byRef = await fetch(`${depot.url}/add/${id}/file`, {
      method: "POST",
      headers: { "Pkg-Path": "y", "Content-Digest": httpDigest("shared content") },
    });
    expect(byRef.status).toBe(201);
    expect(await byRef.json()).toMatchObject({ path: "y", size: 14, digest: storeDigest("shared content") });
    const empty = await fetch(`${depot.url}/add/${id}/file`, {
      method: "POST",
      headers: { "Pkg-Path": "empty", "Content-Digest": httpDigest("") },
    });
    expect(await empty.json()).toMatchObject({ size: 0, digest: storeDigest("") });
    await expectProblem(add(depot.url, id, { type: "file", path: "y", body: "again" }), 409, "PATH_EXISTS");
    expect((await fetch(`${depot.url}/commit/${id}`, { method: "POST" })).status).toBe(201);
    const bytes = new Uint8Array(await (await fetch(`${depot.url}/data/conflict@1.1.0`)).arrayBuffer());
    const entries = await parseTar(bytes);
    expect(entries.find((e) => e.name === "y")!.body.toString()).toBe("shared content");
  });

  it("404: unknown package, version, transaction and route", async () => {
    await expectProblem(fetch(`${depot.url}/version/nothing`), 404, "PACKAGE_NOT_FOUND");
    await expectProblem(fetch(`${depot.url}/data/nothing`), 404, "PACKAGE_NOT_FOUND");
    await expectProblem(fetch(`${depot.url}/depend/conflict@9.9.9`), 404, "VERSION_NOT_FOUND");
    await expectProblem(fetch(`${depot.url}/data/conflict/9.9.9`), 404, "VERSION_NOT_FOUND");
    await expectProblem(fetch(`${depot.url}/data/conflict/1.0.0/9.9.9`), 404, "VERSION_NOT_FOUND");
    await expectProblem(
      fetch(`${depot.url}/summary/00000000-0000-4000-8000-000000000000`),
      404,
      "TRANSACTION_NOT_FOUND",
    );
    await expectProblem(fetch(`${depot.url}/commit/not-a-uuid`, { method: "POST" }), 404, "TRANSACTION_NOT_FOUND");
    await expectProblem(fetch(`${depot.url}/nowhere`), 404, "NOT_FOUND");
    await expectProblem(
      fetch(`${depot.url}/meta/00000000-0000-4000-8000-000000000000/provide`, { method: "POST" }),
      404,
      "NOT_FOUND",
    );
  });

  it("410: abandoned, expired (idle and absolute) and committed transactions", async () => {
    const abandoned = await openTransaction(depot.url, "gone@1.0.0");
    expect((await fetch(`${depot.url}/trans/${abandoned}`, { method: "DELETE" })).status).toBe(204);
    await expectProblem(add(depot.url, abandoned, { type: "file", path: "a", body: "x" }), 410, "TRANSACTION_GONE");
    await expectProblem(fetch(`${depot.url}/summary/${abandoned}`), 410, "TRANSACTION_GONE");
    await expectProblem(fetch(`${depot.url}/commit/${abandoned}`, { method: "POST" }), 410, "TRANSACTION_GONE");
    await expectProblem(fetch(`${depot.url}/trans/${abandoned}`, { method: "DELETE" }), 410, "TRANSACTION_GONE");

    const idle = await openTransaction(depot.url, "gone@1.1.0");
    clock += 23 * 3600_000;
    expect((await add(depot.url, idle, { type: "file", path: "a", body: "x" })).status).toBe(201); // activity renews
    clock += 23 * 3600_000;
    expect((await fetch(`${depot.url}/summary/${idle}`)).status).toBe(200);
    clock += 24 * 3600_000 + 1;
    await expectProblem(fetch(`${depot.url}/summary/${idle}`), 410, "TRANSACTION_EXPIRED");
    await expectProblem(fetch(`${depot.url}/commit/${idle}`, { method: "POST" }), 410, "TRANSACTION_EXPIRED");

    const busy = await openTransaction(depot.url, "gone@1.2.0");
    for (let day = 0; day < 8; day++) {
      clock += 20 * 3600_000;
      expect((await fetch(`${depot.url}/summary/${busy}`)).status).toBe(200);
    }
    clock += 20 * 3600_000; // 180 h since opening (over 7 days), though touched 20 h ago
    await expectProblem(add(depot.url, busy, { type: "dir", path: "d" }), 410, "TRANSACTION_EXPIRED");

    const id = await openTransaction(depot.url, "gone@2.0.0");
    expect((await add(depot.url, id, { type: "file", path: "a", body: "x" })).status).toBe(201);
    const first = await fetch(`${depot.url}/commit/${id}`, { method: "POST" });
    expect(first.status).toBe(201);
    const firstBody = await first.json();
    const repeated = await fetch(`${depot.url}/commit/${id}`, { method: "POST" });
    expect(repeated.status).toBe(200);
    expect(await repeated.json()).toEqual(firstBody);
    const summary = await fetch(`${depot.url}/summary/${id}`);
    expect(summary.status).toBe(200);
    expect(await summary.json()).toMatchObject({ state: "committed", url: "/data/gone@2.0.0", items: [{ path: "a" }] });
    await expectProblem(add(depot.url, id, { type: "file", path: "b", body: "y" }), 410, "TRANSACTION_COMMITTED");
    await expectProblem(add(depot.url, id, { type: "require", requires: ["x"] }), 410, "TRANSACTION_COMMITTED");
    await expectProblem(fetch(`${depot.url}/trans/${id}`, { method: "DELETE" }), 410, "TRANSACTION_COMMITTED");
  });

  it("413: an item over the size limit (declared or streamed) and a transaction over the item limit", async () => {
    const id = await openTransaction(depot.url, "big@1.0.0");
    const big = "z".repeat(4096);
    await expectProblem(add(depot.url, id, { type: "file", path: "declared", body: big }), 413, "TOO_LARGE");
    const stream = new ReadableStream<Uint8Array>({
      start(controller) {
        for (let i = 0; i < 4; i++) controller.enqueue(new TextEncoder().encode("q".repeat(1000)));
        controller.close();
      },
    });
    await expectProblem(
      fetch(`${depot.url}/add/${id}/file`, {
        method: "POST",
        headers: { "Pkg-Path": "streamed" },
        body: stream,
        duplex: "half",
      } as RequestInit),
      413,
      "TOO_LARGE",
    );
    await expectProblem(add(depot.url, id, { type: "license", name: "Big", body: big }), 413, "TOO_LARGE");
    expect(await store.statBlob(storeDigest(big))).toBeNull();
    expect(await store.statBlob(storeDigest("q".repeat(4000)))).toBeNull();
    expect((await add(depot.url, id, { type: "file", path: "exactly-1024", body: "e".repeat(1024) })).status).toBe(201);
    for (const path of ["b", "c", "d", "e"]) expect((await add(depot.url, id, { type: "dir", path })).status).toBe(201);
    await expectProblem(add(depot.url, id, { type: "dir", path: "f" }), 413, "TOO_MANY_ITEMS");
    await expectProblem(add(depot.url, id, { type: "license", name: "MIT", body: "m" }), 413, "TOO_MANY_ITEMS");
    // Requirement and attribute caps (3 each here).
    expect((await add(depot.url, id, { type: "require", requires: ["r1", "r2", "r3"] })).status).toBe(201);
    await expectProblem(add(depot.url, id, { type: "require", requires: ["r4"] }), 413, "TOO_MANY_ITEMS");
    expect((await add(depot.url, id, { type: "set", attrs: { a: "1", b: "2", c: "3" } })).status).toBe(201);
    await expectProblem(add(depot.url, id, { type: "set", attrs: { d: "4" } }), 413, "TOO_MANY_ITEMS");
    const summary = (await (await fetch(`${depot.url}/summary/${id}`)).json()) as {
      totals: { items: number; bytes: number };
    };
    expect(summary.totals).toEqual({ items: 5, bytes: 1024 });
  });

  it("422: commit lists every problem; a self dependency is refused", async () => {
    const id = await openTransaction(depot.url, "bad@1.0.1");
    for (const path of ["one", "two", "three"])
      expect((await add(depot.url, id, { type: "file", path, body: `content of ${path}` })).status).toBe(201);
    // Content lost behind the transaction's back (a store operator, a failed disk).
    await store.deleteBlob(storeDigest("content of one"));
    await store.deleteBlob(storeDigest("content of three"));
    const many = await expectProblem(fetch(`${depot.url}/commit/${id}`, { method: "POST" }), 422, "COMMIT_INVALID");
    expect(many.problems).toEqual([
      expect.objectContaining({ code: "CONTENT_MISSING", path: "one" }),
      expect.objectContaining({ code: "CONTENT_MISSING", path: "three" }),
    ]);
    const summary = (await (await fetch(`${depot.url}/summary/${id}`)).json()) as {
      state: string;
      problems: unknown[];
    };
    expect(summary.state).toBe("open");
    expect(summary.problems).toHaveLength(2);
    // Fixing the problems lets the same transaction commit.
    await fetch(`${depot.url}/add/${id}/file`, {
      method: "POST",
      headers: { "Pkg-Path": "four" },
      body: "content of one",
    });
    await fetch(`${depot.url}/add/${id}/file`, {
      method: "POST",
      headers: { "Pkg-Path": "five" },
      body: "content of three",
    });
    expect((await fetch(`${depot.url}/commit/${id}`, { method: "POST" })).status).toBe(201);
    await expectProblem(fetch(`${depot.url}/data/bad@1.0.0`), 404, "VERSION_NOT_FOUND");
    expect((await fetch(`${depot.url}/data/bad@1.0.1`)).status).toBe(200);

    const self = await openTransaction(depot.url, "selfish@1.0.0");
    await expectProblem(add(depot.url, self, { type: "require", requires: ["Selfish@^1"] }), 422, "SELF_DEPENDENCY");
  });

  it("publishes a meta-package that carries only requirements", async () => {
    const commit = await publish(depot.url, "meta@1.0.0", [{ type: "require", requires: ["conflict@^1"] }]);
    expect(commit.status).toBe(201);
    const entries = await parseTar(new Uint8Array(await (await fetch(`${depot.url}/data/meta`)).arrayBuffer()));
    expect(entries.map((e) => e.name)).toEqual([".pkg/manifest.json"]);
    expect(JSON.parse(entries[0]!.body.toString())).toMatchObject({
      items: [],
      requires: [{ name: "conflict", range: "^1" }],
    });
  });

  it("304 on an unchanged catalog; a new ETag after a publish", async () => {
    const first = await fetch(`${depot.url}/catalog`);
    const etag = first.headers.get("etag")!;
    expect(etag).toMatch(/^"[0-9a-f]{8}-[0-9]+"$/);
    const again = await fetch(`${depot.url}/catalog`);
    expect(again.headers.get("etag")).toBe(etag);
    const notModified = await fetch(`${depot.url}/catalog`, { headers: { "If-None-Match": etag } });
    expect(notModified.status).toBe(304);
    expect(await notModified.text()).toBe("");
    expect((await publish(depot.url, "etagged@1.0.0", [{ type: "file", path: "a", body: "a" }])).status).toBe(201);
    const changed = await fetch(`${depot.url}/catalog`, { headers: { "If-None-Match": etag } });
    expect(changed.status).toBe(200);
    expect(changed.headers.get("etag")).not.toBe(etag);
    expect(((await changed.json()) as { packages: Record<string, unknown> }).packages.etagged).toBeDefined();
  });

  it("Range: 206 slices, suffix, If-Range, HEAD, 304 on the ETag, and 416", async () => {
    const whole = new Uint8Array(await (await fetch(`${depot.url}/data/etagged`)).arrayBuffer());
    const size = whole.length;
    const part = await fetch(`${depot.url}/data/etagged@1.0.0`, { headers: { Range: "bytes=100-611" } });
    expect(part.status).toBe(206);
    expect(part.headers.get("content-range")).toBe(`bytes 100-611/${size}`);
    expect(part.headers.get("content-length")).toBe("512");
    expect(part.headers.get("repr-digest")).toBe(httpDigest(whole));
    expect(part.headers.get("content-digest")).toBeNull();
    expect(Buffer.from(await part.arrayBuffer()).equals(Buffer.from(whole.subarray(100, 612)))).toBe(true);
    const tail = await fetch(`${depot.url}/data/etagged`, { headers: { Range: "bytes=-10" } });
    expect(Buffer.from(await tail.arrayBuffer()).equals(Buffer.from(whole.subarray(size - 10)))).toBe(true);
    const open = await fetch(`${depot.url}/data/etagged`, { headers: { Range: `bytes=${size - 3}-` } });
    expect(open.headers.get("content-range")).toBe(`bytes ${size - 3}-${size - 1}/${size}`);
    const etag = open.headers.get("etag")!;
    const stale = await fetch(`${depot.url}/data/etagged`, { headers: { Range: "bytes=0-9", "If-Range": '"0000"' } });
    expect(stale.status).toBe(200);
    expect((await stale.arrayBuffer()).byteLength).toBe(size);
    const fresh = await fetch(`${depot.url}/data/etagged`, { headers: { Range: "bytes=0-9", "If-Range": etag } });
    expect(fresh.status).toBe(206);
    await fresh.arrayBuffer();
    const head = await fetch(`${depot.url}/data/etagged`, { method: "HEAD" });
    expect(head.status).toBe(200);
    expect(head.headers.get("content-length")).toBe(String(size));
    expect(head.headers.get("repr-digest")).toBe(httpDigest(whole));
    expect((await fetch(`${depot.url}/data/etagged`, { headers: { "If-None-Match": etag } })).status).toBe(304);
    const beyond = await fetch(`${depot.url}/data/etagged`, { headers: { Range: `bytes=${size}-` } });
    await expectProblem(beyond, 416, "RANGE_NOT_SATISFIABLE");
    expect(beyond.headers.get("content-range")).toBe(`bytes */${size}`);
    await expectProblem(
      fetch(`${depot.url}/data/etagged`, { headers: { Range: "bytes=-0" } }),
      416,
      "RANGE_NOT_SATISFIABLE",
    );
  });

  it("431: headers over the router's limit, and over node's own limit", async () => {
    await expectProblem(
      fetch(`${depot.url}/catalog`, { headers: { "X-Padding": "p".repeat(9 * 1024) } }),
      431,
      "HEADERS_TOO_LARGE",
    );
    await expectProblem(
      fetch(`${depot.url}/catalog`, { headers: { "X-Padding": "p".repeat(80 * 1024) } }),
      431,
      "HEADERS_TOO_LARGE",
    );
    expect((await fetch(`${depot.url}/catalog`)).status).toBe(200);
  });
});

describe("open transactions per principal (429)", () => {
  it("answers 429 with Retry-After past the limit, per principal", async () => {
    const depot = await startDepot(createMemoryStore(), {
      limits: { openTransactions: 2 },
      authorize: bearerTokens({ alice: ["*"], bob: ["*"] }),
    });
    try {
      const alice = { Authorization: "Bearer alice" };
      const first = await openTransaction(depot.url, "p@1.0.0", alice);
      await openTransaction(depot.url, "p@1.0.1", alice);
      const refused = await fetch(`${depot.url}/trans/p@1.0.2`, { method: "POST", headers: alice });
      const body = await expectProblem(refused, 429, "TOO_MANY_TRANSACTIONS");
      expect(Number(refused.headers.get("retry-after"))).toBeGreaterThan(0);
      expect(body.retryAfter).toBe(Number(refused.headers.get("retry-after")));
      // Another principal has its own budget.
      await openTransaction(depot.url, "p@1.0.2", { Authorization: "Bearer bob" });
      expect((await fetch(`${depot.url}/trans/${first}`, { method: "DELETE", headers: alice })).status).toBe(204);
      await openTransaction(depot.url, "p@1.0.3", alice);
    } finally {
      await depot.close();
    }
  });

  it("takes exactly the limit when 24 opens and then 10 releases of one principal arrive at once (fs store, batched slot writes)", async () => {
    const tmp = await tempDir();
    const store = createFsStore(tmp.dir);
    const depot = await startDepot(store, { limits: { openTransactions: 10 } });
    try {
      const opens = await Promise.all(
        Array.from({ length: 24 }, (_, i) => fetch(`${depot.url}/trans/burst@1.0.${i}`, { method: "POST" })),
      );
      const taken = opens.filter((r) => r.status === 201);
      expect(taken).toHaveLength(10);
      expect(opens.filter((r) => r.status === 429)).toHaveLength(14);
      const ids = await Promise.all(taken.map(async (r) => ((await r.json()) as { transaction: string }).transaction));
      for (const r of opens.filter((r) => r.status !== 201)) await r.arrayBuffer();
      expect(
        (await Promise.all(ids.map((id) => fetch(`${depot.url}/trans/${id}`, { method: "DELETE" })))).map(
          (r) => r.status,
        ),
      ).toEqual(ids.map(() => 204));
      const again = await Promise.all(
        Array.from({ length: 10 }, (_, i) => fetch(`${depot.url}/trans/again@1.0.${i}`, { method: "POST" })),
      );
      expect(again.map((r) => r.status)).toEqual(again.map(() => 201));
      for (const r of again) await r.arrayBuffer();
      await expectProblem(fetch(`${depot.url}/trans/again@2.0.0`, { method: "POST" }), 429, "TOO_MANY_TRANSACTIONS");
    } finally {
      await depot.close();
      await store.close?.();
      await tmp.cleanup();
    }
  });
});

describe("authentication (bearerTokens)", () => {
  let depot: LiveDepot;
  beforeAll(async () => {
    depot = await startDepot(createMemoryStore(), {
      authorize: bearerTokens({ admin: ["*"], team: ["team-*"], reader: { read: ["*"] } }),
    });
  });
  afterAll(() => depot.close());

  it("401 without or with a bad token, 403 outside the token's scope, transactions bound to their token", async () => {
    const missing = await fetch(`${depot.url}/catalog`);
    await expectProblem(missing, 401, "UNAUTHENTICATED");
    expect(missing.headers.get("www-authenticate")).toMatch(/^Bearer realm="runner-depot"/);
    const bad = await fetch(`${depot.url}/catalog`, { headers: { Authorization: "Bearer nope" } });
    await expectProblem(bad, 401, "UNAUTHENTICATED");
    expect(bad.headers.get("www-authenticate")).toContain('error="invalid_token"');
    await expectProblem(fetch(`${depot.url}/trans/app@1.0.0`, { method: "POST" }), 401, "UNAUTHENTICATED");

    const team = { Authorization: "Bearer team" };
    await expectProblem(
      fetch(`${depot.url}/trans/app@1.0.0`, { method: "POST", headers: team }),
      403,
      "PERMISSION_DENIED",
    );
    await expectProblem(
      fetch(`${depot.url}/trans/team-app@1.0.0`, { method: "POST", headers: { Authorization: "Bearer reader" } }),
      403,
      "PERMISSION_DENIED",
    );
    const id = await openTransaction(depot.url, "Team-App@1.0.0", team);
    await expectProblem(
      add(depot.url, id, { type: "file", path: "a", body: "a" }, { Authorization: "Bearer admin" }),
      403,
      "PERMISSION_DENIED",
    );
    await expectProblem(add(depot.url, id, { type: "file", path: "a", body: "a" }), 401, "UNAUTHENTICATED");
    expect((await add(depot.url, id, { type: "file", path: "a", body: "a" }, team)).status).toBe(201);
    expect((await fetch(`${depot.url}/commit/${id}`, { method: "POST", headers: team })).status).toBe(201);

    expect((await fetch(`${depot.url}/data/team-app`, { headers: { Authorization: "Bearer reader" } })).status).toBe(
      200,
    );
    expect((await fetch(`${depot.url}/catalog`, { headers: team })).status).toBe(200);
    expect(
      (
        await publish(depot.url, "app@1.0.0", [{ type: "file", path: "a", body: "a" }], {
          Authorization: "Bearer admin",
        })
      ).status,
    ).toBe(201);
    await expectProblem(fetch(`${depot.url}/data/app`, { headers: team }), 403, "PERMISSION_DENIED");
  });
});

describe("store failures", () => {
  function failing(error: () => unknown): PackageStore {
    const inner = createMemoryStore();
    return { ...inner, getRecord: async () => Promise.reject(error()) };
  }

  it("503 STORE_UNAVAILABLE with Retry-After when the store is down", async () => {
    for (const error of [
      () => new RunnerDepotError("UNAVAILABLE", "pg: connection refused"),
      () => Object.assign(new Error("connect ECONNREFUSED 10.0.0.1:5432"), { code: "ECONNREFUSED" }),
    ]) {
      const depot = await startDepot(failing(error));
      try {
        const response = await fetch(`${depot.url}/catalog`);
        const body = await expectProblem(response, 503, "STORE_UNAVAILABLE");
        expect(response.headers.get("retry-after")).toBe("5");
        expect(String(body.detail)).not.toContain("10.0.0.1");
      } finally {
        await depot.close();
      }
    }
  });

  it("500 never leaks internals, and reports them to onError", async () => {
    const seen: unknown[] = [];
    const router = createPackageRouter(
      failing(() => new Error("secret /srv/depot/records/catalog~ is corrupt")),
      { onError: (e) => seen.push(e) },
    );
    const server = await servePackageRouter(router);
    try {
      const response = await fetch(`${server.url}/catalog`);
      const body = await expectProblem(response, 500, "INTERNAL");
      expect(JSON.stringify(body)).not.toContain("secret");
      expect(seen).toHaveLength(1);
    } finally {
      await server.close();
    }
  });
});

describe("deltas", () => {
  let depot: LiveDepot;
  let putBlobs = 0;
  const files = (changed: string): Addition[] =>
    Array.from({ length: 100 }, (_, i) => ({
      type: "file" as const,
      path: `lib/file-${String(i).padStart(3, "0")}.txt`,
      body: i === 42 ? changed : `${`file ${i} `.repeat(400)}\n`,
    }));
  beforeAll(async () => {
    const inner = createMemoryStore();
    const counting: PackageStore = { ...inner, putBlob: (body, opts) => (putBlobs++, inner.putBlob(body, opts)) };
    depot = await startDepot(counting);
    expect(
      (
        await publish(depot.url, "big@1.0.0", [
          ...files("original 42"),
          { type: "file", path: "old-only", body: "gone later" },
        ])
      ).status,
    ).toBe(201);
    expect(
      (
        await publish(depot.url, "big@1.1.0", [
          ...files("changed 42"),
          { type: "link", path: "new-link", target: "lib/file-000.txt" },
        ])
      ).status,
    ).toBe(201);
  });
  afterAll(() => depot.close());

  it("one changed file of 100: the delta is under 5% of the archive and holds only what changed", async () => {
    const full = new Uint8Array(await (await fetch(`${depot.url}/data/big@1.1.0`)).arrayBuffer());
    const response = await fetch(`${depot.url}/data/big/1.0.0/1.1.0`);
    expect(response.status).toBe(200);
    expect(response.headers.get("cache-control")).toBe("public, max-age=31536000, immutable");
    const delta = new Uint8Array(await response.arrayBuffer());
    expect(response.headers.get("repr-digest")).toBe(httpDigest(delta));
    expect(response.headers.get("content-digest")).toBe(httpDigest(delta));
    expect(delta.length / full.length).toBeLessThan(0.05);
    const entries = await parseTar(delta);
    expect(entries.map((e) => e.name)).toEqual([".pkg/manifest.json", "lib/file-042.txt", "new-link"]);
    expect(entries[1]!.body.toString()).toBe("changed 42");
    const manifest = JSON.parse(entries[0]!.body.toString()) as PackageManifest;
    expect(manifest).toMatchObject({ name: "big", version: "1.1.0", from: "1.0.0", removed: ["old-only"] });
    expect(manifest.items.map((i) => i.path)).toEqual(["lib/file-042.txt", "new-link"]);
    // Kept: the second request streams the same stored blob, nothing is rebuilt.
    const before = putBlobs;
    const again = new Uint8Array(await (await fetch(`${depot.url}/data/big/1.0.0/1.1.0`)).arrayBuffer());
    expect(Buffer.from(again).equals(Buffer.from(delta))).toBe(true);
    expect(putBlobs).toBe(before);
    const ranged = await fetch(`${depot.url}/data/big/1.0.0/1.1.0`, { headers: { Range: "bytes=0-511" } });
    expect(ranged.status).toBe(206);
    expect(Buffer.from(await ranged.arrayBuffer()).equals(Buffer.from(delta.subarray(0, 512)))).toBe(true);
  });

  it("redirects /data/<name>/<from> to the newest, goes down as well as up, and has an empty delta onto itself", async () => {
    const redirect = await fetch(`${depot.url}/data/big/1.0.0`, { redirect: "manual" });
    expect(redirect.status).toBe(307);
    expect(redirect.headers.get("location")).toBe("/data/big/1.0.0/1.1.0");
    const self = await fetch(`${depot.url}/data/big/1.1.0`, { redirect: "manual" });
    expect(self.headers.get("location")).toBe("/data/big/1.1.0/1.1.0");
    const empty = await parseTar(new Uint8Array(await (await fetch(`${depot.url}/data/big/1.1.0`)).arrayBuffer()));
    expect(empty.map((e) => e.name)).toEqual([".pkg/manifest.json"]);
    expect(JSON.parse(empty[0]!.body.toString())).toMatchObject({ items: [], removed: [], from: "1.1.0" });
    const down = await parseTar(new Uint8Array(await (await fetch(`${depot.url}/data/big/1.1.0/1.0.0`)).arrayBuffer()));
    expect(down.map((e) => e.name)).toEqual([".pkg/manifest.json", "lib/file-042.txt", "old-only"]);
    expect(JSON.parse(down[0]!.body.toString())).toMatchObject({
      from: "1.1.0",
      version: "1.0.0",
      removed: ["new-link"],
    });
    await expectProblem(fetch(`${depot.url}/data/big@1.0.0/1.1.0`), 400, "BAD_REQUEST");
  });
});

describe("streaming, mounting and serving", () => {
  it("streams an upload into the store before the client has finished sending", async () => {
    const inner = createMemoryStore();
    let received = 0;
    let sawFirstChunk!: () => void;
    const firstChunkSeen = new Promise<void>((resolve) => (sawFirstChunk = resolve));
    const store: PackageStore = {
      ...inner,
      putBlob: (body, opts) =>
        inner.putBlob(
          (async function* () {
            for await (const chunk of body) {
              received += chunk.byteLength;
              sawFirstChunk();
              yield chunk;
            }
          })(),
          opts,
        ),
    };
    const depot = await startDepot(store);
    try {
      const id = await openTransaction(depot.url, "stream@1.0.0");
      const chunk = new Uint8Array(64 * 1024).fill(7);
      let sent = 0;
      const body = new ReadableStream<Uint8Array>({
        async pull(controller) {
          if (sent === 1) {
            // The client holds back the rest until the server has stored the first chunk:
            // a server that buffered whole bodies would never get here.
            await firstChunkSeen;
            expect(received).toBeGreaterThan(0);
          }
          if (sent === 8) return controller.close();
          sent++;
          controller.enqueue(chunk);
        },
      });
      const response = await fetch(`${depot.url}/add/${id}/file`, {
        method: "POST",
        headers: { "Pkg-Path": "s" },
        body,
        duplex: "half",
      } as RequestInit);
      expect(response.status).toBe(201);
      expect(((await response.json()) as { size: number }).size).toBe(8 * 64 * 1024);
    } finally {
      await depot.close();
    }
  });

  it("mounts under a base path", async () => {
    const router = createPackageRouter(createMemoryStore(), { base: "/depot/" });
    const server = await servePackageRouter(router);
    try {
      const open = await fetch(`${server.url}/depot/trans/based@1.0.0`, { method: "POST" });
      expect(open.headers.get("location")).toMatch(/^\/depot\/summary\//);
      const { transaction } = (await open.json()) as { transaction: string };
      await add(`${server.url}/depot`, transaction, { type: "file", path: "a", body: "a" });
      const commit = await fetch(`${server.url}/depot/commit/${transaction}`, { method: "POST" });
      expect(await commit.json()).toMatchObject({ url: "/depot/data/based@1.0.0" });
      expect((await fetch(`${server.url}/depot/data/based`)).status).toBe(200);
      expect((await fetch(`${server.url}/catalog`)).status).toBe(404);
    } finally {
      await server.close();
    }
  });

  it("refuses to serve an open router on a non-loopback address without insecure", async () => {
    const open = createPackageRouter(createMemoryStore());
    await expect(servePackageRouter(open, { host: "0.0.0.0" })).rejects.toThrow(/insecure/);
    await expect(servePackageRouter(open, { host: "192.168.1.10" })).rejects.toThrow(/open depot/);
    for (const host of [
      "127.0.0.1",
      "127.8.9.10",
      "::1",
      "[::1]",
      "localhost",
      "::ffff:127.0.0.1",
      "::ffff:127.0.0.2",
      "[::ffff:7f00:2]",
    ])
      expect(isLoopbackHost(host), host).toBe(true);
    for (const host of [
      "0.0.0.0",
      "::",
      "10.0.0.1",
      "128.0.0.1",
      "::ffff:10.0.0.1",
      "example.com",
      "127.0.0.1.example.com",
      "::ffff:127.evil",
    ])
      expect(isLoopbackHost(host), host).toBe(false);
    const local = await servePackageRouter(open, { host: "localhost" });
    expect((await fetch(`${local.url}/catalog`)).status).toBe(200);
    await local.close();
    await local.close();
  });
});

describe("machine crash: an open transaction's record (fs store)", () => {
  it("lost whole (its count is written losable): the open transaction is 404 and a new one publishes", async () => {
    const tmp = await tempDir("depot-losable-");
    let store = createFsStore(tmp.dir);
    let depot = await startDepot(store);
    try {
      const id = await openTransaction(depot.url, "torn@1.0.0");
      expect((await add(depot.url, id, { type: "file", path: "a", body: "first bytes" })).status).toBe(201);
      // What a power loss may leave of an open transaction whose last writes were losable
      // (a batch committed without a WAL fsync): the record gone whole, never torn.
      await depot.close();
      expect(await store.deleteRecord(`trans/${id}`)).toBe(true);
      await store.close?.();
      store = createFsStore(tmp.dir);
      depot = await startDepot(store);
      const gone = await fetch(`${depot.url}/summary/${id}`);
      expect([gone.status, ((await gone.json()) as { code: string }).code]).toEqual([404, "TRANSACTION_NOT_FOUND"]);
      const late = await add(depot.url, id, { type: "file", path: "b", body: "late" });
      expect(late.status).toBe(404);
      await late.arrayBuffer();
      // The client opens a new transaction and adds again; its lost predecessor holds no slot.
      const again = await publish(depot.url, "torn@1.0.0", [{ type: "file", path: "a", body: "first bytes" }]);
      expect(again.status).toBe(201);
      const data = await fetch(`${depot.url}/data/torn@1.0.0`);
      expect(data.status).toBe(200);
      await data.arrayBuffer();
    } finally {
      await depot.close();
      await store.close?.();
      await tmp.cleanup();
    }
  });
});

describe("garbage collection", () => {
  it("rolls forward a commit a machine crash left `committing` outside any slot, instead of expiring it", async () => {
    let clock = Date.parse("2030-01-01T00:00:00Z");
    const store = createMemoryStore();
    const depot = await startDepot(store, { now: () => new Date(clock) });
    try {
      const id = await openTransaction(depot.url, "crashed@1.0.0");
      await add(depot.url, id, { type: "file", path: "a", body: "crashed bytes" });
      const commit = await fetch(`${depot.url}/commit/${id}`, { method: "POST" });
      expect(commit.status).toBe(201);
      const answered = (await commit.json()) as { url: string };
      // What a power loss can leave where one directory's fsync does not carry an earlier
      // rename in another (btrfs): the lazy `committed` write lost, while a later open's
      // slot write, which saw it committed and dropped it, reached the disk.
      const stored = (await store.getRecord<Record<string, unknown>>(`trans/${id}`))!;
      const { result: _result, finishedAt: _finishedAt, ...committing } = stored.value;
      expect(
        await store.putRecord(`trans/${id}`, { ...committing, state: "committing" }, { ifRevision: stored.revision }),
      ).not.toBeNull();
      for (const slotKey of (await store.listRecords("slots/")).keys) {
        const slot = (await store.getRecord<{ ids: string[] }>(slotKey))!;
        await store.putRecord(slotKey, { ids: slot.value.ids.filter((i) => i !== id) }, { ifRevision: slot.revision });
      }
      clock += 25 * 3600_000; // past its idle expiry
      expect(await depot.router.collectGarbage()).toMatchObject({ expired: 0 });
      // The version was published (201): its transaction says so, not 410 TRANSACTION_EXPIRED.
      const summary = await fetch(`${depot.url}/summary/${id}`);
      expect(summary.status).toBe(200);
      expect(
        (await store.getRecord<{ state: string; result?: { location: string } }>(`trans/${id}`))!.value,
      ).toMatchObject({ state: "committed", result: { location: "/data/crashed@1.0.0" } });
      expect(answered.url).toMatch(/\/data\/crashed@1\.0\.0$/);
      expect((await fetch(`${depot.url}/data/crashed`)).status).toBe(200);
    } finally {
      await depot.close();
    }
  });

  it("collects blobs of abandoned and expired transactions after the grace period, keeps published ones", async () => {
    let clock = Date.parse("2030-01-01T00:00:00Z");
    const store = createMemoryStore();
    const depot = await startDepot(store, {
      now: () => new Date(clock),
      gcGraceMs: 60_000,
      transactionRetainMs: 3600_000,
    });
    try {
      expect(
        (await publish(depot.url, "kept@1.0.0", [{ type: "file", path: "a", body: "published bytes" }])).status,
      ).toBe(201);
      const abandoned = await openTransaction(depot.url, "kept@2.0.0");
      await add(depot.url, abandoned, { type: "file", path: "a", body: "abandoned bytes" });
      await fetch(`${depot.url}/trans/${abandoned}`, { method: "DELETE" });
      const idle = await openTransaction(depot.url, "kept@3.0.0");
      await add(depot.url, idle, { type: "file", path: "a", body: "expired bytes" });
      const live = await openTransaction(depot.url, "kept@4.0.0");
      await add(depot.url, live, { type: "file", path: "a", body: "live bytes" });

      const first = await depot.router.collectGarbage();
      expect(first).toMatchObject({ deletedBlobs: 0, pendingBlobs: 1 });
      clock += 25 * 3600_000; // past the grace period, and past the idle expiry of both open ones
      await fetch(`${depot.url}/summary/${live}`).then((r) => expect(r.status).toBe(410));
      const second = await depot.router.collectGarbage();
      expect(second).toMatchObject({ deletedBlobs: 1, forgotten: 2 }); // the abandoned and the committed one
      expect(await store.statBlob(storeDigest("abandoned bytes"))).toBeNull();
      expect(await store.statBlob(storeDigest("published bytes"))).not.toBeNull();
      clock += 2 * 3600_000;
      const third = await depot.router.collectGarbage();
      expect(third.forgotten).toBe(2); // the two expired ones
      // Unreferenced since the second run (when they expired), now past the grace period.
      expect(third.deletedBlobs).toBe(2);
      expect(await store.statBlob(storeDigest("expired bytes"))).toBeNull();
      expect(await store.statBlob(storeDigest("live bytes"))).toBeNull();
      expect(await store.statBlob(storeDigest("published bytes"))).not.toBeNull();
      const data = await fetch(`${depot.url}/data/kept`);
      expect(data.status).toBe(200);
      expect((await parseTar(new Uint8Array(await data.arrayBuffer())))[1]!.body.toString()).toBe("published bytes");
      await expectProblem(fetch(`${depot.url}/summary/${abandoned}`), 404, "TRANSACTION_NOT_FOUND");
    } finally {
      await depot.close();
    }
  });
});
