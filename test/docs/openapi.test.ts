/**
 * openapi.yaml against the depot as built: the document is valid OpenAPI 3.1, and a
 * scripted set of real requests (one per operation × documented status, where it can be
 * provoked) sent with fetch to a listening servePackageRouter answers only documented
 * statuses, with documented headers and bodies that validate against the documented
 * schemas. Every documented (operation, status) is either exercised or listed in
 * NOT_EXERCISED with a reason, so the document and this test cannot drift apart silently.
 *
 * ajv and ajv-formats come from node_modules as dependencies of @readme/openapi-parser.
 */
import { createHash, randomUUID } from "node:crypto";
import { mkdtemp, readdir, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { compileErrors, dereference, validate } from "@readme/openapi-parser";
import ajv2020Module from "ajv/dist/2020.js";
import ajvFormatsModule from "ajv-formats";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createFsStore } from "../../src/adapters/fs/store.js";
import { createS3BlobStore } from "../../src/adapters/s3/index.js";
import { composeStore } from "../../src/depot/store/compose.js";
import { bearerTokens } from "../../src/depot/server/auth.js";
import type { PackageStore } from "../../src/depot/ports.js";
import { createPackageRouter, type PackageRouterOptions } from "../../src/depot/server/router.js";
import { servePackageRouter, type PackageServer } from "../../src/depot/server/serve.js";
import { startS3, type S3Fixture } from "../fixtures/backends.js";
import { signBundle } from "../../src/depot/signing/bundle.js";
import { generateSigningKey, signingKeyFromPem, trustedKeyEntry } from "../../src/depot/signing/keys.js";
import { signedVersionStatement } from "../../src/depot/signing/statement.js";
import { versionContent } from "../../src/depot/store/attestations.js";
import { keys, type VersionRecord } from "../../src/depot/store/records.js";

// ajv and ajv-formats are CommonJS: under NodeNext their default import is module.exports,
// which carries the class / plugin again as `.default`.
const Ajv2020 = ajv2020Module.default;
const addFormats = ajvFormatsModule.default;

const SPEC = fileURLToPath(new URL("../../openapi.yaml", import.meta.url));

type Json = Record<string, any>;

/** Documented (operationId, status) pairs the script does not provoke, and why. */
const NOT_EXERCISED: Record<string, string> = {
  "abandonTransaction 409": "CONFLICT only while a commit of the same transaction is running: a race, not scripted",
  "addRequires 409": "CONFLICT only while a commit of the same transaction is running: a race, not scripted",
  "commitTransaction 413":
    "TOO_MANY_ITEMS only after a machine crash lost the item count (test/adapters/fs/crash-leftovers.test.ts provokes it); TOO_MANY_VERSIONS only when the package filled up after the transaction opened (test/depot/catalog/package-record-bounds.test.ts)",
};

/** Status codes that every operation documents and the script checks on a few operations only. */
const SAMPLED = new Set(["401", "403", "431", "500", "503"]);

interface Exercise {
  op: string;
  path: string;
  method: string;
  status: number;
}

let doc: Json;
let ajv: InstanceType<typeof Ajv2020>;
const operations = new Map<string, { method: string; template: string; op: Json }>();
const exercised: Exercise[] = [];
const dirs: string[] = [];
const servers: PackageServer[] = [];
let open: PackageServer; // no authorize hook, fs store
let openStore: PackageStore;
let auth: PackageServer; // bearerTokens
let limited: PackageServer; // tiny limits
let down: PackageServer; // closed store: 503
let broken: PackageServer; // a store that throws a plain Error: 500
let signing: PackageServer; // S3 blobs (s3rver) that sign URLs: 302
let s3: S3Fixture;
const attestationKey = generateSigningKey();

/** Adds `additionalProperties: false` to every object schema that lists its properties, so undocumented members fail. */
function strict(schema: unknown, seen = new Set<unknown>()): unknown {
  if (typeof schema !== "object" || schema === null || seen.has(schema)) return schema;
  seen.add(schema);
  if (Array.isArray(schema)) {
    for (const s of schema) strict(s, seen);
    return schema;
  }
  const s = schema as Json;
  if (s.properties && s.additionalProperties === undefined && s.type === "object") s.additionalProperties = false;
  for (const value of Object.values(s)) strict(value, seen);
  return s;
}

const compiled = new WeakMap<object, (data: unknown) => boolean>();
function check(schema: Json, data: unknown, what: string): void {
  let fn = compiled.get(schema);
  if (!fn) {
    fn = ajv.compile(schema) as (data: unknown) => boolean;
    compiled.set(schema, fn);
  }
  const ok = fn(data);
  const errors = (fn as unknown as { errors?: unknown }).errors;
  expect(ok, `${what}: ${JSON.stringify(errors)}\n${JSON.stringify(data).slice(0, 800)}`).toBe(true);
}

function templateRegex(template: string): RegExp {
  return new RegExp(`^${template.replace(/\{[^}]+\}/g, "[^/]+")}$`);
}

/** Headers every HTTP request may carry; anything else the script sends must be documented. */
const STANDARD_REQUEST_HEADERS = new Set(["authorization", "content-type", "content-length", "accept", "user-agent"]);
const isExtensionHeader = (name: string) => name.startsWith("x-");

/**
 * Sends one request and checks it against the operation: path template, request headers
 * documented, status documented, required response headers present and valid, body valid.
 */
async function call(
  server: PackageServer,
  op: string,
  path: string,
  init: { method?: string; headers?: Record<string, string>; body?: BodyInit | null } = {},
): Promise<{ status: number; headers: Headers; json: Json | null; bytes: Buffer }> {
  const entry = operations.get(op);
  if (!entry) throw new Error(`no operation ${op} in openapi.yaml`);
  const method = init.method ?? entry.method.toUpperCase();
  expect(method).toBe(entry.method.toUpperCase());
  const pathOnly = path.split("?")[0]!;
  expect(pathOnly, `${op}: ${path} does not fit ${entry.template}`).toMatch(templateRegex(entry.template));
  const documentedHeaders = new Set(
    ((entry.op.parameters ?? []) as Json[]).filter((p) => p.in === "header").map((p) => String(p.name).toLowerCase()),
  );
  for (const name of Object.keys(init.headers ?? {})) {
    const lower = name.toLowerCase();
    if (!STANDARD_REQUEST_HEADERS.has(lower) && !isExtensionHeader(lower))
      expect(documentedHeaders.has(lower), `${op}: request header ${name} is not documented`).toBe(true);
  }
  const response = await fetch(server.url + path, {
    method,
    headers: init.headers,
    body: init.body ?? null,
    redirect: "manual",
    ...(init.body instanceof ReadableStream ? { duplex: "half" } : {}),
  } as RequestInit);
  const bytes = Buffer.from(await response.arrayBuffer());
  const status = response.status;
  const documented = entry.op.responses[String(status)] as Json | undefined;
  expect(
    documented,
    `${op} answered ${status}, which openapi.yaml does not document (body ${bytes.toString("utf8").slice(0, 300)})`,
  ).toBeDefined();
  exercised.push({ op, path, method, status });

  for (const [name, header] of Object.entries((documented!.headers ?? {}) as Record<string, Json>)) {
    const value = response.headers.get(name);
    if (header.required) expect(value, `${op} ${status}: required header ${name} missing`).not.toBeNull();
    if (value !== null && header.schema) {
      const typed = header.schema.type === "integer" && /^\d+$/.test(value) ? Number(value) : value;
      check(header.schema, typed, `${op} ${status} header ${name}`);
    }
  }

  let json: Json | null = null;
  const content = documented!.content as Record<string, Json> | undefined;
  if (method === "HEAD" || status === 204 || status === 304 || status === 307 || status === 302) {
    expect(bytes.length, `${op} ${status}: no body expected`).toBe(0);
  } else {
    expect(content, `${op} ${status}: a body came but none is documented`).toBeDefined();
    const type = (response.headers.get("content-type") ?? "").split(";")[0]!.trim();
    const media = content![type];
    expect(
      media,
      `${op} ${status}: content-type ${type} not documented (${Object.keys(content!).join(", ")})`,
    ).toBeDefined();
    if (type.endsWith("json")) {
      json = JSON.parse(bytes.toString("utf8")) as Json;
      check(media!.schema, json, `${op} ${status} body`);
      if (type === "application/problem+json") expect(json.status).toBe(status);
    }
  }
  return { status, headers: response.headers, json, bytes };
}

const sha256 = (bytes: Uint8Array | string) => createHash("sha256").update(bytes).digest();
const httpDigest = (bytes: Uint8Array | string) => `sha-256=:${sha256(bytes).toString("base64")}:`;

async function openTrans(server: PackageServer, spec: string, headers: Record<string, string> = {}): Promise<string> {
  const r = await call(server, "openTransaction", `/trans/${spec}`, { headers });
  expect(r.status).toBe(201);
  return r.json!.transaction as string;
}

async function addFile(
  server: PackageServer,
  id: string,
  path: string,
  content: string,
  headers: Record<string, string> = {},
) {
  return call(server, "addItem", `/add/${id}/file`, {
    headers: { "Pkg-Path": encodeURIComponent(path), ...headers },
    body: content,
  });
}

async function publish(server: PackageServer, spec: string, files: Record<string, string>): Promise<Json> {
  const id = await openTrans(server, spec);
  for (const [path, content] of Object.entries(files))
    expect((await addFile(server, id, path, content)).status).toBe(201);
  const r = await call(server, "commitTransaction", `/commit/${id}`);
  expect(r.status).toBe(201);
  return r.json!;
}

async function serve(store: PackageStore, options: PackageRouterOptions = {}): Promise<PackageServer> {
  const server = await servePackageRouter(createPackageRouter(store, { onError: () => {}, ...options }), {
    host: "127.0.0.1",
    port: 0,
  });
  servers.push(server);
  return server;
}

async function tempStore(): Promise<PackageStore> {
  const dir = await mkdtemp(join(tmpdir(), `h6-openapi-${randomUUID().slice(0, 8)}-`));
  dirs.push(dir);
  return createFsStore(dir, { unsafeNoSync: true });
}

beforeAll(async () => {
  ajv = new Ajv2020({ strict: true, allErrors: true });
  addFormats(ajv);
  // OpenAPI annotations that are not JSON Schema keywords.
  ajv.addKeyword({ keyword: "example" });
  doc = strict(await dereference(SPEC)) as Json;
  // Paths `runner-depot serve` answers beside the router (x-served-by) are checked on a
  // real serve process by test/cli/serve-ops.test.ts; here the router's paths only.
  for (const [template, item] of Object.entries(doc.paths as Record<string, Json>)) {
    if (item["x-served-by"] !== undefined) {
      delete (doc.paths as Json)[template];
      continue;
    }
    for (const method of ["get", "head", "post", "put", "delete", "patch"]) {
      const op = item[method] as Json | undefined;
      if (!op) continue;
      op.parameters = [...((item.parameters ?? []) as Json[]), ...((op.parameters ?? []) as Json[])];
      operations.set(op.operationId, { method, template, op });
    }
  }

  openStore = await tempStore();
  // Trusts one key for the attestation routes, and takes bundles of up to 64 KiB (413 past it).
  open = await serve(openStore, {
    trustedKeys: { keys: [trustedKeyEntry(attestationKey)] },
    maxAttestationBytes: 65_536,
  });
  auth = await serve(await tempStore(), {
    authorize: bearerTokens({
      "tok-writer": ["hello*", "bound*"],
      "tok-other": ["bound*"],
      "tok-reader": { read: ["*"] },
    }),
  });
  limited = await serve(await tempStore(), {
    limits: { itemBytes: 16, items: 1, requires: 1, openTransactions: 1, headerBytes: 4096, versions: 1 },
  });
  const closed = await tempStore();
  await closed.close?.();
  down = await serve(closed);
  s3 = await startS3();
  signing = await serve(
    composeStore({
      blobs: createS3BlobStore({ bucket: s3.bucket, prefix: "openapi/", clientConfig: s3.clientConfig }),
      records: await tempStore(),
    }),
  );
  const fine = await tempStore();
  broken = await serve({
    ...fine,
    getRecord: async () => {
      throw new Error("secret internals at /srv/depot/records");
    },
  });
});

afterAll(async () => {
  for (const server of servers) await server.close();
  await s3?.close();
  for (const dir of dirs) await rm(dir, { recursive: true, force: true });
});

describe("openapi.yaml", () => {
  it("is a valid OpenAPI 3.1 document", async () => {
    const result = await validate(SPEC);
    expect(result.valid, result.valid ? "" : compileErrors(result)).toBe(true);
    expect(result.specification).toBe("OpenAPI");
    expect(doc.openapi).toMatch(/^3\.1\./);
  });

  it("the validator rejects a broken copy (the check can fail)", async () => {
    const copy = structuredClone(await dereference(SPEC)) as Json;
    copy.paths["/catalog"].get.responses = { "2XY": { description: "not a status" } };
    const result = await validate(copy as Parameters<typeof validate>[0]);
    expect(result.valid).toBe(false);
  });

  it("the body check rejects an undocumented member, a missing one and a wrong type (the check can fail)", () => {
    const catalog = doc.components.schemas.Catalog as Json;
    check(catalog, { packages: {}, count: 0, position: 0, updatedAt: null }, "sane");
    for (const wrong of [
      { packages: {}, count: 0, updatedAt: null, extra: 1 },
      { packages: {}, count: 0 },
      { packages: {}, count: "0", updatedAt: null },
    ]) {
      expect(() => check(catalog, wrong, "wrong")).toThrow();
    }
  });

  it("the ErrorCode enum lists every code the depot's server side can throw", async () => {
    const files = [
      ...[
        "package/archive",
        "server/auth",
        "store/compose",
        "package/delta",
        "package/digest",
        "store/gc",
        "package/names",
        "package/paths",
        "store/records",
        "server/router",
        "transactions/lifecycle",
        "server/attestation-routes",
        "store/attestations",
        "signing/bundle",
        "signing/keys",
        "signing/statement",
      ].map((f) => `../../src/depot/${f}.ts`),
      ...["memory/store", "s3/blob-store", "postgres/records"].map((f) => `../../src/adapters/${f}.ts`),
      // Every file of the fs store (read from the folder, so a file added or removed there is
      // never missed); its log-* files are the runner's log store, which answers gRPC codes.
      ...(await readdir(fileURLToPath(new URL("../../src/adapters/fs/", import.meta.url))))
        .filter((f) => f.endsWith(".ts") && !f.startsWith("log-"))
        .map((f) => `../../src/adapters/fs/${f}`),
    ];
    const thrown = new Set<string>();
    for (const file of files) {
      const text = await readFile(fileURLToPath(new URL(file, import.meta.url)), "utf8");
      for (const match of text.matchAll(/RunnerDepotError\(\s*"([A-Z_]+)"/g)) thrown.add(match[1]!);
    }
    // The router answers a store's UNAVAILABLE as STORE_UNAVAILABLE; INVALID_ARGUMENT is a
    // listRecords argument check the router never trips.
    thrown.delete("UNAVAILABLE");
    thrown.delete("INVALID_ARGUMENT");
    expect(thrown.size).toBeGreaterThan(20);
    const documented = new Set(doc.components.schemas.ErrorCode.enum as string[]);
    expect([...thrown].filter((code) => !documented.has(code))).toEqual([]);
  });

  it("documents the nine paths of the interface, DELETE /trans/{id} and every header the contract names", () => {
    const paths = Object.keys(doc.paths as Json);
    for (const p of [
      "/catalog",
      "/version/{pkg_name}",
      "/depend/{pkg_name}",
      "/data/{pkg_name}",
      "/data/{name}/{from}",
      "/data/{name}/{from}/{to}",
      "/trans/{ref}",
      "/add/{trans_id}/{type}",
      "/summary/{trans_id}",
      "/meta/{trans_id}/require",
      "/commit/{trans_id}",
    ]) {
      expect(paths).toContain(p);
    }
    expect(doc.paths["/trans/{ref}"].delete).toBeDefined();
    const text = JSON.stringify(doc);
    for (const h of [
      "Pkg-Path",
      "Pkg-Mode",
      "Pkg-Target",
      "Pkg-License",
      "Pkg-Attr",
      "Pkg-Require",
      "Content-Digest",
      "Repr-Digest",
      "ETag",
      "If-None-Match",
      "Range",
      "Content-Range",
      "Cache-Control",
      "Location",
      "Retry-After",
      "WWW-Authenticate",
    ]) {
      expect(text, h).toContain(`"${h}"`);
    }
    expect(doc.components.securitySchemes.bearer).toMatchObject({ type: "http", scheme: "bearer" });
    for (const [, { op }] of operations) {
      for (const [status, response] of Object.entries(op.responses as Record<string, Json>)) {
        if (Number(status) >= 400)
          expect(Object.keys(response.content ?? {}), `${op.operationId} ${status}`).toEqual([
            "application/problem+json",
          ]);
      }
    }
  });
});

describe("the depot as built answers as documented", () => {
  let t1 = "";
  let archive: Buffer = Buffer.alloc(0);
  let etag = "";
  let deltaEtag = "";

  it("installer API on an empty depot", async () => {
    const catalog = await call(open, "getCatalog", "/catalog");
    expect(catalog.status).toBe(200);
    expect(catalog.json).toMatchObject({ packages: {}, count: 0 });
    expect((await call(open, "getVersions", "/version/hello")).status).toBe(404);
    expect((await call(open, "getVersions", "/version/-bad")).status).toBe(400);
    expect((await call(open, "getDepends", "/depend/hello")).status).toBe(404);
    expect((await call(open, "getData", "/data/hello")).status).toBe(404);
  });

  it("a transaction: open, every kind of addition, requires, summary, commit, repeated commit", async () => {
    const opened = await call(open, "openTransaction", "/trans/Hello%401.0.0+build.7");
    expect(opened.status).toBe(201);
    t1 = opened.json!.transaction;
    expect(opened.headers.get("location")).toBe(`/summary/${t1}`);

    const body = "#!/bin/sh\necho hello\n";
    const file = await addFile(open, t1, "bin/hello", body, { "Pkg-Mode": "0755", "Content-Digest": httpDigest(body) });
    expect(file.status).toBe(201);
    expect(file.json).toMatchObject({ type: "file", path: "bin/hello", mode: 0o755, size: body.length });
    // Streamed body (chunked, no Content-Length).
    const streamed = new ReadableStream<Uint8Array>({
      start(controller) {
        controller.enqueue(Buffer.from("part one, "));
        controller.enqueue(Buffer.from("part two\n"));
        controller.close();
      },
    });
    expect(
      (
        await call(open, "addItem", `/add/${t1}/file`, {
          headers: { "Pkg-Path": "share/doc/README%20now.txt" },
          body: streamed,
        })
      ).status,
    ).toBe(201);
    expect(
      (await call(open, "addItem", `/add/${t1}/dir`, { headers: { "Pkg-Path": "var/empty", "Pkg-Mode": "0700" } }))
        .json,
    ).toMatchObject({ type: "dir", digest: null });
    expect(
      (await call(open, "addItem", `/add/${t1}/link`, { headers: { "Pkg-Path": "bin/hi", "Pkg-Target": "hello" } }))
        .json,
    ).toMatchObject({ type: "link", target: "hello" });
    expect(
      (await call(open, "addItem", `/add/${t1}/license`, { headers: { "Pkg-License": "MIT" }, body: "MIT License\n" }))
        .json,
    ).toMatchObject({ type: "license", license: "MIT" });
    const set = await call(open, "addItem", `/add/${t1}/set`, {
      headers: { "Pkg-Attr": "description=Says%20hello, homepage=https%3A%2F%2Fexample.org" },
    });
    expect(set.json).toEqual({
      type: "set",
      attributes: { description: "Says hello", homepage: "https://example.org" },
    });
    // By reference: empty body, digest the store already holds.
    expect(
      (
        await call(open, "addItem", `/add/${t1}/file`, {
          headers: { "Pkg-Path": "bin/hello-copy", "Content-Digest": httpDigest(body) },
        })
      ).json,
    ).toMatchObject({ size: body.length });

    // Bad additions.
    const bad = async (
      type: string,
      headers: Record<string, string>,
      content: string | null,
      status: number,
      code: string,
    ) => {
      const r = await call(open, "addItem", `/add/${t1}/${type}`, { headers, body: content });
      expect([r.status, r.json?.code]).toEqual([status, code]);
    };
    await bad("file", { "Pkg-Path": "..%2Fescape" }, "x", 400, "PATH_INVALID");
    await bad("file", { "Pkg-Path": ".pkg/manifest.json" }, "x", 400, "PATH_INVALID");
    await bad("file", { "Pkg-Path": "bin/hello/below" }, "x", 400, "PATH_INVALID");
    await bad("file", { "Pkg-Path": "bin/other", "Pkg-Mode": "9999" }, "x", 400, "HEADER_INVALID");
    await bad("file", {}, "x", 400, "HEADER_INVALID");
    await bad("socket", { "Pkg-Path": "run/s" }, null, 400, "TYPE_INVALID");
    await bad(
      "file",
      { "Pkg-Path": "bin/x", "Content-Digest": httpDigest("something else") },
      "x",
      400,
      "DIGEST_MISMATCH",
    );
    await bad("link", { "Pkg-Path": "bin/out", "Pkg-Target": "..%2F..%2Fetc%2Fpasswd" }, null, 400, "PATH_INVALID");
    await bad("file", { "Pkg-Path": "bin/hello" }, "again", 409, "PATH_EXISTS");
    await bad(
      "file",
      { "Pkg-Path": "bin/ref", "Content-Digest": httpDigest("never stored") },
      null,
      409,
      "DIGEST_UNKNOWN",
    );
    const unknown = await call(open, "addItem", `/add/${randomUUID()}/file`, {
      headers: { "Pkg-Path": "a" },
      body: "x",
    });
    expect([unknown.status, unknown.json!.code]).toEqual([404, "TRANSACTION_NOT_FOUND"]);

    const requires = await call(open, "addRequires", `/meta/${t1}/require`, {
      headers: { "Pkg-Require": "libfoo@%5E1.2, libbar" },
    });
    expect(requires.status).toBe(201);
    expect(requires.json).toEqual({
      requires: [
        { name: "libbar", range: "*" },
        { name: "libfoo", range: "^1.2" },
      ],
    });
    expect(
      (await call(open, "addRequires", `/meta/${t1}/require`, { headers: { "Pkg-Require": "libfoo@>>>1" } })).json!
        .code,
    ).toBe("RANGE_INVALID");
    expect(
      (await call(open, "addRequires", `/meta/${t1}/require`, { headers: { "Pkg-Require": "hello@1" } })).status,
    ).toBe(422);
    expect(
      (await call(open, "addRequires", `/meta/${randomUUID()}/require`, { headers: { "Pkg-Require": "x" } })).status,
    ).toBe(404);

    const summary = await call(open, "getSummary", `/summary/${t1}`);
    expect(summary.json).toMatchObject({
      transaction: t1,
      name: "hello",
      version: "1.0.0",
      state: "open",
      problems: [],
    });
    expect((await call(open, "getSummary", `/summary/${randomUUID()}`)).status).toBe(404);
    expect((await call(open, "headSummary", `/summary/${t1}`)).status).toBe(200);
    expect((await call(open, "headSummary", `/summary/${randomUUID()}`)).status).toBe(404);

    const commit = await call(open, "commitTransaction", `/commit/${t1}`);
    expect(commit.status).toBe(201);
    expect(commit.json).toMatchObject({ name: "hello", version: "1.0.0", url: "/data/hello@1.0.0" });
    expect(commit.headers.get("location")).toBe("/data/hello@1.0.0");
    const again = await call(open, "commitTransaction", `/commit/${t1}`);
    expect([again.status, again.json]).toEqual([200, commit.json]);
    expect((await call(open, "commitTransaction", `/commit/${randomUUID()}`)).status).toBe(404);

    const committed = await call(open, "getSummary", `/summary/${t1}`);
    expect(committed.json).toMatchObject({ state: "committed", url: commit.json!.url, digest: commit.json!.digest });
    expect((await addFile(open, t1, "late", "x")).json!.code).toBe("TRANSACTION_COMMITTED");
    expect((await call(open, "addRequires", `/meta/${t1}/require`, { headers: { "Pkg-Require": "x" } })).status).toBe(
      410,
    );
    expect((await call(open, "abandonTransaction", `/trans/${t1}`)).status).toBe(410);
  });

  it("opening: 409 for an existing version, 400 without a version or with a bad name", async () => {
    expect((await call(open, "openTransaction", "/trans/hello@1.0.0")).json!.code).toBe("VERSION_EXISTS");
    expect((await call(open, "openTransaction", "/trans/hello")).json!.code).toBe("VERSION_INVALID");
    expect((await call(open, "openTransaction", "/trans/-bad@1.0.0")).json!.code).toBe("NAME_INVALID");
  });

  it("commit: 422 lists every problem (content lost before commit), 409 for the loser of two transactions, abandon 204 then 410", async () => {
    // Content lost between add and commit (here: deleted from the store behind the depot's back).
    const lossy = await openTrans(open, "lossy@1.0.0");
    const lost = [
      await addFile(open, lossy, "one", "first vanishing blob"),
      await addFile(open, lossy, "two", "second vanishing blob"),
    ];
    for (const added of lost) await openStore.deleteBlob(added.json!.digest);
    const invalid = await call(open, "commitTransaction", `/commit/${lossy}`);
    expect([invalid.status, invalid.json!.code]).toEqual([422, "COMMIT_INVALID"]);
    expect(invalid.json!.problems).toEqual([
      expect.objectContaining({ code: "CONTENT_MISSING", path: "one" }),
      expect.objectContaining({ code: "CONTENT_MISSING", path: "two" }),
    ]);
    expect((await call(open, "getSummary", `/summary/${lossy}`)).json!.problems).toHaveLength(2);
    expect((await call(open, "getCatalog", "/catalog")).json!.packages.lossy).toBeUndefined();

    const a = await openTrans(open, "race@1.0.0");
    const b = await openTrans(open, "race@1.0.0");
    await addFile(open, a, "a", "a");
    await addFile(open, b, "b", "b");
    expect((await call(open, "commitTransaction", `/commit/${a}`)).status).toBe(201);
    expect((await call(open, "commitTransaction", `/commit/${b}`)).json!.code).toBe("VERSION_EXISTS");

    expect((await call(open, "abandonTransaction", `/trans/${lossy}`)).status).toBe(204);
    expect((await call(open, "abandonTransaction", `/trans/${lossy}`)).json!.code).toBe("TRANSACTION_GONE");
    expect((await call(open, "getSummary", `/summary/${lossy}`)).status).toBe(410);
    expect((await call(open, "headSummary", `/summary/${lossy}`)).status).toBe(410);
    expect((await call(open, "commitTransaction", `/commit/${lossy}`)).status).toBe(410);
    expect((await addFile(open, lossy, "x", "x")).status).toBe(410);
    expect((await call(open, "abandonTransaction", `/trans/${randomUUID()}`)).status).toBe(404);
  });

  it("catalog, version and depend answers; ETag and 304", async () => {
    await publish(open, "hello@1.1.0", { "bin/hello": "#!/bin/sh\necho hello, again\n", "share/new": "new\n" });
    const catalog = await call(open, "getCatalog", "/catalog");
    expect(catalog.json!.packages.hello).toMatchObject({ latest: "1.1.0", versions: ["1.0.0", "1.1.0"] });
    expect(catalog.json!.count).toBe(2);
    const catalogTag = catalog.headers.get("etag")!;
    expect((await call(open, "getCatalog", "/catalog", { headers: { "If-None-Match": catalogTag } })).status).toBe(304);
    expect((await call(open, "headCatalog", "/catalog")).status).toBe(200);
    expect((await call(open, "headCatalog", "/catalog", { headers: { "If-None-Match": catalogTag } })).status).toBe(
      304,
    );
    // Pages and the change feed, as documented: Link to the next page, `since` answers changes only.
    const firstPage = await call(open, "getCatalog", "/catalog?limit=1");
    expect(Object.keys(firstPage.json!.packages)).toHaveLength(1);
    const next = /^<([^>]+)>; rel="next"$/.exec(firstPage.headers.get("link") ?? "");
    expect(next, "a next link on a full page").not.toBeNull();
    const secondPage = await call(open, "getCatalog", next![1]!);
    expect(secondPage.headers.get("link")).toBeNull();
    expect(Object.keys({ ...firstPage.json!.packages, ...secondPage.json!.packages }).sort()).toEqual(
      Object.keys(catalog.json!.packages).sort(),
    );
    const position = catalog.json!.position as number;
    const since = await call(open, "getCatalog", `/catalog?since=${position - 1}`);
    expect(since.json!.changes).toEqual([{ position, name: "hello", version: "1.1.0" }]);
    expect(Object.keys(since.json!.packages)).toEqual(["hello"]);
    expect(since.json!.position).toBe(position);
    for (const bad of [
      "?limit=0",
      "?limit=5001",
      "?after=nonsense",
      "?since=-1",
      "?since=1&after=c1",
      `?since=${position + 1}`,
    ]) {
      expect((await call(open, "getCatalog", `/catalog${bad}`)).json!.code, bad).toBe("BAD_REQUEST");
    }

    const versions = await call(open, "getVersions", "/version/HELLO");
    expect(versions.json).toMatchObject({ name: "hello", latest: "1.1.0" });
    expect(versions.json!.versions.map((v: Json) => v.version)).toEqual(["1.0.0", "1.1.0"]);
    expect(versions.json!.versions[0].attributes).toEqual({
      description: "Says hello",
      homepage: "https://example.org",
    });
    expect((await call(open, "getVersions", "/version/hello@9.9.9")).json!.code).toBe("VERSION_NOT_FOUND");

    expect((await call(open, "getDepends", "/depend/hello%401.0.0")).json).toEqual({
      name: "hello",
      version: "1.0.0",
      requires: [
        { name: "libbar", range: "*" },
        { name: "libfoo", range: "^1.2" },
      ],
    });
    expect((await call(open, "getDepends", "/depend/hello")).json!.version).toBe("1.1.0");
    expect((await call(open, "getDepends", "/depend/hello@9.9.9")).status).toBe(404);
    expect((await call(open, "getDepends", "/depend/hello@not-semver")).json!.code).toBe("VERSION_INVALID");

    // HEAD wherever GET works: GET's status and headers, no body.
    for (const [op, path, status] of [
      ["headVersions", "/version/HELLO", 200],
      ["headVersions", "/version/hello@9.9.9", 404],
      ["headVersions", "/version/-bad", 400],
      ["headDepends", "/depend/hello%401.0.0", 200],
      ["headDepends", "/depend/nothing", 404],
      ["headDepends", "/depend/hello@not-semver", 400],
    ] as const) {
      const head = await call(open, op, path);
      expect(head.status, `${op} ${path}`).toBe(status);
      if (status === 200) {
        const get = await fetch(open.url + path);
        expect(head.headers.get("content-length")).toBe(String((await get.arrayBuffer()).byteLength));
      }
    }
  });

  it("attestations: attach (201, again 200), list, HEAD; 400, 404, 413, 422", async () => {
    const record = (await openStore.getRecord<VersionRecord>(keys.version("hello", "1.1.0")))!.value;
    const statement = signedVersionStatement(await versionContent(openStore, record), new Date());
    const bundle = JSON.stringify(
      signBundle(Buffer.from(JSON.stringify(statement)), signingKeyFromPem(attestationKey.privateKey)),
    );
    const post = (ref: string, body: string) =>
      call(open, "addAttestation", `/attestations/${ref}`, { headers: { "content-type": "application/json" }, body });
    const added = await post("hello@1.1.0", bundle);
    expect(added.status).toBe(201);
    expect(added.json).toMatchObject({ name: "hello", version: "1.1.0", keyId: attestationKey.keyId });
    expect((await post("hello%401.1.0", bundle)).status).toBe(200);
    const listed = await call(open, "getAttestations", "/attestations/hello@1.1.0");
    expect(listed.json!.attestations).toHaveLength(1);
    expect(JSON.stringify(listed.json!.attestations[0].bundle)).toBe(bundle);
    expect((await call(open, "getAttestations", "/attestations/hello@1.0.0")).json!.attestations).toEqual([]);
    expect((await call(open, "headAttestations", "/attestations/hello@1.1.0")).status).toBe(200);
    for (const [op, ref, status] of [
      ["getAttestations", "hello@9.9.9", 404],
      ["headAttestations", "hello@9.9.9", 404],
      ["getAttestations", "hello", 400],
      ["headAttestations", "-bad@1.0.0", 400],
    ] as const)
      expect((await call(open, op, `/attestations/${ref}`)).status, `${op} ${ref}`).toBe(status);
    expect((await post("hello@1.1.0", "{}")).json!.code).toBe("ATTESTATION_INVALID");
    expect((await post("hello@9.9.9", bundle)).status).toBe(404);
    expect((await post("hello@1.1.0", " ".repeat(65_537))).json!.code).toBe("TOO_LARGE");
    // Signed over 1.1.0: on 1.0.0 its subjects are another version's.
    const other = await post("hello@1.0.0", bundle);
    expect(other.status).toBe(422);
    expect(other.json).toMatchObject({ code: "SUBJECT_MISMATCH", package: "hello", version: "1.0.0" });
  });

  it("data: 200 with digests, 206, 304, 416, HEAD; 404 and 400", async () => {
    const full = await call(open, "getData", "/data/hello@1.0.0");
    expect(full.status).toBe(200);
    archive = full.bytes;
    etag = full.headers.get("etag")!;
    expect(full.headers.get("repr-digest")).toBe(`sha-256=:${sha256(archive).toString("base64")}:`);
    expect(full.headers.get("content-digest")).toBe(full.headers.get("repr-digest"));
    expect(archive.subarray(0, 18).toString()).toBe(".pkg/manifest.json");

    const part = await call(open, "getData", "/data/hello@1.0.0", { headers: { Range: "bytes=100-199" } });
    expect([part.status, part.bytes.equals(archive.subarray(100, 200))]).toEqual([206, true]);
    expect(part.headers.get("content-range")).toBe(`bytes 100-199/${archive.length}`);
    expect(
      (
        await call(open, "getData", "/data/hello@1.0.0", { headers: { Range: "bytes=-10", "If-Range": etag } })
      ).bytes.equals(archive.subarray(-10)),
    ).toBe(true);
    expect(
      (await call(open, "getData", "/data/hello@1.0.0", { headers: { Range: "bytes=0-9", "If-Range": '"stale"' } }))
        .status,
    ).toBe(200);
    expect((await call(open, "getData", "/data/hello@1.0.0", { headers: { "If-None-Match": etag } })).status).toBe(304);
    const unsatisfiable = await call(open, "getData", "/data/hello@1.0.0", {
      headers: { Range: `bytes=${archive.length}-` },
    });
    expect([unsatisfiable.status, unsatisfiable.headers.get("content-range")]).toEqual([
      416,
      `bytes */${archive.length}`,
    ]);
    expect((await call(open, "getData", "/data/hello")).headers.get("etag")).not.toBe(etag); // newest is 1.1.0
    expect((await call(open, "getData", "/data/hello@2.0.0")).status).toBe(404);
    expect((await call(open, "getData", "/data/hello@x")).status).toBe(400);

    const head = await call(open, "headData", "/data/hello@1.0.0");
    expect([head.status, head.headers.get("content-length")]).toEqual([200, String(archive.length)]);
    expect((await call(open, "headData", "/data/hello@1.0.0", { headers: { Range: "bytes=0-0" } })).status).toBe(206);
    expect((await call(open, "headData", "/data/hello@1.0.0", { headers: { "If-None-Match": etag } })).status).toBe(
      304,
    );
    expect(
      (await call(open, "headData", "/data/hello@1.0.0", { headers: { Range: `bytes=${archive.length}-` } })).status,
    ).toBe(416);
    expect((await call(open, "headData", "/data/nope")).status).toBe(404);
    expect((await call(open, "headData", "/data/-x")).status).toBe(400);
  });

  it("deltas: 307 to the newest, the delta archive, its ranges; 404 and 400", async () => {
    const redirect = await call(open, "getDeltaToNewest", "/data/hello/1.0.0");
    expect([redirect.status, redirect.headers.get("location")]).toEqual([307, "/data/hello/1.0.0/1.1.0"]);
    expect((await call(open, "getDeltaToNewest", "/data/hello/1.1.0")).headers.get("location")).toBe(
      "/data/hello/1.1.0/1.1.0",
    );
    expect((await call(open, "getDeltaToNewest", "/data/hello/0.1.0")).status).toBe(404);
    expect((await call(open, "getDeltaToNewest", "/data/hello%401.0.0/1.0.0")).status).toBe(400);
    expect((await call(open, "headDeltaToNewest", "/data/hello/1.0.0")).status).toBe(307);
    expect((await call(open, "headDeltaToNewest", "/data/nope/1.0.0")).status).toBe(404);
    expect((await call(open, "headDeltaToNewest", "/data/hello/x")).status).toBe(400);

    const delta = await call(open, "getDelta", "/data/hello/1.0.0/1.1.0");
    expect(delta.status).toBe(200);
    deltaEtag = delta.headers.get("etag")!;
    const manifestText = delta.bytes.subarray(512, 512 + 4096).toString("utf8");
    expect(manifestText).toContain('"from":"1.0.0"');
    expect(manifestText).toContain('"removed"');
    expect((await call(open, "getDelta", "/data/hello/1.1.0/1.0.0")).status).toBe(200); // downwards
    expect(
      (await call(open, "getDelta", "/data/hello/1.0.0/1.1.0", { headers: { Range: "bytes=0-511" } })).status,
    ).toBe(206);
    expect(
      (await call(open, "getDelta", "/data/hello/1.0.0/1.1.0", { headers: { "If-None-Match": deltaEtag } })).status,
    ).toBe(304);
    expect(
      (await call(open, "getDelta", "/data/hello/1.0.0/1.1.0", { headers: { Range: "bytes=99999999-" } })).status,
    ).toBe(416);
    expect((await call(open, "getDelta", "/data/hello/1.0.0/3.0.0")).status).toBe(404);
    expect((await call(open, "getDelta", "/data/hello/1.0.0/x.y")).status).toBe(400);
    expect((await call(open, "headDelta", "/data/hello/1.0.0/1.1.0")).status).toBe(200);
    expect((await call(open, "headDelta", "/data/hello/1.0.0/1.1.0", { headers: { Range: "bytes=0-0" } })).status).toBe(
      206,
    );
    expect(
      (await call(open, "headDelta", "/data/hello/1.0.0/1.1.0", { headers: { "If-None-Match": deltaEtag } })).status,
    ).toBe(304);
    expect(
      (await call(open, "headDelta", "/data/hello/1.0.0/1.1.0", { headers: { Range: "bytes=99999999-" } })).status,
    ).toBe(416);
    expect((await call(open, "headDelta", "/data/hello/1.0.0/3.0.0")).status).toBe(404);
    expect((await call(open, "headDelta", "/data/hello/x/1.0.0")).status).toBe(400);
  });

  it("limits: 413 for an item or a transaction too large, 429 with Retry-After, 431", async () => {
    const id = await openTrans(limited, "big@1.0.0");
    const tooLarge = await addFile(limited, id, "big", "x".repeat(17));
    expect([tooLarge.status, tooLarge.json!.code]).toEqual([413, "TOO_LARGE"]);
    expect((await addFile(limited, id, "small", "x")).status).toBe(201);
    const tooMany = await addFile(limited, id, "second", "x");
    expect([tooMany.status, tooMany.json!.code]).toEqual([413, "TOO_MANY_ITEMS"]);
    const requires = await call(limited, "addRequires", `/meta/${id}/require`, { headers: { "Pkg-Require": "a, b" } });
    expect([requires.status, requires.json!.code]).toEqual([413, "TOO_MANY_ITEMS"]);
    expect(
      (await call(limited, "addRequires", `/meta/${id}/require`, { headers: { "Pkg-Require": "a" } })).status,
    ).toBe(201);

    const busy = await call(limited, "openTransaction", "/trans/other@1.0.0");
    expect([busy.status, busy.json!.code]).toEqual([429, "TOO_MANY_TRANSACTIONS"]);
    expect(Number(busy.headers.get("retry-after"))).toBeGreaterThan(0);

    const padding = { "X-Padding": "a".repeat(5000) };
    const heavy = [
      ["getCatalog", "/catalog"],
      ["getVersions", "/version/big"],
      ["getDepends", "/depend/big"],
      ["getData", "/data/big"],
      ["addItem", `/add/${id}/file`],
      ["getSummary", `/summary/${id}`],
      ["commitTransaction", `/commit/${id}`],
    ] as const;
    for (const [op, path] of heavy) {
      const headers = op === "getCatalog" ? { "If-None-Match": `"${"a".repeat(5000)}"` } : padding;
      const r = await call(limited, op, path, { headers });
      expect([r.status, r.json!.code], op).toEqual([431, "HEADERS_TOO_LARGE"]);
    }
    expect((await call(limited, "commitTransaction", `/commit/${id}`)).status).toBe(201);
    // big holds its one version (limits.versions: 1): no new one opens.
    const full = await call(limited, "openTransaction", "/trans/big@2.0.0");
    expect([full.status, full.json!.code]).toEqual([413, "TOO_MANY_VERSIONS"]);
  });

  it("auth: 401 with WWW-Authenticate, 403 for a foreign scope or someone else's transaction", async () => {
    const anonymous = await call(auth, "getCatalog", "/catalog");
    expect([anonymous.status, anonymous.json!.code]).toEqual([401, "UNAUTHENTICATED"]);
    expect(anonymous.headers.get("www-authenticate")).toMatch(/^Bearer realm=/);
    const wrong = await call(auth, "getCatalog", "/catalog", { headers: { Authorization: "Bearer nope" } });
    expect(wrong.headers.get("www-authenticate")).toContain('error="invalid_token"');
    expect(
      (await call(auth, "getCatalog", "/catalog", { headers: { Authorization: "Bearer tok-reader" } })).status,
    ).toBe(200);

    const reader = { Authorization: "Bearer tok-reader" };
    const writer = { Authorization: "Bearer tok-writer" };
    const other = { Authorization: "Bearer tok-other" };
    expect((await call(auth, "openTransaction", "/trans/hello@1.0.0")).status).toBe(401);
    expect((await call(auth, "openTransaction", "/trans/hello@1.0.0", { headers: reader })).json!.code).toBe(
      "PERMISSION_DENIED",
    );
    expect((await call(auth, "openTransaction", "/trans/secret@1.0.0", { headers: writer })).status).toBe(403);
    const id = await openTrans(auth, "bound@1.0.0", writer);
    const foreign = [
      ["addItem", `/add/${id}/dir`, { "Pkg-Path": "x" }],
      ["getSummary", `/summary/${id}`, {}],
      ["addRequires", `/meta/${id}/require`, { "Pkg-Require": "x" }],
      ["commitTransaction", `/commit/${id}`, {}],
      ["abandonTransaction", `/trans/${id}`, {}],
    ] as const;
    for (const [op, path, headers] of foreign) {
      expect((await call(auth, op, path, { headers: { ...other, ...headers } })).status, op).toBe(403);
      expect((await call(auth, op, path, { headers })).status, op).toBe(401);
    }
    expect(
      (await call(auth, "addItem", `/add/${id}/file`, { headers: { ...writer, "Pkg-Path": "f" }, body: "f" })).status,
    ).toBe(201);
    expect((await call(auth, "commitTransaction", `/commit/${id}`, { headers: writer })).status).toBe(201);
    const reads = [
      ["getVersions", "/version/bound", 200],
      ["getDepends", "/depend/bound", 200],
      ["getData", "/data/bound", 200],
      ["headData", "/data/bound", 200],
      ["getDeltaToNewest", "/data/bound/1.0.0", 307],
      ["headDeltaToNewest", "/data/bound/1.0.0", 307],
      ["getDelta", "/data/bound/1.0.0/1.0.0", 200],
      ["headDelta", "/data/bound/1.0.0/1.0.0", 200],
      ["headCatalog", "/catalog", 200],
      ["headVersions", "/version/bound", 200],
      ["headDepends", "/depend/bound", 200],
    ] as const;
    for (const [op, path, status] of reads) {
      expect((await call(auth, op, path)).status, op).toBe(401);
      expect((await call(auth, op, path, { headers: other })).status, op).toBe(status);
      expect((await call(auth, op, path.replace("bound", "hello"), { headers: other })).status, op).toBe(
        op === "headCatalog" ? 200 : 403,
      );
    }
    expect((await call(auth, "getVersions", "/version/hello", { headers: other })).status).toBe(403);
  });

  it("a store that is down answers 503 with Retry-After; an internal error answers 500 without internals", async () => {
    for (const [op, path, method] of [
      ["getCatalog", "/catalog", "GET"],
      ["headCatalog", "/catalog", "HEAD"],
      ["getVersions", "/version/a", "GET"],
      ["getDepends", "/depend/a", "GET"],
      ["getData", "/data/a", "GET"],
      ["openTransaction", "/trans/a@1.0.0", "POST"],
      ["commitTransaction", `/commit/${randomUUID()}`, "POST"],
    ] as const) {
      const r = await call(down, op, path, { method });
      expect(r.status, op).toBe(503);
      if (method !== "HEAD") expect(r.json!.code).toBe("STORE_UNAVAILABLE");
    }
    for (const [op, path] of [
      ["getCatalog", "/catalog"],
      ["addItem", `/add/${randomUUID()}/dir`],
      ["commitTransaction", `/commit/${randomUUID()}`],
    ] as const) {
      const r = await call(broken, op, path, { headers: op === "addItem" ? { "Pkg-Path": "x" } : {} });
      expect([r.status, r.json!.code]).toEqual([500, "INTERNAL"]);
      expect(JSON.stringify(r.json)).not.toContain("secret");
    }
  });

  it("a documented path asked with an undocumented method answers 405 with Allow listing exactly the documented methods", async () => {
    const id = await openTrans(open, "methods@1.0.0");
    const concrete: Record<string, string> = {
      "/catalog": "/catalog",
      "/version/{pkg_name}": "/version/hello",
      "/depend/{pkg_name}": "/depend/hello",
      "/data/{pkg_name}": "/data/hello",
      "/data/{name}/{from}": "/data/hello/1.0.0",
      "/data/{name}/{from}/{to}": "/data/hello/1.0.0/1.1.0",
      "/trans/{ref}": `/trans/${id}`,
      "/add/{trans_id}/{type}": `/add/${id}/file`,
      "/summary/{trans_id}": `/summary/${id}`,
      "/meta/{trans_id}/require": `/meta/${id}/require`,
      "/commit/{trans_id}": `/commit/${id}`,
      "/attestations/{pkg_ref}": "/attestations/hello@1.0.0",
      "/yank/{pkg_ref}": "/yank/hello@1.0.0",
      "/mirror/feed": "/mirror/feed",
      "/mirror/blobs": "/mirror/blobs",
    };
    expect(Object.keys(concrete).sort()).toEqual(Object.keys(doc.paths as Json).sort());
    const order = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"];
    const media = doc.components.responses.MethodNotAllowed.content["application/problem+json"] as Json;
    let checked = 0;
    for (const [template, path] of Object.entries(concrete)) {
      const documented = order.filter((m) => (doc.paths as Json)[template][m.toLowerCase()] !== undefined);
      for (const method of [...order, "OPTIONS"].filter((m) => !documented.includes(m))) {
        const response = await fetch(open.url + path, { method });
        const bytes = Buffer.from(await response.arrayBuffer());
        expect(response.status, `${method} ${path}`).toBe(405);
        expect(response.headers.get("allow"), `${method} ${path}`).toBe(documented.join(", "));
        check(doc.components.headers.Allow.schema as Json, response.headers.get("allow"), "Allow");
        if (method !== "HEAD") {
          const body = JSON.parse(bytes.toString("utf8")) as Json;
          check(media.schema as Json, body, `${method} ${path} body`);
          expect([body.code, body.status]).toEqual(["METHOD_NOT_ALLOWED", 405]);
        }
        checked++;
      }
    }
    expect(checked).toBeGreaterThan(40);
    // The transaction was untouched by all of that.
    expect((await call(open, "getSummary", `/summary/${id}`)).json!.state).toBe("open");
    expect((await call(open, "abandonTransaction", `/trans/${id}`)).status).toBe(204);
  });

  it("a store that signs URLs (S3) answers data with a 302 to the object store", async () => {
    await publish(signing, "signed@1.0.0", { "a.txt": "one\n" });
    await publish(signing, "signed@1.1.0", { "a.txt": "two\n" });
    const redirect = await call(signing, "getData", "/data/signed@1.0.0");
    expect(redirect.status).toBe(302);
    const object = await fetch(redirect.headers.get("location")!);
    const bytes = Buffer.from(await object.arrayBuffer());
    expect([object.status, `sha-256=:${sha256(bytes).toString("base64")}:`]).toEqual([
      200,
      redirect.headers.get("repr-digest"),
    ]);
    expect((await call(signing, "headData", "/data/signed")).status).toBe(302);
    // A delta is never stored, so never redirected: the depot streams it (issue 30 item 1).
    expect((await call(signing, "getDelta", "/data/signed/1.0.0/1.1.0")).status).toBe(200);
    expect((await call(signing, "headDelta", "/data/signed/1.0.0/1.1.0")).status).toBe(200);
  });

  it("mirror reads: a feed page with manifests, blobs by version and digest, and their refusals", async () => {
    await publish(open, "mirrored@1.0.0", { "m.txt": "mirror me\n" });
    const head = (await call(open, "getCatalog", "/catalog")).json!.position as number;
    const feed = await call(open, "mirrorFeed", `/mirror/feed?since=${head - 1}`);
    expect(feed.status).toBe(200);
    const described = feed.json!.versions["mirrored@1.0.0"] as { manifest: string };
    const digest = (JSON.parse(described.manifest) as { items: Array<{ digest: string }> }).items[0]!.digest;
    expect((await call(open, "mirrorFeed", "/mirror/feed?limit=101")).status).toBe(400);
    const post = (body: unknown) =>
      call(open, "mirrorBlobs", "/mirror/blobs", {
        headers: { "Content-Type": "application/json" },
        body: typeof body === "string" ? body : JSON.stringify(body),
      });
    const blobs = await post({ blobs: [["mirrored@1.0.0", digest]] });
    expect([blobs.status, blobs.bytes.toString()]).toEqual([200, "mirror me\n"]);
    expect((await post({ blobs: [] })).status).toBe(400);
    expect((await post({ blobs: [["mirrored@9.0.0", digest]] })).status).toBe(404);
    expect((await post({ blobs: [["mirrored@1.0.0", `sha256:${"0".repeat(64)}`]] })).status).toBe(409);
    expect((await post("x".repeat(300 * 1024))).status).toBe(413);
  });

  it("yank: 200 with the reason, Pkg-Yanked on exact requests, the feed entry; un-yank; 404 and 400", async () => {
    await publish(open, "yanky@1.0.0", { "a.txt": "one\n" });
    await publish(open, "yanky@1.1.0", { "a.txt": "two\n" });
    const since = (await call(open, "getCatalog", "/catalog")).json!.position as number;
    const reason = encodeURIComponent("broken build");
    const yanked = await call(open, "yankVersion", "/yank/yanky@1.1.0", { headers: { "Pkg-Reason": reason } });
    expect([yanked.status, yanked.json!.yanked]).toEqual([200, "broken build"]);
    const feed = await call(open, "getCatalog", `/catalog?since=${since}`);
    expect(feed.json!.changes).toEqual([
      { position: since + 1, name: "yanky", version: "1.1.0", yanked: "broken build" },
    ]);
    expect(feed.json!.packages.yanky).toMatchObject({ latest: "1.0.0", yanked: { "1.1.0": "broken build" } });
    const versions = await call(open, "getVersions", "/version/yanky");
    expect(versions.json!.versions[1].yanked.reason).toBe("broken build");
    const data = await call(open, "getData", "/data/yanky@1.1.0");
    expect([data.status, data.headers.get("pkg-yanked")]).toEqual([200, reason]);
    const depend = await call(open, "getDepends", "/depend/yanky@1.1.0");
    expect(depend.headers.get("pkg-yanked")).toBe(reason);
    expect((await call(open, "yankVersion", "/yank/yanky@9.0.0", { headers: { "Pkg-Reason": reason } })).status).toBe(
      404,
    );
    expect((await call(open, "yankVersion", "/yank/yanky@1.0.0")).json!.code).toBe("HEADER_INVALID");
    expect((await call(open, "unyankVersion", "/yank/yanky")).json!.code).toBe("VERSION_INVALID");
    expect((await call(open, "unyankVersion", "/yank/nothere@1.0.0")).status).toBe(404);
    const back = await call(open, "unyankVersion", "/yank/yanky@1.1.0");
    expect([back.status, back.json!.yanked]).toEqual([200, null]);
    expect((await call(auth, "yankVersion", "/yank/yanky@1.1.0", { headers: { "Pkg-Reason": reason } })).status).toBe(
      401,
    );
  });

  it("every documented (operation, status) was exercised or is listed as not exercised", () => {
    const seen = new Set(exercised.map((e) => `${e.op} ${e.status}`));
    const missing: string[] = [];
    for (const [id, { op }] of operations) {
      for (const status of Object.keys(op.responses as Json)) {
        const key = `${id} ${status}`;
        if (seen.has(key) || key in NOT_EXERCISED) continue;
        // 401/403/431/500/503 are shared by every operation and sampled on several.
        if (SAMPLED.has(status) && exercised.some((e) => String(e.status) === status)) continue;
        missing.push(key);
      }
    }
    expect(missing, "documented but never provoked").toEqual([]);
    for (const key of Object.keys(NOT_EXERCISED)) {
      const [id, status] = key.split(" ");
      if (operations.has(id!) && (operations.get(id!)!.op.responses as Json)[status!])
        expect(seen.has(key), `${key} is listed as not exercised but was`).toBe(false);
    }
  });
});
