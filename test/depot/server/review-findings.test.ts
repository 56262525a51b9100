/**
 * Reviewer findings on the depot, each provoked over real HTTP (fetch against a listening
 * servePackageRouter on 127.0.0.1:0): names and keys that are Object.prototype members,
 * 5xx codes kept, the open-transaction limit under concurrency, HEAD wherever GET works,
 * 405 with Allow, and problem types as URNs; over raw sockets, requests fetch cannot make
 * (TRACE, CONNECT, a target starting with //, the asterisk form, an unknown Expect).
 */
import { randomUUID } from "node:crypto";
import { readFile } from "node:fs/promises";
import { connect } from "node:net";
import { hostname } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createFsStore } from "../../../src/adapters/fs/store.js";
import { createMemoryStore } from "../../../src/adapters/memory/store.js";
import { createDepotClient } from "../../../src/depot/client/depot-client.js";
import { installPackage, readInstalled } from "../../../src/depot/install/installer.js";
import type { PackageStore } from "../../../src/depot/ports.js";
import { createPackageRouter } from "../../../src/depot/server/router.js";
import { servePackageRouter } from "../../../src/depot/server/serve.js";
import { RunnerDepotError } from "../../../src/errors.js";
import { add, openTransaction, parseTar, publish, startDepot, tempDir, type LiveDepot } from "../../fixtures/depot.js";

async function expectProblem(
  response: Response | Promise<Response>,
  status: number,
  code: string,
): Promise<Record<string, unknown>> {
  const r = await response;
  expect(r.headers.get("content-type")).toBe("application/problem+json");
  const body = (await r.json()) as Record<string, unknown>;
  expect({ status: r.status, code: body.code, bodyStatus: body.status }).toEqual({ status, code, bodyStatus: status });
  return body;
}

const PROTO_NAMES = [
  "constructor",
  "toString",
  "valueOf",
  "hasOwnProperty",
  "isPrototypeOf",
  "propertyIsEnumerable",
  "toLocaleString",
];

for (const kind of ["memory", "fs"] as const) {
  describe(`Object.prototype member names and keys (${kind} store)`, () => {
    let store: PackageStore;
    let depot: LiveDepot;
    let cleanup: () => Promise<void> = async () => undefined;
    const errors: unknown[] = [];
    beforeAll(async () => {
      if (kind === "fs") {
        const tmp = await tempDir("depot-proto-");
        cleanup = tmp.cleanup;
        store = createFsStore(path.join(tmp.dir, "store"), { unsafeNoSync: true });
      } else {
        store = createMemoryStore();
      }
      depot = await startDepot(store, { onError: (e) => errors.push(e) });
    });
    afterAll(async () => {
      await depot.close();
      await cleanup();
    });

    it("publishes and serves packages named constructor, toString, valueOf…; attribute and licence keys likewise", async () => {
      const attrs = Object.fromEntries(PROTO_NAMES.map((k) => [k, `value of ${k}`]));
      const commit = await publish(depot.url, "constructor@1.0.0", [
        { type: "file", path: "constructor/toString", body: "hello\n" },
        { type: "license", name: "constructor", body: "licence text\n" },
        { type: "license", name: "toString", body: "another\n" },
        { type: "set", attrs },
        { type: "require", requires: ["valueof@^1"] },
      ]);
      expect(commit.status).toBe(201);
      for (const name of PROTO_NAMES.slice(1)) {
        expect(
          (await publish(depot.url, `${name}@1.0.0`, [{ type: "file", path: "f", body: name }])).status,
          name,
        ).toBe(201);
      }

      const catalogResponse = await fetch(`${depot.url}/catalog`);
      expect(catalogResponse.status).toBe(200);
      const catalog = (await catalogResponse.json()) as {
        packages: Record<string, { latest: string; versions: string[] }>;
        count: number;
      };
      expect(catalog.count).toBe(PROTO_NAMES.length);
      for (const name of PROTO_NAMES.map((n) => n.toLowerCase())) {
        expect(Object.hasOwn(catalog.packages, name), name).toBe(true);
        expect(catalog.packages[name], name).toMatchObject({ latest: "1.0.0", versions: ["1.0.0"] });
      }

      const version = (await (await fetch(`${depot.url}/version/constructor`)).json()) as {
        name: string;
        versions: Array<{ attributes: Record<string, string> }>;
      };
      expect(version.name).toBe("constructor");
      expect(version.versions).toHaveLength(1);
      expect(version.versions[0]!.attributes).toEqual(attrs);
      expect(await (await fetch(`${depot.url}/depend/constructor@1.0.0`)).json()).toEqual({
        name: "constructor",
        version: "1.0.0",
        requires: [{ name: "valueof", range: "^1" }],
      });

      const data = await fetch(`${depot.url}/data/constructor`);
      expect(data.status).toBe(200);
      const entries = await parseTar(new Uint8Array(await data.arrayBuffer()));
      expect(entries.map((e) => e.name)).toEqual([
        ".pkg/manifest.json",
        ".pkg/licenses/constructor",
        ".pkg/licenses/toString",
        "constructor/toString",
      ]);
      const manifest = JSON.parse(entries[0]!.body.toString("utf8")) as { attributes: Record<string, string> };
      expect(manifest.attributes).toEqual(attrs);

      // A second licence text under a prototype name is a repeat of an own key only.
      const id = await openTransaction(depot.url, "constructor@1.1.0");
      expect((await add(depot.url, id, { type: "license", name: "valueOf", body: "x" })).status).toBe(201);
      await expectProblem(add(depot.url, id, { type: "license", name: "valueOf", body: "x" }), 409, "PATH_EXISTS");
      expect(
        (await add(depot.url, id, { type: "file", path: "constructor/toString", body: "hello again\n" })).status,
      ).toBe(201);
      expect((await fetch(`${depot.url}/commit/${id}`, { method: "POST" })).status).toBe(201);
      expect((await fetch(`${depot.url}/catalog`)).status).toBe(200);
      expect(errors).toEqual([]);
    });

    it("refuses __proto__ as a package name, attribute key or licence, and keeps the transaction intact", async () => {
      await expectProblem(fetch(`${depot.url}/trans/__proto__@1.0.0`, { method: "POST" }), 400, "NAME_INVALID");
      await expectProblem(fetch(`${depot.url}/version/__proto__`), 400, "NAME_INVALID");
      const id = await openTransaction(depot.url, "keys@1.0.0");
      expect((await add(depot.url, id, { type: "set", attrs: { description: "kept" } })).status).toBe(201);
      await expectProblem(
        fetch(`${depot.url}/add/${id}/set`, { method: "POST", headers: { "Pkg-Attr": "__proto__=%7B%7D" } }),
        400,
        "HEADER_INVALID",
      );
      await expectProblem(
        fetch(`${depot.url}/add/${id}/license`, { method: "POST", headers: { "Pkg-License": "__proto__" }, body: "x" }),
        400,
        "HEADER_INVALID",
      );
      const summary = (await (await fetch(`${depot.url}/summary/${id}`)).json()) as {
        attributes: Record<string, string>;
        licenses: unknown[];
      };
      expect(summary.attributes).toEqual({ description: "kept" });
      expect(summary.licenses).toEqual([]);
    });

    it("recovers a commit of `constructor` whose process died before listing it, on a fresh router (recovery runs before the first request)", async () => {
      // (An older version than the newest, so the tests after this one install what they did.)
      // What a kill right after the version record leaves: the transaction `committing`
      // under an attempt of a dead process (this host, a pid that does not exist), holding
      // its slot, and a version record the package record does not list yet.
      const v11 = (await store.getRecord<Record<string, unknown>>("version/constructor/1.1.0"))!.value;
      const id = randomUUID();
      const at = new Date().toISOString();
      const deadAttempt = `${encodeURIComponent(hostname())}|999999999|${randomUUID()}|${randomUUID()}`;
      const trans = {
        id,
        name: "constructor",
        version: "0.9.0",
        principal: "anonymous",
        state: "committing",
        createdAt: at,
        touchedAt: at,
        requires: [],
        attributes: {},
        licenses: {},
        itemCount: 0,
        bytes: 0,
        commitTime: Math.floor(Date.now() / 1000),
        commitAttempts: { [deadAttempt]: Date.now() },
      };
      expect(await store.putRecord(`trans/${id}`, trans, { ifRevision: null })).not.toBeNull();
      expect(
        await store.putRecord(
          `version/constructor/0.9.0`,
          { ...v11, version: "0.9.0", transaction: id },
          { ifRevision: null },
        ),
      ).not.toBeNull();
      const slotKey = (await store.listRecords("slots/")).keys[0]!;
      const slot = (await store.getRecord<{ ids: string[] }>(slotKey))!;
      expect(
        await store.putRecord(slotKey, { ids: [...slot.value.ids, id] }, { ifRevision: slot.revision }),
      ).not.toBeNull();
      const before = (await (await fetch(`${depot.url}/catalog`)).json()) as { position: number };

      const seen: unknown[] = [];
      const fresh = await servePackageRouter(createPackageRouter(store, { onError: (e) => seen.push(e) }));
      try {
        const catalog = (await (await fetch(`${fresh.url}/catalog`)).json()) as {
          packages: Record<string, { versions: string[] }>;
        };
        expect(Object.hasOwn(catalog.packages, "constructor")).toBe(true);
        expect(catalog.packages["constructor"]!.versions).toEqual(["0.9.0", "1.0.0", "1.1.0"]);
        const since = (await (await fetch(`${fresh.url}/catalog?since=${before.position}`)).json()) as {
          changes: unknown[];
        };
        expect(since.changes).toEqual([{ position: before.position + 1, name: "constructor", version: "0.9.0" }]);
        const summary = (await (await fetch(`${fresh.url}/summary/${id}`)).json()) as { state: string };
        expect(summary.state).toBe("committed");
        expect((await store.getRecord<{ ids: string[] }>(slotKey))!.value.ids).not.toContain(id);
        expect((await fetch(`${fresh.url}/version/valueof`)).status).toBe(200);
        expect(seen).toEqual([]);
      } finally {
        await fresh.close();
      }
    });

    it("installs `constructor` and its dependency with the client, then finds it installed", async () => {
      const tmp = await tempDir("depot-proto-install-");
      try {
        const client = createDepotClient({ baseUrl: depot.url });
        const first = await installPackage(client, "constructor@1.0.0", tmp.dir);
        expect(first.packages.map((p) => [p.name, p.action])).toEqual([
          ["valueof", "installed"],
          ["constructor", "installed"],
        ]);
        expect(await readFile(path.join(tmp.dir, "constructor/constructor/toString"), "utf8")).toBe("hello\n");
        const installed = await readInstalled(tmp.dir);
        expect(Object.hasOwn(installed.packages, "constructor")).toBe(true);
        expect(installed.packages["constructor"]!.version).toBe("1.0.0");
        // A second run sees `constructor` as itself: unchanged, then upgraded by a delta.
        const again = await installPackage(client, "constructor@1.0.0", tmp.dir);
        expect(again.packages.map((p) => p.action)).toEqual(["unchanged", "unchanged"]);
        const upgrade = await installPackage(client, "constructor", tmp.dir);
        expect(upgrade.packages.find((p) => p.name === "constructor")).toMatchObject({
          action: "upgraded",
          from: "1.0.0",
          via: "delta",
        });
        expect(await readFile(path.join(tmp.dir, "constructor/constructor/toString"), "utf8")).toBe("hello again\n");
      } finally {
        await tmp.cleanup();
      }
    });
  });
}

describe("5xx answers keep their status and code", () => {
  function failing(error: () => unknown): PackageStore {
    return { ...createMemoryStore(), getRecord: async () => Promise.reject(error()) };
  }

  it("504 DEADLINE_EXCEEDED and 502 stay what they are; only INTERNAL hides its detail", async () => {
    const cases = [
      {
        error: () => new RunnerDepotError("DEADLINE_EXCEEDED", "the record store took too long"),
        status: 504,
        code: "DEADLINE_EXCEEDED",
        detail: "the record store took too long",
      },
      {
        error: () => new RunnerDepotError("ARCHIVE_INVALID", "stored archive is damaged"),
        status: 502,
        code: "ARCHIVE_INVALID",
        detail: "stored archive is damaged",
      },
      {
        error: () => new RunnerDepotError("INTERNAL", "secret path /srv/x"),
        status: 500,
        code: "INTERNAL",
        detail: "An internal error occurred.",
      },
      {
        error: () => new RunnerDepotError("UNAVAILABLE", "pg down"),
        status: 503,
        code: "STORE_UNAVAILABLE",
        detail: "The package store is unavailable; retry later",
      },
    ];
    for (const c of cases) {
      const seen: unknown[] = [];
      const server = await servePackageRouter(createPackageRouter(failing(c.error), { onError: (e) => seen.push(e) }));
      try {
        const body = await expectProblem(fetch(`${server.url}/catalog`), c.status, c.code);
        expect(body.detail).toBe(c.detail);
        // Unexpected server faults are reported to the host; an unavailable store is not a fault.
        expect(seen).toHaveLength(c.code === "STORE_UNAVAILABLE" ? 0 : 1);
      } finally {
        await server.close();
      }
    }
  });
});

describe("open transactions per principal under concurrency", () => {
  async function openMany(urls: string[], count: number, headers: Record<string, string> = {}): Promise<number[]> {
    const responses = await Promise.all(
      Array.from({ length: count }, (_, i) =>
        fetch(`${urls[i % urls.length]}/trans/burst@1.0.${i}`, { method: "POST", headers }),
      ),
    );
    for (const r of responses) await r.body?.cancel();
    return responses.map((r) => r.status);
  }

  const tally = (statuses: number[]) => ({
    opened: statuses.filter((s) => s === 201).length,
    refused: statuses.filter((s) => s === 429).length,
  });

  for (const kind of ["memory", "fs"] as const) {
    it(`limit 5, 20 concurrent opens: exactly 5 succeed, 15 get 429 (${kind} store)`, async () => {
      const tmp = await tempDir("depot-burst-");
      const store = kind === "fs" ? createFsStore(tmp.dir, { unsafeNoSync: true }) : createMemoryStore();
      const depot = await startDepot(store, { limits: { openTransactions: 5 } });
      try {
        expect(tally(await openMany([depot.url], 20))).toEqual({ opened: 5, refused: 15 });
        // Abandoning one frees exactly one slot.
        const ids = (await store.getRecord<{ ids: string[] }>((await store.listRecords("slots/")).keys[0]!))!.value.ids;
        expect(ids).toHaveLength(5);
        expect((await fetch(`${depot.url}/trans/${ids[0]}`, { method: "DELETE" })).status).toBe(204);
        expect(tally(await openMany([depot.url], 6))).toEqual({ opened: 1, refused: 5 });
        // Refused opens left no transaction behind: 5 + 1 opened (one of them abandoned).
        expect((await store.listRecords("trans/")).keys).toHaveLength(6);
      } finally {
        await depot.close();
        await tmp.cleanup();
      }
    });
  }

  it("is exact across two routers (two servers, two store instances) sharing one fs directory", async () => {
    const tmp = await tempDir("depot-burst-shared-");
    const a = await startDepot(createFsStore(tmp.dir, { unsafeNoSync: true }), { limits: { openTransactions: 5 } });
    const b = await startDepot(createFsStore(tmp.dir, { unsafeNoSync: true }), { limits: { openTransactions: 5 } });
    try {
      expect(tally(await openMany([a.url, b.url], 20))).toEqual({ opened: 5, refused: 15 });
    } finally {
      await a.close();
      await b.close();
      await tmp.cleanup();
    }
  });
});

describe("HEAD, 405 and problem types", () => {
  let depot: LiveDepot;
  let id = "";
  beforeAll(async () => {
    depot = await startDepot(createMemoryStore());
    expect(
      (
        await publish(depot.url, "app@1.0.0", [
          { type: "file", path: "a", body: "a" },
          { type: "require", requires: ["lib@^1"] },
        ])
      ).status,
    ).toBe(201);
    id = await openTransaction(depot.url, "app@2.0.0");
  });
  afterAll(() => depot.close());

  it("answers HEAD wherever GET works, with GET's status and headers and no body", async () => {
    for (const p of [
      "/catalog",
      "/version/app",
      "/version/app@1.0.0",
      "/depend/app",
      "/data/app",
      `/summary/${id}`,
      "/version/nothing",
      "/depend/app@9.9.9",
      "/version/-bad",
    ]) {
      const get = await fetch(`${depot.url}${p}`);
      const getBody = Buffer.from(await get.arrayBuffer());
      const head = await fetch(`${depot.url}${p}`, { method: "HEAD" });
      expect(head.status, p).toBe(get.status);
      expect(Buffer.from(await head.arrayBuffer()).length, p).toBe(0);
      expect(head.headers.get("content-type"), p).toBe(get.headers.get("content-type"));
      expect(head.headers.get("content-length"), p).toBe(String(getBody.length));
    }
  });

  it("answers 405 METHOD_NOT_ALLOWED with Allow for a known path and an unsupported method; 404 elsewhere", async () => {
    const cases: Array<[string, string, string]> = [
      ["PUT", "/catalog", "GET, HEAD"],
      ["POST", "/catalog", "GET, HEAD"],
      ["OPTIONS", "/catalog", "GET, HEAD"],
      ["DELETE", "/version/app", "GET, HEAD"],
      ["POST", "/depend/app", "GET, HEAD"],
      ["DELETE", "/data/app", "GET, HEAD"],
      ["PUT", "/data/app/1.0.0", "GET, HEAD"],
      ["PATCH", "/data/app/1.0.0/1.0.0", "GET, HEAD"],
      ["GET", `/commit/${id}`, "POST"],
      ["GET", `/trans/${id}`, "POST, DELETE"],
      ["PUT", `/add/${id}/file`, "POST"],
      ["DELETE", `/summary/${id}`, "GET, HEAD"],
      ["GET", `/meta/${id}/require`, "POST"],
    ];
    for (const [method, p, allow] of cases) {
      const response = await fetch(`${depot.url}${p}`, { method });
      const body = await expectProblem(response, 405, "METHOD_NOT_ALLOWED");
      expect(response.headers.get("allow"), `${method} ${p}`).toBe(allow);
      expect(body).not.toHaveProperty("allow");
    }
    // The transaction was not touched by any of them.
    expect(((await (await fetch(`${depot.url}/summary/${id}`)).json()) as { state: string }).state).toBe("open");
    await expectProblem(fetch(`${depot.url}/nowhere`, { method: "PUT" }), 404, "NOT_FOUND");
    await expectProblem(fetch(`${depot.url}/version/a/b`, { method: "GET" }), 404, "NOT_FOUND");
    await expectProblem(fetch(`${depot.url}/meta/${id}/provide`, { method: "GET" }), 404, "NOT_FOUND");
  });

  it("problem types are URNs naming the code", async () => {
    const body = await expectProblem(fetch(`${depot.url}/version/nothing`), 404, "PACKAGE_NOT_FOUND");
    expect(body.type).toBe("urn:runner-depot:problem:package-not-found");
    expect(
      (await expectProblem(fetch(`${depot.url}/catalog`, { method: "PUT" }), 405, "METHOD_NOT_ALLOWED")).type,
    ).toBe("urn:runner-depot:problem:method-not-allowed");
  });
});

/** One raw HTTP/1.1 exchange on a new connection: everything the server sent until it closed. */
function rawExchange(port: number, request: string): Promise<string> {
  return new Promise((resolve, reject) => {
    let text = "";
    const socket = connect(port, "127.0.0.1", () => socket.write(request));
    socket.setTimeout(10_000, () => socket.destroy(new Error("no answer within 10 s")));
    socket.on("data", (chunk) => (text += chunk.toString("latin1")));
    socket.on("error", reject);
    socket.on("close", () => resolve(text));
  });
}

/** Status, headers (lower-case names) and the problem document of a raw answer. */
function rawProblem(text: string): { status: number; headers: Record<string, string>; body: Record<string, unknown> } {
  const [head = "", rest = ""] = text.split("\r\n\r\n", 2);
  const [statusLine = "", ...lines] = head.split("\r\n");
  const headers = Object.fromEntries(
    lines.map((l) => [l.slice(0, l.indexOf(":")).toLowerCase(), l.slice(l.indexOf(":") + 1).trim()]),
  );
  const json = rest.slice(rest.indexOf("{"), rest.lastIndexOf("}") + 1); // plain or one chunk
  return { status: Number(statusLine.split(" ")[1]), headers, body: JSON.parse(json) as Record<string, unknown> };
}

/** A raw answer is a 405 METHOD_NOT_ALLOWED problem document whose Allow is `allow`. */
function expectMethodNotAllowed(text: string, allow: string): void {
  const answer = rawProblem(text);
  expect({
    status: answer.status,
    type: answer.headers["content-type"],
    allow: answer.headers.allow,
    code: answer.body.code,
  }).toEqual({
    status: 405,
    type: "application/problem+json",
    allow,
    code: "METHOD_NOT_ALLOWED",
  });
}

describe("requests fetch cannot express, over real sockets (found by the HTTP router fuzz)", () => {
  let depot: LiveDepot;
  let port = 0;
  beforeAll(async () => {
    depot = await startDepot(createMemoryStore());
    port = Number(new URL(depot.url).port);
    expect((await publish(depot.url, "app@1.0.0", [{ type: "file", path: "a", body: "a" }])).status).toBe(201);
  });
  afterAll(() => depot.close());

  it("TRACE is 405 METHOD_NOT_ALLOWED with the path's Allow (was 500: a fetch Request cannot carry TRACE); 404 where nothing is", async () => {
    expectMethodNotAllowed(
      await rawExchange(port, "TRACE /catalog HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
      "GET, HEAD",
    );
    const unknown = rawProblem(
      await rawExchange(port, "TRACE /nowhere HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
    );
    expect({ status: unknown.status, code: unknown.body.code }).toEqual({ status: 404, code: "NOT_FOUND" });
  });

  it("CONNECT is answered 405 with an empty Allow (Node dropped the connection without a word)", async () => {
    expectMethodNotAllowed(
      await rawExchange(port, "CONNECT depot.example:443 HTTP/1.1\r\nHost: depot.example:443\r\n\r\n"),
      "",
    );
  });

  it("a target starting with // is a path, not an authority (was 500 for '//', and '//catalog' served /)", async () => {
    for (const target of ["//", "//catalog", "//evil.example/catalog"]) {
      const answer = rawProblem(
        await rawExchange(port, `GET ${target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`),
      );
      expect({ target, status: answer.status, code: answer.body.code }).toEqual({
        target,
        status: 404,
        code: "NOT_FOUND",
      });
    }
    const star = rawProblem(await rawExchange(port, "OPTIONS * HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
    expect({ status: star.status, code: star.body.code }).toEqual({ status: 400, code: "BAD_REQUEST" });
  });

  it("an Expect other than 100-continue is ignored (was Node's bare 417 without a problem document)", async () => {
    const text = await rawExchange(
      port,
      "GET /version/app HTTP/1.1\r\nHost: x\r\nExpect: something\r\nConnection: close\r\n\r\n",
    );
    expect(text.split("\r\n")[0]).toBe("HTTP/1.1 200 OK");
    expect(text).toContain('"app"');
  });
});
