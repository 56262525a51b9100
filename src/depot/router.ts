/**
 * The depot's REST router (depot-api.md): an itty-router v5 router whose `fetch(Request)`
 * answers the installer and packager APIs on top of any PackageStore.
 */
import { createHash } from "node:crypto";
import { Router, type IRequest, type RouterType } from "itty-router";
import { RunnerDepotError } from "../errors.js";
import { writeArchive, type PackageManifest, type Requirement } from "./archive.js";
import type { Authorize, DepotAction } from "./auth.js";
import { deltaManifest } from "./delta.js";
import { isStoreDigest, parseHttpDigest, toHttpDigest } from "./digest.js";
import { collectGarbage, readJsonBlob, reconcileCatalog, type GarbageReport } from "./gc.js";
import { decodeSegment, isLicenseName, parsePackageName, parsePackageRef, parseRange, parseVersion } from "./names.js";
import { parseItemPath } from "./paths.js";
import type { PackageStore } from "./ports.js";
import { catalogVersions, emptyRecord, keys, setOwn, type CatalogRecord, type DeltaRecord, type TransactionRecord, type VersionRecord } from "./records.js";
import { DEFAULT_LIMITS, Transactions, type DepotLimits, type UploadBody } from "./transactions.js";

/** Options of {@link createPackageRouter}. */
export interface PackageRouterOptions {
  /** Path prefix the router is mounted under, e.g. `/depot`. */
  base?: string;
  /** Auth hook; without it everything is open (see servePackageRouter). */
  authorize?: Authorize;
  /** Limits; each defaults to depot-api.md's figure. */
  limits?: Partial<DepotLimits>;
  /** Idle expiry of a transaction, ms (default 24 h). */
  transactionIdleMs?: number;
  /** Absolute expiry of a transaction, ms (default 7 days). */
  transactionMaxAgeMs?: number;
  /** How long a finished transaction still answers (410/summary) before it is forgotten, ms (default 7 days). */
  transactionRetainMs?: number;
  /** A blob is deleted only after staying unreferenced this long across GC runs, ms (default 1 h). */
  gcGraceMs?: number;
  /** Lifetime of signed blob URLs, seconds (default 300). */
  signedUrlSeconds?: number;
  /** The clock (tests). */
  now?: () => Date;
  /** Called with every unexpected (500) error; default logs to console.error. */
  onError?: (error: unknown, request: Request) => void;
}

/** The depot router: an itty-router plus garbage collection. */
export type PackageRouter = RouterType<IRequest, []> & {
  /** Answers one request. */
  fetch(request: Request): Promise<Response>;
  /** Runs recovery, transaction expiry and blob collection once. */
  collectGarbage(): Promise<GarbageReport>;
  /** True when the router has no authorize hook (anyone may publish). */
  readonly isOpen: boolean;
  /** The store the router serves. */
  readonly store: PackageStore;
};

const IMMUTABLE = "public, max-age=31536000, immutable";
const ALLOW_ORDER = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"];
const TRANSIENT_CODES = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "ETIMEDOUT",
  "EAI_AGAIN",
  "ENOTFOUND",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "EPIPE",
  "ENOSPC",
  "EMFILE",
  "57P01",
  "57P03",
  "53300",
]);

/**
 * Creates the depot router over a PackageStore.
 *
 * @example
 * const depot = createPackageRouter(createFsStore("/var/lib/depot"), { authorize: bearerTokens({ [token]: ["*"] }) });
 * const response = await depot.fetch(new Request("http://depot.local/catalog"));
 */
export function createPackageRouter(store: PackageStore, options: PackageRouterOptions = {}): PackageRouter {
  const base = (options.base ?? "").replace(/\/+$/, "");
  const limits: DepotLimits = { ...DEFAULT_LIMITS, ...options.limits };
  const now = options.now ?? (() => new Date());
  const onError = options.onError ?? ((error: unknown) => console.error("runner-depot: internal error", error));
  const transactions = new Transactions(store, {
    limits,
    idleMs: options.transactionIdleMs ?? 24 * 3600_000,
    maxAgeMs: options.transactionMaxAgeMs ?? 7 * 24 * 3600_000,
    now,
  });
  const deltaBuilds = new Map<string, Promise<DeltaRecord>>();
  let recovered: Promise<unknown> | undefined;
  let catalogCache: { revision: string | null; body: string; etag: string } | undefined;

  async function principalOf(request: Request, action: DepotAction, name?: string): Promise<string> {
    if (!options.authorize) return "anonymous";
    const verdict = await options.authorize(request, { action, name });
    if (verdict === false) throw new RunnerDepotError("PERMISSION_DENIED", `Not allowed to ${action}${name ? ` ${name}` : ""}`);
    return typeof verdict === "string" ? verdict : "anonymous";
  }

  async function catalog(): Promise<CatalogRecord | undefined> {
    return (await store.getRecord<CatalogRecord>(keys.catalog))?.value;
  }

  /** A published version's record: listed in the catalog (the visibility point) and stored. */
  async function publishedVersion(name: string, version: string | undefined): Promise<VersionRecord> {
    const listed = catalogVersions(await catalog(), name);
    if (!listed) throw new RunnerDepotError("PACKAGE_NOT_FOUND", `No package ${name}`);
    const wanted = version ?? listed.latest;
    if (!listed.versions.includes(wanted)) throw new RunnerDepotError("VERSION_NOT_FOUND", `No version ${wanted} of ${name}`);
    const record = await store.getRecord<VersionRecord>(keys.version(name, wanted));
    if (!record) throw new RunnerDepotError("VERSION_NOT_FOUND", `No version ${wanted} of ${name}`);
    return record.value;
  }

  const router = Router<IRequest, []>({
    base,
    before: [
      (request: IRequest) => {
        let bytes = 0;
        request.headers.forEach((value: string, name: string) => {
          bytes += name.length + value.length + 4;
        });
        if (bytes > limits.headerBytes) {
          throw new RunnerDepotError("HEADERS_TOO_LARGE", `Request headers are ${bytes} bytes; at most ${limits.headerBytes} are accepted`);
        }
      },
      async () => {
        // Finish commits a killed process left between its version record and the catalog.
        recovered ??= reconcileCatalog(store, now).catch((error: unknown) => {
          recovered = undefined;
          throw error;
        });
        await recovered;
      },
    ],
    catch: (error: unknown, request: IRequest) => problemResponse(error, request, onError),
    finally: [
      // Requests outside `base` match no route at all.
      (response: unknown, request: IRequest) => response ?? problemResponse(new RunnerDepotError("NOT_FOUND", "No such resource"), request, onError),
      // HEAD answers what GET would, without the body (JSON and problem bodies are small).
      async (response: Response, request: IRequest) => {
        if (request.method !== "HEAD" || response.body === null) return response;
        const length = (await response.arrayBuffer()).byteLength;
        const headers = new Headers(response.headers);
        headers.set("Content-Length", String(length));
        return new Response(null, { status: response.status, statusText: response.statusText, headers });
      },
    ],
  });

  /** Registers a GET handler and the same handler for HEAD (RFC 9110: HEAD wherever GET works). */
  const getAndHead = (path: string, handler: (request: IRequest) => Promise<Response>) => {
    router.get(path, handler);
    router.head(path, handler);
  };

  // ---- Installer API -------------------------------------------------------------------

  const catalogHandler = async (request: IRequest) => {
    await principalOf(request, "read");
    const stored = await store.getRecord<CatalogRecord>(keys.catalog);
    const revision = stored?.revision ?? null;
    // The body and its ETag are rebuilt only when the record changed, so a 304 is cheap.
    if (!catalogCache || catalogCache.revision !== revision) {
      const record = stored?.value;
      // Null-prototype: a package may be called `constructor`.
      const packages = emptyRecord<{ latest: string; versions: string[]; updatedAt: string }>();
      for (const name of Object.keys(record?.packages ?? {}).sort()) {
        const listed = catalogVersions(record, name);
        if (listed) setOwn(packages, name, { latest: listed.latest, versions: listed.versions, updatedAt: listed.updatedAt });
      }
      const text = JSON.stringify({ packages, count: Object.keys(packages).length, updatedAt: record?.updatedAt ?? null });
      catalogCache = { revision, body: text, etag: `"${createHash("sha256").update(text).digest("hex").slice(0, 32)}"` };
    }
    const { body, etag } = catalogCache;
    const headers = { ETag: etag, "Cache-Control": "no-cache" };
    if (matchesEtag(request.headers.get("if-none-match"), etag)) return new Response(null, { status: 304, headers });
    return new Response(body, { status: 200, headers: { ...headers, "Content-Type": "application/json" } });
  };
  getAndHead("/catalog", catalogHandler);

  getAndHead("/version/:pkg", async (request) => {
    const ref = parsePackageRef(request.params.pkg!);
    await principalOf(request, "read", ref.name);
    const listed = catalogVersions(await catalog(), ref.name);
    if (!listed) throw new RunnerDepotError("PACKAGE_NOT_FOUND", `No package ${ref.name}`);
    const wanted = ref.version ? [ref.version] : listed.versions;
    if (ref.version && !listed.versions.includes(ref.version)) throw new RunnerDepotError("VERSION_NOT_FOUND", `No version ${ref.version} of ${ref.name}`);
    const records = await Promise.all(wanted.map((v) => store.getRecord<VersionRecord>(keys.version(ref.name, v))));
    const versions = records
      .filter((r) => r !== null)
      .map(({ value: v }) => ({ version: v.version, publishedAt: v.publishedAt, digest: v.digest, size: v.size, itemCount: v.itemCount, attributes: v.attributes }));
    return json(200, { name: ref.name, latest: listed.latest, versions });
  });

  getAndHead("/depend/:pkg", async (request) => {
    const ref = parsePackageRef(request.params.pkg!);
    await principalOf(request, "read", ref.name);
    const v = await publishedVersion(ref.name, ref.version);
    return json(200, { name: v.name, version: v.version, requires: v.requires });
  });

  const dataHandler = async (request: IRequest) => {
    const ref = parsePackageRef(request.params.pkg!);
    await principalOf(request, "read", ref.name);
    const v = await publishedVersion(ref.name, ref.version);
    return serveBlob(request, store, v.digest, v.size, `${v.name}-${v.version}.tar`, options.signedUrlSeconds ?? 300);
  };
  getAndHead("/data/:pkg", dataHandler);

  const deltaRedirect = async (request: IRequest) => {
    const name = parsePlainName(request.params.pkg!);
    await principalOf(request, "read", name);
    const from = parseVersion(decodeSegment(request.params.from!));
    const listed = catalogVersions(await catalog(), name);
    if (!listed) throw new RunnerDepotError("PACKAGE_NOT_FOUND", `No package ${name}`);
    if (!listed.versions.includes(from)) throw new RunnerDepotError("VERSION_NOT_FOUND", `No version ${from} of ${name}`);
    return new Response(null, { status: 307, headers: { Location: `${base}/data/${name}/${from}/${listed.latest}`, "Cache-Control": "no-cache" } });
  };
  getAndHead("/data/:pkg/:from", deltaRedirect);

  const deltaHandler = async (request: IRequest) => {
    const name = parsePlainName(request.params.pkg!);
    await principalOf(request, "read", name);
    const fromVersion = parseVersion(decodeSegment(request.params.from!));
    const toVersion = parseVersion(decodeSegment(request.params.to!));
    const [from, to] = await Promise.all([publishedVersion(name, fromVersion), publishedVersion(name, toVersion)]);
    const key = keys.delta(name, from.version, to.version);
    let delta = (await store.getRecord<DeltaRecord>(key))?.value;
    if (!delta) {
      let building = deltaBuilds.get(key);
      if (!building) {
        building = buildDelta(from, to, key).finally(() => deltaBuilds.delete(key));
        deltaBuilds.set(key, building);
      }
      delta = await building;
    }
    return serveBlob(request, store, delta.digest, delta.size, `${name}-${from.version}-to-${to.version}.tar`, options.signedUrlSeconds ?? 300);
  };
  getAndHead("/data/:pkg/:from/:to", deltaHandler);

  async function buildDelta(from: VersionRecord, to: VersionRecord, key: string): Promise<DeltaRecord> {
    const [fromManifest, toManifest] = await Promise.all([
      readJsonBlob<PackageManifest>(store, from.manifest),
      readJsonBlob<PackageManifest>(store, to.manifest),
    ]);
    if (!fromManifest || !toManifest) throw new RunnerDepotError("INTERNAL", `Manifest blob missing for ${from.name}`);
    const blob = await writeArchive(store, deltaManifest(fromManifest, toManifest), to.mtime);
    const record: DeltaRecord = { digest: blob.digest, size: blob.size, builtAt: now().toISOString() };
    // Deterministic bytes, so a concurrent builder elsewhere wrote the same blob: keep theirs.
    if ((await store.putRecord(key, record, { ifRevision: null })) === null) {
      return (await store.getRecord<DeltaRecord>(key))?.value ?? record;
    }
    return record;
  }

  // ---- Packager API --------------------------------------------------------------------

  router.post("/trans/:pkg", async (request) => {
    const ref = parsePackageRef(request.params.pkg!);
    if (ref.version === undefined) throw new RunnerDepotError("VERSION_INVALID", "POST /trans/<name>@<version> needs the version");
    const principal = await principalOf(request, "publish", ref.name);
    const trans = await transactions.open(ref.name, ref.version, principal);
    return json(201, { transaction: trans.id, expiresAt: transactions.expiresAt(trans).toISOString() }, { Location: `${base}/summary/${trans.id}` });
  });

  /** Loads a transaction on behalf of the request's principal. */
  async function transactionFor(request: IRequest, allowCommitted = false): Promise<TransactionRecord> {
    const id = decodeSegment(request.params.id!);
    // Auth first when we can: a request without credentials learns nothing about the id.
    if (options.authorize) await principalOf(request, "publish");
    const peek = await transactions.load(id, undefined, true).catch((error: unknown) => {
      if (error instanceof RunnerDepotError && error.status === 410) return null;
      throw error;
    });
    const principal = await principalOf(request, "publish", peek?.name);
    return transactions.load(id, principal, allowCommitted);
  }

  router.delete("/trans/:id", async (request) => {
    const trans = await transactionFor(request);
    await transactions.abandon(trans);
    return new Response(null, { status: 204 });
  });

  router.post("/add/:id/:type", async (request) => {
    const type = request.params.type!;
    if (!["file", "dir", "link", "license", "set"].includes(type)) {
      throw new RunnerDepotError("TYPE_INVALID", `Unknown item type ${JSON.stringify(type.slice(0, 40))}: file, dir, link, license or set`);
    }
    const trans = await transactionFor(request);
    const headers = request.headers;
    let result: Record<string, unknown>;
    switch (type) {
      case "file": {
        const path = parseItemPath(single(headers, "pkg-path", true));
        const mode = parseMode(headers.get("pkg-mode"), 0o644);
        result = await transactions.addFile(trans, path, mode, await uploadBody(request), parseHttpDigest(headers.get("content-digest")));
        break;
      }
      case "dir": {
        requireEmpty(request);
        const path = parseItemPath(single(headers, "pkg-path", true));
        result = await transactions.addDir(trans, path, parseMode(headers.get("pkg-mode"), 0o755));
        break;
      }
      case "link": {
        requireEmpty(request);
        const path = parseItemPath(single(headers, "pkg-path", true));
        result = await transactions.addLink(trans, path, single(headers, "pkg-target", true));
        break;
      }
      case "license": {
        const license = single(headers, "pkg-license", false);
        if (!isLicenseName(license)) {
          throw new RunnerDepotError("HEADER_INVALID", `Pkg-License ${JSON.stringify(license.slice(0, 80))} is not a licence name (letters, digits, '.', '+', '-')`);
        }
        result = await transactions.addLicense(trans, license, await uploadBody(request), parseHttpDigest(headers.get("content-digest")));
        break;
      }
      default: {
        requireEmpty(request);
        const attributes = emptyRecord<string>();
        const values = list(headers, "pkg-attr");
        if (values.length === 0) throw new RunnerDepotError("HEADER_INVALID", "POST /add/<id>/set needs Pkg-Attr: key=value");
        for (const value of values) {
          const eq = value.indexOf("=");
          const key = eq === -1 ? value : value.slice(0, eq);
          if (eq === -1 || !/^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/.test(key)) {
            throw new RunnerDepotError("HEADER_INVALID", `Pkg-Attr ${JSON.stringify(value.slice(0, 80))} is not key=value (key: letters, digits, '.', '_', '-')`);
          }
          const decoded = decodeHeader(value.slice(eq + 1), "Pkg-Attr");
          if (Buffer.byteLength(decoded) > 4096) throw new RunnerDepotError("HEADER_INVALID", `Pkg-Attr ${key} is longer than 4096 bytes`);
          setOwn(attributes, key, decoded);
        }
        result = await transactions.setAttributes(trans, attributes);
      }
    }
    return json(201, result);
  });

  getAndHead("/summary/:id", async (request) => {
    const trans = await transactionFor(request, true);
    const origin = new URL(request.url).origin;
    if (trans.state === "committed") {
      const version = (await store.getRecord<VersionRecord>(keys.version(trans.name, trans.version)))?.value;
      const manifest = version ? await readJsonBlob<PackageManifest>(store, version.manifest) : null;
      return json(200, {
        ...summaryHead(trans),
        url: `${origin}${base}${trans.result!.location}`,
        digest: trans.result!.digest,
        items: manifest?.items ?? [],
        licenses: manifest?.licenses ?? [],
        totals: { items: trans.itemCount, bytes: trans.bytes },
        problems: [],
      });
    }
    await transactions.touch(trans.id);
    const fresh = await transactions.load(trans.id, trans.principal);
    const items = await transactions.items(fresh);
    const problems = await transactions.validate(fresh, items);
    return json(200, {
      ...summaryHead(fresh),
      items,
      licenses: Object.entries(fresh.licenses).map(([name, l]) => ({ name, size: l.size, digest: l.digest })),
      totals: { items: fresh.itemCount, bytes: fresh.bytes },
      problems,
    });
  });

  function summaryHead(trans: TransactionRecord) {
    return {
      transaction: trans.id,
      name: trans.name,
      version: trans.version,
      state: trans.state,
      createdAt: trans.createdAt,
      expiresAt: transactions.expiresAt(trans).toISOString(),
      requires: trans.requires,
      attributes: trans.attributes,
    };
  }

  router.post("/meta/:id/require", async (request) => {
    const trans = await transactionFor(request);
    const values = list(request.headers, "pkg-require");
    if (values.length === 0) throw new RunnerDepotError("HEADER_INVALID", "POST /meta/<id>/require needs Pkg-Require: name@range");
    const requires: Requirement[] = values.map((value) => {
      const decoded = decodeHeader(value, "Pkg-Require");
      const at = decoded.indexOf("@");
      const name = parsePackageName(at === -1 ? decoded.trim() : decoded.slice(0, at).trim());
      return { name, range: parseRange(at === -1 ? "" : decoded.slice(at + 1)) };
    });
    return json(201, { requires: await transactions.require(trans, requires) });
  });

  router.post("/commit/:id", async (request) => {
    const trans = await transactionFor(request, true);
    const { result, first } = await transactions.commit(trans);
    const url = `${new URL(request.url).origin}${base}${result.location}`;
    return json(first ? 201 : 200, { url, name: result.name, version: result.version, digest: result.digest }, { Location: `${base}${result.location}` });
  });

  // A known path with a method it does not answer: 405 with Allow; anything else 404.
  const routes = [...router.routes];
  router.all("*", (request) => {
    const pathname = new URL(request.url).pathname;
    const allowed = new Set(routes.filter(([, pattern]) => pattern.test(pathname)).map(([method]) => method));
    if (allowed.size === 0) throw new RunnerDepotError("NOT_FOUND", "No such resource");
    const allow = ALLOW_ORDER.filter((m) => allowed.has(m)).join(", ");
    throw new RunnerDepotError("METHOD_NOT_ALLOWED", `${request.method.slice(0, 20)} is not allowed here; allowed: ${allow}`, { details: { allow } });
  });

  const depot = router as unknown as PackageRouter;
  Object.defineProperties(depot, {
    collectGarbage: {
      value: () =>
        collectGarbage(store, transactions, {
          now,
          graceMs: options.gcGraceMs ?? 3600_000,
          retainMs: options.transactionRetainMs ?? 7 * 24 * 3600_000,
        }),
    },
    isOpen: { value: options.authorize === undefined },
    store: { value: store },
  });
  return depot;
}

// ---- HTTP helpers ------------------------------------------------------------------------

function json(status: number, body: unknown, headers: Record<string, string> = {}): Response {
  return new Response(JSON.stringify(body), { status, headers: { "Content-Type": "application/json", "Cache-Control": "no-store", ...headers } });
}

/** Maps anything thrown to a problem+json response; a 500 never carries internals. */
function problemResponse(reason: unknown, request: Request, onError: (error: unknown, request: Request) => void): Response {
  let error: RunnerDepotError;
  if (reason instanceof RunnerDepotError) {
    error = reason.code === "UNAVAILABLE" ? new RunnerDepotError("STORE_UNAVAILABLE", "The package store is unavailable; retry later", { cause: reason }) : reason;
  } else if (isTransient(reason)) {
    error = new RunnerDepotError("STORE_UNAVAILABLE", "The package store is unavailable; retry later", { cause: reason });
  } else {
    error = new RunnerDepotError("INTERNAL", "internal error", { cause: reason });
  }
  // Every 5xx keeps its status and code (503, 504, 502…); only INTERNAL hides its detail (toProblem).
  if (error.status >= 500 && error.code !== "STORE_UNAVAILABLE") onError(reason, request);
  const { wwwAuthenticate, allow, ...problem } = error.toProblem() as Record<string, unknown>;
  const headers: Record<string, string> = { "Content-Type": "application/problem+json", "Cache-Control": "no-store" };
  if (error.status === 405 && typeof allow === "string") headers.Allow = allow;
  if (error.status === 401) headers["WWW-Authenticate"] = typeof wwwAuthenticate === "string" ? wwwAuthenticate : 'Bearer realm="runner-depot"';
  if (typeof problem.retryAfter === "number") headers["Retry-After"] = String(problem.retryAfter);
  if (error.code === "STORE_UNAVAILABLE") headers["Retry-After"] = "5";
  return new Response(JSON.stringify(problem), { status: error.status, headers });
}

function isTransient(reason: unknown): boolean {
  const error = reason as { code?: unknown; name?: unknown; $metadata?: { httpStatusCode?: number } } | null;
  if (!error || typeof error !== "object") return false;
  if (typeof error.code === "string" && TRANSIENT_CODES.has(error.code)) return true;
  if (error.name === "TimeoutError" || error.name === "ServiceUnavailable" || error.name === "SlowDown") return true;
  return error.$metadata?.httpStatusCode === 503;
}

function parsePlainName(segment: string): string {
  const decoded = decodeSegment(segment);
  if (decoded.includes("@")) throw new RunnerDepotError("BAD_REQUEST", "Delta paths take a plain package name: /data/<name>/<from>[/<to>]");
  return parsePackageName(decoded);
}

/** The comma-separated values of a header (HTTP folds repeated headers with commas). */
function list(headers: Headers, name: string): string[] {
  const raw = headers.get(name);
  if (raw === null) return [];
  return raw
    .split(",")
    .map((v) => v.trim())
    .filter((v) => v.length > 0);
}

function decodeHeader(value: string, header: string): string {
  try {
    return decodeURIComponent(value);
  } catch {
    throw new RunnerDepotError("HEADER_INVALID", `${header} is not valid percent-encoded UTF-8`);
  }
}

function single(headers: Headers, name: string, encoded: boolean): string {
  const values = list(headers, name);
  const pretty = name.replace(/(^|-)([a-z])/g, (m) => m.toUpperCase());
  if (values.length === 0) throw new RunnerDepotError("HEADER_INVALID", `${pretty} is required`);
  if (values.length > 1) throw new RunnerDepotError("HEADER_INVALID", `${pretty} takes one value (percent-encode commas)`);
  return encoded ? decodeHeader(values[0]!, pretty) : values[0]!;
}

function parseMode(raw: string | null, fallback: number): number {
  if (raw === null) return fallback;
  const text = raw.trim();
  if (!/^0?[0-7]{1,3}$/.test(text) || Number.parseInt(text, 8) === 0) {
    throw new RunnerDepotError("HEADER_INVALID", `Pkg-Mode ${JSON.stringify(text.slice(0, 20))} must be octal permission bits between 0001 and 0777`);
  }
  return Number.parseInt(text, 8);
}

function contentLength(request: Request): number | undefined {
  const raw = request.headers.get("content-length");
  if (raw === null) return undefined;
  if (!/^\d+$/.test(raw.trim())) throw new RunnerDepotError("BAD_REQUEST", "Content-Length is not a number");
  return Number(raw);
}

function requireEmpty(request: Request): void {
  const length = contentLength(request);
  if (length !== undefined && length > 0) throw new RunnerDepotError("BAD_REQUEST", "This addition takes no body");
}

/** The request body as a stream that is never buffered whole; `empty` after peeking one chunk. */
async function uploadBody(request: Request): Promise<UploadBody> {
  const length = contentLength(request);
  const nothing = (async function* () {})();
  if (request.body === null || length === 0) return { empty: true, chunks: nothing, length };
  const reader = request.body.getReader();
  let first = await reader.read();
  while (!first.done && first.value.byteLength === 0) first = await reader.read();
  if (first.done) {
    reader.releaseLock();
    return { empty: true, chunks: nothing, length };
  }
  const head = first.value;
  async function* chunks(): AsyncIterable<Uint8Array> {
    try {
      yield head;
      for (;;) {
        const next = await reader.read();
        if (next.done) return;
        yield next.value;
      }
    } finally {
      reader.releaseLock();
    }
  }
  return { empty: false, chunks: chunks(), length };
}

function matchesEtag(header: string | null, etag: string): boolean {
  if (header === null) return false;
  if (header.trim() === "*") return true;
  return header.split(",").some((tag) => tag.trim().replace(/^W\//, "") === etag);
}

type RangeAnswer = { kind: "full" } | { kind: "partial"; start: number; end: number } | { kind: "unsatisfiable" };

/** A single `bytes=` range (RFC 9110); anything malformed or multi-range is served whole. */
function parseRangeHeader(header: string | null, size: number): RangeAnswer {
  if (header === null) return { kind: "full" };
  const match = /^\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*$/.exec(header);
  if (!match || (match[1] === "" && match[2] === "")) return { kind: "full" };
  if (match[1] === "") {
    const suffix = Number(match[2]);
    if (suffix === 0 || size === 0) return { kind: "unsatisfiable" };
    return { kind: "partial", start: Math.max(0, size - suffix), end: size - 1 };
  }
  const start = Number(match[1]);
  const end = match[2] === "" ? size - 1 : Math.min(Number(match[2]), size - 1);
  if (match[2] !== "" && Number(match[2]) < start) return { kind: "full" };
  if (start >= size) return { kind: "unsatisfiable" };
  return { kind: "partial", start, end };
}

async function serveBlob(request: Request, store: PackageStore, digest: string, size: number, filename: string, signedSeconds: number): Promise<Response> {
  if (!isStoreDigest(digest)) throw new RunnerDepotError("INTERNAL", `Bad stored digest ${digest}`);
  const etag = `"${digest.slice(7)}"`;
  const reprDigest = toHttpDigest(digest);
  const headers: Record<string, string> = {
    ETag: etag,
    "Repr-Digest": reprDigest,
    "Cache-Control": IMMUTABLE,
    "Accept-Ranges": "bytes",
  };
  if (matchesEtag(request.headers.get("if-none-match"), etag)) return new Response(null, { status: 304, headers });
  if (store.signBlobUrl) {
    const url = await store.signBlobUrl(digest, { expiresInSeconds: signedSeconds, filename });
    if (url) return new Response(null, { status: 302, headers: { ...headers, Location: url, "Cache-Control": "no-store" } });
  }
  const ifRange = request.headers.get("if-range");
  const range = ifRange !== null && ifRange.trim() !== etag ? ({ kind: "full" } as RangeAnswer) : parseRangeHeader(request.headers.get("range"), size);
  if (range.kind === "unsatisfiable") {
    const problem = new RunnerDepotError("RANGE_NOT_SATISFIABLE", `The archive has ${size} bytes`).toProblem();
    return new Response(JSON.stringify(problem), {
      status: 416,
      headers: { "Content-Type": "application/problem+json", "Content-Range": `bytes */${size}`, "Repr-Digest": reprDigest, ETag: etag, "Accept-Ranges": "bytes" },
    });
  }
  headers["Content-Type"] = "application/x-tar";
  headers["Content-Disposition"] = `attachment; filename="${filename}"`;
  const head = request.method === "HEAD";
  if (range.kind === "partial") {
    headers["Content-Range"] = `bytes ${range.start}-${range.end}/${size}`;
    headers["Content-Length"] = String(range.end - range.start + 1);
    const body = head ? null : await store.getBlob(digest, { start: range.start, end: range.end });
    if (!head && !body) throw new RunnerDepotError("INTERNAL", `Blob ${digest} is missing`);
    return new Response(body ? toWebStream(body) : null, { status: 206, headers });
  }
  headers["Content-Length"] = String(size);
  headers["Content-Digest"] = reprDigest;
  const body = head ? null : await store.getBlob(digest);
  if (!head && !body) throw new RunnerDepotError("INTERNAL", `Blob ${digest} is missing`);
  return new Response(body ? toWebStream(body) : null, { status: 200, headers });
}


/** A pull-based web stream over an async iterable: nothing is read ahead of the client. */
function toWebStream(source: AsyncIterable<Uint8Array>): ReadableStream<Uint8Array> {
  const iterator = source[Symbol.asyncIterator]();
  return new ReadableStream<Uint8Array>(
    {
      async pull(controller) {
        const next = await iterator.next();
        if (next.done) controller.close();
        else controller.enqueue(next.value);
      },
      async cancel(reason) {
        await iterator.return?.(reason);
      },
    },
    { highWaterMark: 0 },
  );
}
