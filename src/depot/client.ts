/**
 * The depot's HTTP client: the installer API (catalog with ETag caching, versions,
 * depends, resumable verified downloads, deltas) and the packager API (transactional
 * publish that sends a file's bytes only when the depot does not hold them yet).
 * Web-standard `fetch` only, so any `fetch` (a proxy, a test double, undici with a
 * dispatcher) can be passed in.
 */
import { createHash, randomUUID } from "node:crypto";
import { createReadStream } from "node:fs";
import { lstat, open, readdir, readlink, rename, rm, type FileHandle } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { Readable, type Writable } from "node:stream";
import { RunnerDepotError } from "../errors.js";
import {
  digestToHex,
  encodeHeaderValue,
  errorFromResponse,
  hexToDigest,
  hexToHttpDigest,
  sha256OfStream,
} from "./client-http.js";
import { readPackageManifest, type PackageManifest } from "./extract.js";
import { installPackage, type InstallOptions, type InstallResult } from "./installer.js";
import { parsePackageSpec, type Requirement } from "./resolve.js";

/** Options of {@link createDepotClient}. */
export interface DepotClientOptions {
  /** The depot's base URL, e.g. `http://127.0.0.1:8080` or `https://depot.example/api`. */
  baseUrl: string | URL;
  /** A bearer token sent on every request. */
  token?: string;
  /** The `fetch` to use (default: the global one). */
  fetch?: typeof fetch;
  /** How many times a broken download is resumed without progress before giving up. Default 5. */
  retries?: number;
  /** First retry delay in ms, doubled per retry up to 2 s. Default 100. */
  retryDelayMs?: number;
}

/** `GET /catalog`. */
export interface Catalog {
  packages: Record<string, { latest: string; versions: string[]; updatedAt: string }>;
  count: number;
  updatedAt: string;
}

/** One version in `GET /version/<name>`. */
export interface VersionEntry {
  version: string;
  publishedAt: string;
  digest: string;
  size: number;
  itemCount: number;
  attributes: Record<string, unknown>;
}

/** `GET /version/<name>`. */
export interface VersionInfo {
  name: string;
  latest: string;
  versions: VersionEntry[];
}

/** `GET /depend/<name>[@<version>]`. */
export interface DependInfo {
  name: string;
  version: string;
  requires: Requirement[];
}

/** A download's progress: bytes received of the whole archive (`total` when known). */
export interface DownloadProgress {
  received: number;
  total?: number;
  /** Resumptions so far (after broken transfers). */
  resumes: number;
}

/** Options of {@link DepotClient.download}. */
export interface DownloadOptions {
  /** Fetch the delta from this installed version instead of the whole package. */
  from?: string;
  /**
   * A file path (written to `<path>.part`, renamed when the digest checks out, removed
   * otherwise), or a writable stream. Default: a new file under `os.tmpdir()`.
   */
  to?: string | Writable | WritableStream<Uint8Array>;
  onProgress?: (progress: DownloadProgress) => void;
  signal?: AbortSignal;
}

/** What a finished, verified download was. */
export interface DownloadResult {
  /** The final (immutable, after redirects) URL. */
  url: string;
  /** `sha256:<hex>` of the whole archive, checked against the server's Repr-Digest. */
  digest: string;
  size: number;
  etag: string | null;
  /** How many times the transfer was resumed with a Range request. */
  resumes: number;
  /** The file written, when `to` was a path or absent. */
  path?: string;
}

/** A file, directory or link to publish. */
export type PublishItem =
  | { type: "file"; path: string; mode?: number; /** read from this file on disk */ file?: string; /** or these bytes */ content?: Uint8Array | string }
  | { type: "dir"; path: string; mode?: number }
  | { type: "link"; path: string; target: string };

/** Publish progress: after every item and as file bytes go out. */
export interface PublishProgress {
  item: number;
  items: number;
  path?: string;
  bytesSent: number;
  byReference: number;
}

/** Options of {@link DepotClient.publish}. */
export interface PublishOptions {
  name: string;
  version: string;
  /** Publish this directory's contents (files, directories, relative links, with modes). */
  dir?: string;
  /** Or these items. */
  items?: PublishItem[];
  /** `name` → SemVer range. */
  requires?: Record<string, string> | Requirement[];
  attributes?: Record<string, string>;
  license?: { name: string; text: string };
  /**
   * Offer each file by reference first (empty body + Content-Digest) and upload only on
   * 409 DIGEST_UNKNOWN. Default true; false uploads every file.
   */
  byReference?: boolean;
  onProgress?: (progress: PublishProgress) => void;
  /** Additions in flight at once. Default 4. */
  concurrency?: number;
}

/** What a publish did. */
export interface PublishResult {
  url: string;
  name: string;
  version: string;
  digest: string;
  transaction: string;
  /** File bytes sent in request bodies. */
  bytesSent: number;
  /** Files the depot took by reference (no bytes sent). */
  byReference: number;
  /** Files uploaded. */
  uploaded: number;
}

/** The depot client. */
export interface DepotClient {
  readonly baseUrl: string;
  /** `GET /catalog`, sending the last ETag; a 304 answers the cached catalog. */
  catalog(): Promise<Catalog>;
  /** `GET /version/<name>`. */
  versions(name: string): Promise<VersionInfo>;
  /** `GET /depend/<spec>` (`name` or `name@version`). */
  depends(spec: string): Promise<DependInfo>;
  /** Streams `/data/<spec>` (or a delta) to a file or stream, verifying and resuming. */
  download(spec: string, options?: DownloadOptions): Promise<DownloadResult>;
  /** The manifest of `/data/<spec>`, read from the archive's head with a Range request. */
  manifest(spec: string): Promise<PackageManifest>;
  /** Publishes a version through a transaction; abandons it on any failure. */
  publish(options: PublishOptions): Promise<PublishResult>;
  /** Resolves, downloads, verifies and installs `spec` and its dependencies under `targetDir`. */
  install(spec: string, targetDir: string, options?: InstallOptions): Promise<InstallResult>;
}

const RETRY_STATUS = new Set([502, 503, 504]);

function versionPart(spec: string): { name: string; version?: string } {
  const parsed = parsePackageSpec(spec);
  if (parsed.range !== "*" && !parsed.exact) {
    throw new RunnerDepotError("VERSION_INVALID", `expected name or name@version, got a range: ${spec}`);
  }
  return parsed.exact ? { name: parsed.name, version: parsed.range } : { name: parsed.name };
}

const seg = (s: string) => encodeURIComponent(s);
const specPath = (name: string, version?: string) => (version ? `${seg(name)}@${seg(version)}` : seg(name));

/**
 * Creates a depot client.
 *
 * @example
 * const depot = createDepotClient({ baseUrl: "http://127.0.0.1:8080", token });
 * await depot.publish({ name: "tool", version: "1.0.0", dir: "./build", requires: { libc: "^2" } });
 * await depot.install("tool@^1", "/opt/pkgs");
 */
export function createDepotClient(options: DepotClientOptions): DepotClient {
  const base = String(options.baseUrl).replace(/\/*$/, "/");
  const fetchImpl = options.fetch ?? globalThis.fetch;
  const retries = options.retries ?? 5;
  const retryDelayMs = options.retryDelayMs ?? 100;
  let cachedCatalog: { etag: string; body: Catalog } | null = null;

  const url = (relative: string) => new URL(relative, base).href;
  const headersWith = (extra?: HeadersInit) => {
    const h = new Headers(extra);
    if (options.token !== undefined) h.set("authorization", `Bearer ${options.token}`);
    return h;
  };
  const call = async (method: string, relative: string, init: RequestInit = {}): Promise<Response> => {
    try {
      return await fetchImpl(url(relative), { ...init, method, headers: headersWith(init.headers) });
    } catch (cause) {
      if (cause instanceof RunnerDepotError) throw cause;
      throw new RunnerDepotError("UNAVAILABLE", `${method} ${relative}: ${(cause as Error).message}`, { cause });
    }
  };
  const json = async <T>(method: string, relative: string, init?: RequestInit): Promise<T> => {
    const response = await call(method, relative, init);
    if (!response.ok) throw await errorFromResponse(response, `${method} /${relative}`);
    return (await response.json()) as T;
  };
  const sleep = (attempt: number) =>
    new Promise((resolve) => setTimeout(resolve, Math.min(2000, retryDelayMs * 2 ** attempt)));

  const client: DepotClient = {
    baseUrl: base,

    async catalog() {
      const headers: Record<string, string> = {};
      if (cachedCatalog) headers["if-none-match"] = cachedCatalog.etag;
      const response = await call("GET", "catalog", { headers });
      if (response.status === 304 && cachedCatalog) {
        await response.body?.cancel();
        return cachedCatalog.body;
      }
      if (!response.ok) throw await errorFromResponse(response, "GET /catalog");
      const body = (await response.json()) as Catalog;
      const etag = response.headers.get("etag");
      cachedCatalog = etag ? { etag, body } : null;
      return body;
    },

    versions(name) {
      return json<VersionInfo>("GET", `version/${seg(versionPart(name).name)}`);
    },

    depends(spec) {
      const { name, version } = versionPart(spec);
      return json<DependInfo>("GET", `depend/${specPath(name, version)}`);
    },

    async manifest(spec) {
      const { name, version } = versionPart(spec);
      const relative = `data/${specPath(name, version)}`;
      // The manifest is the archive's first entry: its head is usually enough.
      const head = await call("GET", relative, { headers: { range: "bytes=0-65535" } });
      if (!head.ok) throw await errorFromResponse(head, `GET /${relative}`);
      try {
        return await readPackageManifest(Readable.fromWeb(head.body as never));
      } catch (error) {
        if (head.status !== 206) throw error;
      }
      const whole = await call("GET", relative);
      if (!whole.ok) throw await errorFromResponse(whole, `GET /${relative}`);
      return readPackageManifest(Readable.fromWeb(whole.body as never));
    },

    async download(spec, opts = {}) {
      const { name, version } = versionPart(spec);
      let relative: string;
      if (opts.from !== undefined) {
        const from = versionPart(`${name}@${opts.from}`).version!;
        relative = version ? `data/${seg(name)}/${seg(from)}/${seg(version)}` : `data/${seg(name)}/${seg(from)}`;
      } else {
        relative = `data/${specPath(name, version)}`;
      }
      const sink = await openSink(opts.to, `${name}-${version ?? "latest"}`);
      let target = url(relative);
      let hash = createHash("sha256");
      let received = 0;
      let total: number | undefined;
      let etag: string | null = null;
      let expected: string | null = null;
      let resumes = 0;
      let idle = 0; // attempts in a row without a byte of progress
      try {
        for (;;) {
          const headers = headersWith();
          if (received > 0) {
            headers.set("range", `bytes=${received}-`);
            if (etag) headers.set("if-range", etag);
          }
          let response: Response;
          try {
            response = await fetchImpl(target, { headers, redirect: "follow", signal: opts.signal });
          } catch (cause) {
            if (opts.signal?.aborted || idle++ >= retries) {
              throw new RunnerDepotError("UNAVAILABLE", `GET ${target}: ${(cause as Error).message}`, { cause });
            }
            await sleep(idle);
            continue;
          }
          if (RETRY_STATUS.has(response.status) && idle++ < retries) {
            await response.body?.cancel();
            await sleep(idle);
            continue;
          }
          if (response.status !== 200 && response.status !== 206) {
            throw await errorFromResponse(response, `GET ${target}`);
          }
          const repr = response.headers.get("repr-digest") ?? (response.status === 200 ? response.headers.get("content-digest") : null);
          const reprHex = repr ? digestToHex(repr) : null;
          const thisEtag = response.headers.get("etag");
          // Follow redirects once, then stick to the immutable URL for resumption.
          if (response.url) target = response.url;
          let restart = false;
          if (response.status === 206) {
            const m = /^bytes (\d+)-(\d+)\/(\d+|\*)$/.exec(response.headers.get("content-range") ?? "");
            const changed = (etag && thisEtag && thisEtag !== etag) || (expected && reprHex && reprHex !== expected);
            if (!m || Number(m[1]) !== received || changed) {
              await response.body?.cancel();
              throw new RunnerDepotError("UNAVAILABLE", `GET ${target}: the server resumed at the wrong place or with another representation`);
            }
            if (m[3] !== "*") total = Number(m[3]);
          } else {
            restart = received > 0; // the server ignored the range or the representation changed
            const length = response.headers.get("content-length");
            total = length === null ? undefined : Number(length);
          }
          if (restart) {
            if (!sink.restart) {
              await response.body?.cancel();
              throw new RunnerDepotError("UNAVAILABLE", `GET ${target}: the server restarted the transfer and the target stream cannot rewind`);
            }
            await sink.restart();
            hash = createHash("sha256");
            received = 0;
          }
          if (received === 0 || response.status === 200) {
            etag = thisEtag;
            expected = reprHex;
          }
          if (received > 0) resumes++;
          const before = received;
          try {
            if (response.body) {
              for await (const chunk of response.body as unknown as AsyncIterable<Uint8Array>) {
                hash.update(chunk);
                await sink.write(chunk);
                received += chunk.byteLength;
                opts.onProgress?.({ received, total, resumes });
              }
            }
          } catch (cause) {
            if (opts.signal?.aborted) throw cause;
            if (received > before) idle = 0;
            if (idle++ >= retries) {
              throw new RunnerDepotError("UNAVAILABLE", `GET ${target}: transfer broken at ${received} bytes: ${(cause as Error).message}`, { cause });
            }
            await sleep(0);
            continue;
          }
          if (total !== undefined && received < total) {
            // A body that ended early without an error (some proxies do that): resume.
            if (received > before) idle = 0;
            if (idle++ >= retries) {
              throw new RunnerDepotError("UNAVAILABLE", `GET ${target}: transfer ended at ${received} of ${total} bytes`);
            }
            continue;
          }
          break;
        }
        const hex = hash.digest("hex");
        if (!expected) {
          throw new RunnerDepotError("DIGEST_MISMATCH", `GET ${target}: the server sent no Repr-Digest to verify the download against`);
        }
        if (hex !== expected) {
          throw new RunnerDepotError("DIGEST_MISMATCH", `GET ${target}: received sha256:${hex}, the server announced sha256:${expected}`, {
            details: { expected: hexToDigest(expected), actual: hexToDigest(hex) },
          });
        }
        if (total !== undefined && received !== total) {
          throw new RunnerDepotError("DIGEST_MISMATCH", `GET ${target}: received ${received} bytes, expected ${total}`);
        }
        const written = await sink.finish();
        return { url: target, digest: hexToDigest(hex), size: received, etag, resumes, ...(written ? { path: written } : {}) };
      } catch (error) {
        await sink.abort();
        throw error;
      }
    },

    async publish(p) {
      const { name } = versionPart(p.name);
      const version = p.version;
      const items = p.items ?? (p.dir !== undefined ? await collectDirectory(p.dir) : null);
      if (!items) throw new RunnerDepotError("BAD_REQUEST", "publish needs dir or items");
      const opened = await json<{ transaction: string }>("POST", `trans/${specPath(name, version)}`);
      const id = opened.transaction;
      const t = seg(id);
      let bytesSent = 0;
      let byReference = 0;
      let uploaded = 0;
      const progress = (item: number, itemPath?: string) =>
        p.onProgress?.({ item, items: items.length, path: itemPath, bytesSent, byReference });
      const add = async (type: string, headers: Headers, body?: BodyInit) => {
        const response = await call("POST", `add/${t}/${type}`, {
          headers,
          ...(body === undefined ? {} : { body, duplex: "half" }),
        } as RequestInit);
        return response;
      };
      try {
        let finished = 0;
        const addItem = async (item: PublishItem) => {
          const headers = new Headers({ "pkg-path": encodeHeaderValue(item.path) });
          if (item.type === "dir") {
            if (item.mode !== undefined) headers.set("pkg-mode", octal(item.mode));
            await expectOk(await add("dir", headers), `add dir ${item.path}`);
          } else if (item.type === "link") {
            headers.set("pkg-target", encodeHeaderValue(item.target));
            await expectOk(await add("link", headers), `add link ${item.path}`);
          } else {
            if (item.mode !== undefined) headers.set("pkg-mode", octal(item.mode));
            const source = fileSource(item);
            const { hex, size } = await sha256OfStream(source());
            // An empty file travels as an empty upload: there is nothing to save.
            if (size > 0) headers.set("content-digest", hexToHttpDigest(hex));
            let done = false;
            if (p.byReference !== false && size > 0) {
              const response = await add("file", headers, new Uint8Array(0));
              if (response.ok) {
                await response.body?.cancel();
                byReference++;
                done = true;
              } else {
                const error = await errorFromResponse(response, `add file ${item.path} by reference`);
                if (error.code !== "DIGEST_UNKNOWN") throw error;
              }
            }
            if (!done) {
              const counted = Readable.toWeb(Readable.from(countBytes(source(), (n) => {
                bytesSent += n;
                progress(finished, item.path);
              }))) as ReadableStream<Uint8Array>;
              await expectOk(await add("file", headers, size === 0 ? new Uint8Array(0) : counted), `add file ${item.path}`);
              uploaded++;
            }
          }
          progress(++finished, item.path);
        };
        // Several additions in flight: each is a round trip and a record write on the server.
        const queue = [...items];
        let failed = false;
        const worker = async () => {
          while (!failed && queue.length > 0) {
            try {
              await addItem(queue.shift()!);
            } catch (error) {
              failed = true;
              throw error;
            }
          }
        };
        const results = await Promise.allSettled(Array.from({ length: Math.max(1, Math.min(p.concurrency ?? 4, items.length)) }, worker));
        const rejected = results.find((r): r is PromiseRejectedResult => r.status === "rejected");
        if (rejected) throw rejected.reason;
        if (p.license) {
          const headers = new Headers({ "pkg-license": encodeHeaderValue(p.license.name) });
          await expectOk(await add("license", headers, p.license.text), "add license");
        }
        const attributes = Object.entries(p.attributes ?? {});
        if (attributes.length > 0) {
          const headers = new Headers();
          for (const [key, value] of attributes) {
            if (!/^[A-Za-z0-9._-]+$/.test(key)) throw new RunnerDepotError("HEADER_INVALID", `attribute name ${JSON.stringify(key)} is not a token`);
            headers.append("pkg-attr", `${key}=${encodeHeaderValue(value)}`);
          }
          await expectOk(await add("set", headers), "set attributes");
        }
        const requires = Array.isArray(p.requires)
          ? p.requires
          : Object.entries(p.requires ?? {}).map(([n, range]) => ({ name: n, range }));
        if (requires.length > 0) {
          const headers = new Headers();
          for (const r of requires) headers.append("pkg-require", `${r.name}@${r.range || "*"}`);
          await expectOk(await call("POST", `meta/${t}/require`, { headers }), "add requires");
        }
        // A repeated commit answers 200 with the same body, so a lost answer is retried.
        let committed: { url: string; name: string; version: string; digest: string } | null = null;
        for (let attempt = 0; committed === null; attempt++) {
          let response: Response;
          try {
            response = await call("POST", `commit/${t}`);
          } catch (error) {
            if (attempt >= 2) throw error;
            await sleep(attempt);
            continue;
          }
          if (!response.ok) throw await errorFromResponse(response, `commit ${name}@${version}`);
          committed = (await response.json()) as typeof committed;
        }
        const done = committed as { url: string; name: string; version: string; digest: string };
        return { url: done.url, name: done.name, version: done.version, digest: done.digest, transaction: id, bytesSent, byReference, uploaded };
      } catch (error) {
        // Abandon: the depot frees the transaction and its uncommitted blobs.
        await call("DELETE", `trans/${t}`)
          .then((r) => r.body?.cancel())
          .catch(() => undefined);
        throw RunnerDepotError.from(error);
      }
    },

    install(spec, targetDir, installOptions) {
      return installPackage(client, spec, targetDir, installOptions);
    },
  };
  return client;
}

async function expectOk(response: Response, what: string): Promise<void> {
  if (!response.ok) throw await errorFromResponse(response, what);
  await response.body?.cancel();
}

function octal(mode: number): string {
  return `0${(mode & 0o7777).toString(8).padStart(3, "0")}`;
}

function fileSource(item: Extract<PublishItem, { type: "file" }>): () => AsyncIterable<Uint8Array> {
  if (item.file !== undefined) {
    const file = item.file;
    return () => createReadStream(file, { highWaterMark: 1024 * 1024 });
  }
  const bytes = typeof item.content === "string" ? Buffer.from(item.content) : (item.content ?? new Uint8Array(0));
  return async function* () {
    if (bytes.byteLength > 0) yield bytes;
  };
}

async function* countBytes(source: AsyncIterable<Uint8Array>, onChunk: (n: number) => void): AsyncIterable<Uint8Array> {
  for await (const chunk of source) {
    onChunk(chunk.byteLength);
    yield chunk;
  }
}

/**
 * The items of a directory tree, sorted by path: every subdirectory, regular file and
 * symbolic link, with permission bits. Anything else (a socket, a device) is refused.
 */
export async function collectDirectory(dir: string): Promise<PublishItem[]> {
  const root = path.resolve(dir);
  const items: PublishItem[] = [];
  const walk = async (rel: string) => {
    const abs = rel === "" ? root : path.join(root, rel);
    const names = (await readdir(abs)).sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b)));
    for (const entry of names) {
      const childRel = rel === "" ? entry : `${rel}/${entry}`;
      const child = path.join(abs, entry);
      const st = await lstat(child);
      if (st.isDirectory()) {
        items.push({ type: "dir", path: childRel, mode: st.mode & 0o777 });
        await walk(childRel);
      } else if (st.isFile()) {
        items.push({ type: "file", path: childRel, mode: st.mode & 0o777, file: child });
      } else if (st.isSymbolicLink()) {
        items.push({ type: "link", path: childRel, target: await readlink(child) });
      } else {
        throw new RunnerDepotError("TYPE_INVALID", `${child} is neither a file, a directory nor a link`);
      }
    }
  };
  await walk("");
  return items;
}

interface Sink {
  write(chunk: Uint8Array): Promise<void>;
  /** Rewinds to zero bytes; absent when the target cannot rewind. */
  restart?(): Promise<void>;
  /** Makes the result visible; returns the file path, if any. */
  finish(): Promise<string | undefined>;
  abort(): Promise<void>;
}

async function openSink(to: DownloadOptions["to"], stem: string): Promise<Sink> {
  if (to === undefined || typeof to === "string") {
    const final = to ?? path.join(os.tmpdir(), `${stem}-${randomUUID()}.tar`);
    const part = `${final}.part`;
    const fh: FileHandle = await open(part, "w", 0o644);
    let position = 0;
    let closed = false;
    const close = async () => {
      if (!closed) {
        closed = true;
        await fh.close();
      }
    };
    return {
      async write(chunk) {
        let offset = 0;
        while (offset < chunk.byteLength) {
          const { bytesWritten } = await fh.write(chunk, offset, chunk.byteLength - offset, position);
          offset += bytesWritten;
          position += bytesWritten;
        }
      },
      async restart() {
        await fh.truncate(0);
        position = 0;
      },
      async finish() {
        // No fsync: a download lost in a crash is simply fetched again.
        await close();
        await rename(part, final);
        return final;
      },
      async abort() {
        await close().catch(() => undefined);
        await rm(part, { force: true });
      },
    };
  }
  if (typeof (to as WritableStream).getWriter === "function") {
    const writer = (to as WritableStream<Uint8Array>).getWriter();
    return {
      write: (chunk) => writer.write(chunk),
      async finish() {
        await writer.close();
        return undefined;
      },
      async abort() {
        await writer.abort().catch(() => undefined);
      },
    };
  }
  const stream = to as Writable;
  return {
    write: (chunk) =>
      new Promise<void>((resolve, reject) => {
        // The callback fires once the chunk is handed on, which is backpressure enough.
        stream.write(chunk, (error) => (error ? reject(error) : resolve()));
      }),
    async finish() {
      return undefined;
    },
    async abort() {
      // The caller owns the stream; leave it open but stop writing.
    },
  };
}
