/**
 * Issue 9's depot attacks, each replayed over real HTTP (fetch, or node:http where a
 * header must be forged, against servePackageRouter on 127.0.0.1:0): link chains that
 * leave the package, references to content the publisher cannot read, a scoped token on
 * a public-read depot, control characters in Pkg-Path, the Host header in answers, and
 * two different digests in one Content-Digest.
 */
import { randomBytes } from "node:crypto";
import { request as httpRequest } from "node:http";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createFsStore } from "../../../src/adapters/fs/store.js";
import { createMemoryStore } from "../../../src/adapters/memory/store.js";
import { bearerTokens } from "../../../src/depot/server/auth.js";
import { createDepotClient } from "../../../src/depot/client/depot-client.js";
import {
  add,
  httpDigest,
  openTransaction,
  publish,
  startDepot,
  storeDigest,
  tempDir,
  type LiveDepot,
} from "../../fixtures/depot.js";

async function problem(
  response: Response | Promise<Response>,
  status: number,
  code: string,
): Promise<Record<string, unknown>> {
  const r = await response;
  const text = await r.text();
  expect({ status: r.status, type: r.headers.get("content-type") }, text).toEqual({
    status,
    type: "application/problem+json",
  });
  const body = JSON.parse(text) as Record<string, unknown>;
  expect(body.code, text).toBe(code);
  return body;
}

const UP = "a/b/c/d/e/f/g/h/up";
const UP_TARGET = "../../../../../../../..";
const PASSWD_TARGET = "a/b/c/d/e/f/g/h/up/../../../../../../../../etc/passwd";

describe("link chains (issue 9, depot 2)", () => {
  let depot: LiveDepot;
  beforeAll(async () => {
    depot = await startDepot(createMemoryStore());
  });
  afterAll(() => depot.close());

  it("refuses the issue's exact attack at the addition of the second link", async () => {
    const id = await openTransaction(depot.url, "chain@1.0.0");
    // Alone, the first link points at the package root: fine.
    expect((await add(depot.url, id, { type: "link", path: UP, target: UP_TARGET })).status).toBe(201);
    const refused = await problem(
      add(depot.url, id, { type: "link", path: "passwd", target: PASSWD_TARGET }),
      400,
      "PATH_INVALID",
    );
    expect(refused.detail).toMatch(/leaves the package root/);
    const commit = await fetch(`${depot.url}/commit/${id}`, { method: "POST" });
    expect(commit.status).toBe(201);
    const archive = Buffer.from(await (await fetch(`${depot.url}/data/chain@1.0.0`)).arrayBuffer());
    expect(archive.includes(Buffer.from("etc/passwd"))).toBe(false);
  });

  it("refuses it at commit when the links come in the other order (the whole tree is known only then), and the summary says so", async () => {
    const id = await openTransaction(depot.url, "chain@2.0.0");
    // Without `up` known as a link, passwd's target stays lexically inside: accepted for now.
    expect((await add(depot.url, id, { type: "link", path: "passwd", target: PASSWD_TARGET })).status).toBe(201);
    expect((await add(depot.url, id, { type: "link", path: UP, target: UP_TARGET })).status).toBe(201);
    const summary = (await (await fetch(`${depot.url}/summary/${id}`)).json()) as {
      problems: Array<{ code: string; path: string }>;
    };
    expect(summary.problems).toEqual([expect.objectContaining({ code: "PATH_INVALID", path: "passwd" })]);
    const refused = await problem(fetch(`${depot.url}/commit/${id}`, { method: "POST" }), 422, "COMMIT_INVALID");
    expect(refused.problems).toEqual([expect.objectContaining({ code: "PATH_INVALID", path: "passwd" })]);
    expect(
      (await fetch(`${depot.url}/version/chain`).then((r) => r.json())).versions.map(
        (v: { version: string }) => v.version,
      ),
    ).toEqual(["1.0.0"]);
  });

  it("refuses a cycle and a chain into .pkg/, accepts chains that stay inside", async () => {
    const id = await openTransaction(depot.url, "loops@1.0.0");
    expect((await add(depot.url, id, { type: "link", path: "x", target: "y" })).status).toBe(201);
    await problem(add(depot.url, id, { type: "link", path: "y", target: "x" }), 400, "PATH_INVALID");
    expect((await add(depot.url, id, { type: "link", path: "d/top", target: ".." })).status).toBe(201);
    await problem(
      add(depot.url, id, { type: "link", path: "meta", target: "d/top/.pkg/manifest.json" }),
      400,
      "PATH_INVALID",
    );
    expect((await add(depot.url, id, { type: "file", path: "lib/v2/tool", body: "tool\n" })).status).toBe(201);
    expect((await add(depot.url, id, { type: "link", path: "lib/current", target: "v2" })).status).toBe(201);
    expect((await add(depot.url, id, { type: "link", path: "bin/tool", target: "../lib/current/tool" })).status).toBe(
      201,
    );
    expect(
      (await add(depot.url, id, { type: "link", path: "bin/up", target: "../d/top/lib/current/../v2/tool" })).status,
    ).toBe(201);
    // x → y stays dangling (y was refused): harmless, published.
    expect((await fetch(`${depot.url}/commit/${id}`, { method: "POST" })).status).toBe(201);
  });
});

describe("the cost of resolving a hostile link target", () => {
  it("a 2,000-segment target into a directory that holds nothing costs a handful of record reads, not 2,000", async () => {
    const store = createMemoryStore();
    let reads = 0;
    const counting = { ...store, getRecord: (key: string) => (reads++, store.getRecord(key)) } as typeof store;
    const depot = await startDepot(counting);
    try {
      const id = await openTransaction(depot.url, "deep@1.0.0");
      expect((await add(depot.url, id, { type: "file", path: "real/file", body: "x" })).status).toBe(201);
      const target = Array.from({ length: 2000 }, () => "a").join("/");
      reads = 0;
      expect((await add(depot.url, id, { type: "link", path: "deep", target })).status).toBe(201);
      expect(reads).toBeLessThan(40);
      // Inside a directory that does hold items, each step is looked up (and resolved right).
      reads = 0;
      await problem(add(depot.url, id, { type: "link", path: "up", target: "real/../.." }), 400, "PATH_INVALID");
    } finally {
      await depot.close();
    }
  });
});

describe("upload by reference (issue 9, depot 3)", () => {
  const admin = `admin-${randomBytes(8).toString("hex")}`;
  const foo = `foo-${randomBytes(8).toString("hex")}`;
  const secretBytes = `private bytes ${randomBytes(16).toString("hex")}\n`;
  const pendingBytes = `unpublished bytes ${randomBytes(16).toString("hex")}\n`;
  let depot: LiveDepot;
  let publicDepot: LiveDepot;
  const as = (token: string) => ({ authorization: `Bearer ${token}` });

  beforeAll(async () => {
    const tokens = { [admin]: ["*"], [foo]: ["foo-*"] };
    depot = await startDepot(createMemoryStore(), { authorize: bearerTokens(tokens) });
    publicDepot = await startDepot(createMemoryStore(), { authorize: bearerTokens(tokens, { publicRead: true }) });
    for (const d of [depot, publicDepot]) {
      expect(
        (await publish(d.url, "secret@1.0.0", [{ type: "file", path: "key", body: secretBytes }], as(admin))).status,
      ).toBe(201);
    }
  });
  afterAll(async () => {
    await depot.close();
    await publicDepot.close();
  });

  /** An empty-body file addition by reference. */
  const reference = (d: LiveDepot, id: string, digest: string, token: string, path = "ref") =>
    fetch(`${d.url}/add/${id}/file`, {
      method: "POST",
      headers: { ...as(token), "pkg-path": path, "content-digest": digest },
    });
  /**
   * The index of published bytes is written just after a commit answers, so a reader's
   * reference may take a few tries; each refused one must answer exactly like unknown content.
   */
  async function referenceEventually(send: () => Promise<Response>): Promise<number> {
    // Up to 2,000 tries (20 s or more): the index write may lag on a loaded machine.
    for (let attempt = 0; attempt < 2000; attempt++) {
      const r = await send();
      if (r.status === 201) return 201;
      expect({ status: r.status, code: ((await r.json()) as { code: string }).code }).toEqual({
        status: 409,
        code: "DIGEST_UNKNOWN",
      });
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    return 409;
  }

  /** The answer's body with the digest it names replaced, so two answers compare whole. */
  const normalised = async (r: Response) => ({
    status: r.status,
    type: r.headers.get("content-type"),
    body: (await r.text()).replace(/sha256:[0-9a-f]{64}/g, "<digest>"),
  });

  it("answers a foreign private package's item and archive digests exactly as unknown content, and copies nothing", async () => {
    const archiveDigest = (
      (await (await fetch(`${depot.url}/version/secret@1.0.0`, { headers: as(admin) })).json()) as {
        versions: Array<{ digest: string }>;
      }
    ).versions[0]!.digest;
    const id = await openTransaction(depot.url, "foo-evil@1.0.0", as(foo));
    const unknown = await normalised(await reference(depot, id, httpDigest(randomBytes(32)), foo, "unknown"));
    expect(unknown.status).toBe(409);
    expect(JSON.parse(unknown.body).code).toBe("DIGEST_UNKNOWN");
    const item = await normalised(await reference(depot, id, httpDigest(secretBytes), foo, "item"));
    const archive = await normalised(
      await reference(
        depot,
        id,
        `sha-256=:${Buffer.from(archiveDigest.slice(7), "hex").toString("base64")}:`,
        foo,
        "archive",
      ),
    );
    expect(item).toEqual(unknown);
    expect(archive).toEqual(unknown);
    const summary = (await (await fetch(`${depot.url}/summary/${id}`, { headers: as(foo) })).json()) as {
      items: unknown[];
    };
    expect(summary.items).toEqual([]);
  });

  it("does not reveal bytes sitting in another principal's open transaction either", async () => {
    const adminTx = await openTransaction(depot.url, "secret@2.0.0", as(admin));
    expect((await add(depot.url, adminTx, { type: "file", path: "next", body: pendingBytes }, as(admin))).status).toBe(
      201,
    );
    const id = await openTransaction(depot.url, "foo-evil@2.0.0", as(foo));
    await problem(reference(depot, id, httpDigest(pendingBytes), foo), 409, "DIGEST_UNKNOWN");
    // The uploader itself may reference what it sent, in another transaction.
    const again = await openTransaction(depot.url, "secret@3.0.0", as(admin));
    const own = await reference(depot, again, httpDigest(pendingBytes), admin);
    expect(own.status).toBe(201);
    expect(await own.json()).toMatchObject({
      digest: storeDigest(pendingBytes),
      size: Buffer.byteLength(pendingBytes),
    });
  });

  it("accepts references to bytes the principal uploaded itself or may read", async () => {
    const mine = `foo's own bytes ${randomBytes(8).toString("hex")}`;
    expect(
      (await publish(depot.url, "foo-lib@1.0.0", [{ type: "file", path: "lib", body: mine }], as(foo))).status,
    ).toBe(201);
    const id = await openTransaction(depot.url, "foo-lib@1.1.0", as(foo));
    expect((await reference(depot, id, httpDigest(mine), foo)).status).toBe(201);
    // The admin may read secret, so it may reference its bytes (it uploaded them too).
    const adminTx = await openTransaction(depot.url, "other@1.0.0", as(admin));
    expect((await reference(depot, adminTx, httpDigest(secretBytes), admin)).status).toBe(201);
    // The admin never uploaded foo's bytes but may read foo-lib: a reference by readability.
    expect(await referenceEventually(() => reference(depot, adminTx, httpDigest(mine), admin, "from-foo"))).toBe(201);
  });

  it("notes a digest's uploaders and packages in one fs directory, and still honours notes in the earlier layout", async () => {
    const tmp = await tempDir("depot-bref-");
    const store = createFsStore(tmp.dir);
    const fsDepot = await startDepot(store, { authorize: bearerTokens({ [admin]: ["*"], [foo]: ["foo-*"] }) });
    try {
      const bytes = `noted bytes ${randomBytes(8).toString("hex")}`;
      expect(
        (await publish(fsDepot.url, "foo-noted@1.0.0", [{ type: "file", path: "f", body: bytes }], as(foo))).status,
      ).toBe(201);
      const digest = storeDigest(bytes);
      const prefix = `bref/${digest}/`;
      // The package's note is written just after the commit answers.
      let keys: string[] = [];
      for (let i = 0; i < 2000 && !keys.some((k) => k.startsWith(`${prefix}p.`)); i++) {
        keys = (await store.listRecords(prefix)).keys;
        await new Promise((resolve) => setTimeout(resolve, 10));
      }
      expect(keys.map((k) => k.slice(prefix.length, prefix.length + 2)).sort()).toEqual(["p.", "u."]);
      // A store written before: the same notes a directory level down (`u/…`, `p/…`).
      for (const key of keys) {
        const older = key.replace(`${prefix}u.`, `${prefix}u/`).replace(`${prefix}p.`, `${prefix}p/`);
        expect(await store.putRecord(older, {}, { ifRevision: null })).not.toBeNull();
        expect(await store.deleteRecord(key)).toBe(true);
      }
      // The uploader references its bytes by its older note; the admin, who never sent
      // them, by the older note of a package it may read.
      const own = await openTransaction(fsDepot.url, "foo-noted@2.0.0", as(foo));
      expect((await reference(fsDepot, own, httpDigest(bytes), foo)).status).toBe(201);
      const other = await openTransaction(fsDepot.url, "admin-copy@1.0.0", as(admin));
      expect((await reference(fsDepot, other, httpDigest(bytes), admin)).status).toBe(201);
    } finally {
      await fsDepot.close();
      await store.close?.();
      await tmp.cleanup();
    }
  });

  it("on a public-read depot, published bytes are readable by anyone, so a scoped token may reference them", async () => {
    const id = await openTransaction(publicDepot.url, "foo-copy@1.0.0", as(foo));
    expect(await referenceEventually(() => reference(publicDepot, id, httpDigest(secretBytes), foo))).toBe(201);
  });
});

describe("a scoped token on a public-read depot (issue 9, depot 6)", () => {
  const admin = `admin-${randomBytes(8).toString("hex")}`;
  const foo = `foo-${randomBytes(8).toString("hex")}`;
  let open: LiveDepot;
  let closed: LiveDepot;
  beforeAll(async () => {
    const tokens = { [admin]: ["*"], [foo]: ["foo-*"] };
    open = await startDepot(createMemoryStore(), { authorize: bearerTokens(tokens, { publicRead: true }) });
    closed = await startDepot(createMemoryStore(), { authorize: bearerTokens(tokens) });
    for (const d of [open, closed]) {
      expect(
        (
          await publish(d.url, "bar@1.0.0", [{ type: "file", path: "bar.txt", body: "bar\n" }], {
            authorization: `Bearer ${admin}`,
          })
        ).status,
      ).toBe(201);
    }
  });
  afterAll(async () => {
    await open.close();
    await closed.close();
  });

  it("reads public packages with a token scoped elsewhere, and installs them through the client", async () => {
    const headers = { authorization: `Bearer ${foo}` };
    for (const path of ["/catalog", "/version/bar", "/depend/bar@1.0.0", "/data/bar@1.0.0"]) {
      const r = await fetch(open.url + path, { headers });
      expect(r.status, path).toBe(200);
      await r.arrayBuffer();
    }
    const tmp = await tempDir("depot-scoped-");
    try {
      const result = await createDepotClient({ baseUrl: open.url, token: foo }).install("bar", tmp.dir);
      expect(result.packages.map((p) => `${p.name}@${p.version}`)).toEqual(["bar@1.0.0"]);
    } finally {
      await tmp.cleanup();
    }
    // Publishing stays scoped, and a token that is not valid is still refused.
    await problem(fetch(`${open.url}/trans/bar@2.0.0`, { method: "POST", headers }), 403, "PERMISSION_DENIED");
    await problem(
      fetch(`${open.url}/version/bar`, { headers: { authorization: "Bearer not-a-token" } }),
      401,
      "UNAUTHENTICATED",
    );
  });

  it("without public read the scope still limits reading", async () => {
    await problem(
      fetch(`${closed.url}/version/bar`, { headers: { authorization: `Bearer ${foo}` } }),
      403,
      "PERMISSION_DENIED",
    );
  });
});

/** A raw HTTP/1.1 request (node:http), so that `Host` can be whatever an attacker sends. */
function rawRequest(
  url: string,
  method: string,
  path: string,
  headers: Record<string, string>,
): Promise<{ status: number; body: string; headers: Record<string, unknown> }> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve, reject) => {
    const req = httpRequest({ host: hostname, port, method, path, headers }, (res) => {
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (chunk: string) => (body += chunk));
      res.on("end", () => resolve({ status: res.statusCode!, body, headers: res.headers }));
    });
    req.on("error", reject);
    req.end();
  });
}

describe("smaller holes (issue 9, depot 8)", () => {
  let depot: LiveDepot;
  let withPublicUrl: LiveDepot;
  beforeAll(async () => {
    depot = await startDepot(createMemoryStore());
    withPublicUrl = await startDepot(createMemoryStore(), { publicUrl: "https://depot.example.com/packages/" });
  });
  afterAll(async () => {
    await depot.close();
    await withPublicUrl.close();
  });

  it("refuses C0, DEL and C1 control characters in Pkg-Path and Pkg-Target, and accepts U+00A0", async () => {
    const id = await openTransaction(depot.url, "controls@1.0.0");
    for (const encoded of ["a%01b", "tab%09", "nl%0A", "del%7F", "c1%C2%80", "c1%C2%9F", "esc%1B%5B31m"]) {
      const file = await fetch(`${depot.url}/add/${id}/file`, {
        method: "POST",
        headers: { "pkg-path": encoded },
        body: "x",
      });
      await problem(file, 400, "PATH_INVALID");
      const link = await fetch(`${depot.url}/add/${id}/link`, {
        method: "POST",
        headers: { "pkg-path": "l", "pkg-target": encoded },
      });
      await problem(link, 400, "PATH_INVALID");
    }
    await problem(
      fetch(`${depot.url}/add/${id}/set`, { method: "POST", headers: { "pkg-attr": "description=bell%07" } }),
      400,
      "HEADER_INVALID",
    );
    expect(
      (
        await fetch(`${depot.url}/add/${id}/set`, {
          method: "POST",
          headers: { "pkg-attr": "description=two%0Alines%09tab" },
        })
      ).status,
    ).toBe(201);
    // semver would read a tab as a separator: a range with one is refused.
    await problem(
      fetch(`${depot.url}/meta/${id}/require`, { method: "POST", headers: { "pkg-require": "libfoo@%3E%3D1%09%3C2" } }),
      400,
      "RANGE_INVALID",
    );
    expect(
      (
        await fetch(`${depot.url}/add/${id}/file`, {
          method: "POST",
          headers: { "pkg-path": "nbsp%C2%A0ok" },
          body: "x",
        })
      ).status,
    ).toBe(201);
  });

  it("never reflects the Host header into commit and summary URLs; a configured publicUrl is used instead", async () => {
    for (const [d, expected] of [
      [depot, "/data/hosted@1.0.0"],
      [withPublicUrl, "https://depot.example.com/packages/data/hosted@1.0.0"],
    ] as const) {
      const id = await openTransaction(d.url, "hosted@1.0.0");
      expect((await add(d.url, id, { type: "file", path: "f", body: "f" })).status).toBe(201);
      const commit = await rawRequest(d.url, "POST", `/commit/${id}`, { host: "evil.example" });
      expect(commit.status).toBe(201);
      expect(JSON.parse(commit.body).url).toBe(expected);
      const summary = await rawRequest(d.url, "GET", `/summary/${id}`, { host: "evil.example" });
      expect(JSON.parse(summary.body).url).toBe(expected);
      expect(
        commit.body + summary.body + JSON.stringify(commit.headers) + JSON.stringify(summary.headers),
      ).not.toContain("evil.example");
    }
    // The client still hands back an absolute URL, resolved against the depot it talks to.
    const published = await createDepotClient({ baseUrl: depot.url }).publish({
      name: "viaclient",
      version: "1.0.0",
      items: [{ type: "file", path: "f", content: "f" }],
    });
    expect(published.url).toBe(`${depot.url}/data/viaclient@1.0.0`);
  });

  it("refuses two different sha-256 members in Content-Digest; identical repeats pass", async () => {
    const id = await openTransaction(depot.url, "digests@1.0.0");
    const body = "content\n";
    const other = httpDigest("something else");
    for (const header of [
      `${httpDigest(body)}, ${other}`,
      `${other}, ${httpDigest(body)}`,
      `sha-256=:${Buffer.alloc(32).toString("base64")}:, ${httpDigest(body)}`,
    ]) {
      const r = await fetch(`${depot.url}/add/${id}/file`, {
        method: "POST",
        headers: { "pkg-path": "f", "content-digest": header },
        body,
      });
      const refused = await problem(r, 400, "HEADER_INVALID");
      expect(refused.detail).toMatch(/two different sha-256/);
    }
    const same = await fetch(`${depot.url}/add/${id}/file`, {
      method: "POST",
      headers: { "pkg-path": "f", "content-digest": `${httpDigest(body)}, sha-512=:AAAA:, ${httpDigest(body)}` },
      body,
    });
    expect(same.status).toBe(201);
  });
});
