/**
 * The depot client's publish: one transaction (docs/depot-api.md §Packager API) that
 * offers each file by reference first (an empty body and its digest) and uploads it only
 * when the depot does not hold those bytes yet, then commits; any failure abandons it.
 */
import { createReadStream } from "node:fs";
import { Readable } from "node:stream";
import { RunnerDepotError } from "../../errors.js";
import { encodeHeaderValue, errorFromResponse, hexToHttpDigest, sha256OfStream } from "./http.js";
import { seg, specPath, versionPart, type DepotConnection } from "./connection.js";
import type { PublishItem, PublishOptions, PublishResult } from "./types.js";
import { collectDirectory } from "./collect-directory.js";

/** One addition of the transaction: `POST /add/<id>/<type>` with these headers and body. */
type Add = (type: string, headers: Headers, body?: BodyInit) => Promise<Response>;

/** What a commit answers (201 the first time, 200 with the same body when repeated). */
interface Committed {
  url: string;
  name: string;
  version: string;
  digest: string;
}

/**
 * Publishes a version through a transaction; abandons it on any failure.
 *
 * @example
 * const result = await publishVersion(createDepotConnection({ baseUrl, token }), {
 *   name: "tool",
 *   version: "1.0.0",
 *   dir: "./build",
 * });
 */
export async function publishVersion(connection: DepotConnection, p: PublishOptions): Promise<PublishResult> {
  const { call, json, url } = connection;
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
  const add: Add = async (type, headers, body) => {
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
          const counted = Readable.toWeb(
            Readable.from(
              countBytes(source(), (n) => {
                bytesSent += n;
                progress(finished, item.path);
              }),
            ),
          ) as ReadableStream<Uint8Array>;
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
    const results = await Promise.allSettled(
      Array.from({ length: Math.max(1, Math.min(p.concurrency ?? 4, items.length)) }, worker),
    );
    const rejected = results.find((r): r is PromiseRejectedResult => r.status === "rejected");
    if (rejected) throw rejected.reason;
    await addMetadata(connection, t, p, add);
    const done = await commitWithRetry(connection, t, `${name}@${version}`);
    // The depot answers a URL relative to itself unless it knows its public URL.
    return {
      url: new URL(done.url, url(`commit/${t}`)).href,
      name: done.name,
      version: done.version,
      digest: done.digest,
      transaction: id,
      bytesSent,
      byReference,
      uploaded,
    };
  } catch (error) {
    // Abandon: the depot frees the transaction and its uncommitted blobs.
    await call("DELETE", `trans/${t}`)
      .then((r) => r.body?.cancel())
      .catch(() => undefined);
    throw RunnerDepotError.from(error);
  }
}

/** The transaction's licence, attributes and requirements, each only when given. */
async function addMetadata(connection: DepotConnection, t: string, p: PublishOptions, add: Add): Promise<void> {
  const { call } = connection;
  if (p.license) {
    const headers = new Headers({ "pkg-license": encodeHeaderValue(p.license.name) });
    await expectOk(await add("license", headers, p.license.text), "add license");
  }
  const attributes = Object.entries(p.attributes ?? {});
  if (attributes.length > 0) {
    const headers = new Headers();
    for (const [key, value] of attributes) {
      if (!/^[A-Za-z0-9._-]+$/.test(key))
        throw new RunnerDepotError("HEADER_INVALID", `attribute name ${JSON.stringify(key)} is not a token`);
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
}

/**
 * Commits transaction `t`.
 * Why: docs/decisions/depot-client.md, "publish.ts: commitWithRetry".
 */
async function commitWithRetry(connection: DepotConnection, t: string, what: string): Promise<Committed> {
  const { call, sleep, retries } = connection;
  let committed: Committed | null = null;
  let conflicts = 0;
  for (let attempt = 0; committed === null; attempt++) {
    let response: Response;
    try {
      response = await call("POST", `commit/${t}`);
    } catch (error) {
      if (attempt >= 2) throw error;
      await sleep(attempt);
      continue;
    }
    if (!response.ok) {
      const error = await connection.error(response, `commit ${what}`);
      if (error.code !== "CONFLICT" || conflicts >= retries) throw error;
      await sleep(conflicts++);
      continue;
    }
    committed = await connection.readJson<Committed>(response, `commit ${what}`);
  }
  return committed as Committed;
}

/** Throws the problem of a failed answer; drops the body of a good one. */
async function expectOk(response: Response, what: string): Promise<void> {
  if (!response.ok) throw await errorFromResponse(response, what);
  await response.body?.cancel();
}

/** Pkg-Mode: the permission bits as four octal digits. */
function octal(mode: number): string {
  return `0${(mode & 0o7777).toString(8).padStart(3, "0")}`;
}

/** A file item's bytes, readable as often as needed (once for its digest, again to upload it). */
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

/** `source`, each chunk's size told to `onChunk` as it passes (publish progress). */
async function* countBytes(source: AsyncIterable<Uint8Array>, onChunk: (n: number) => void): AsyncIterable<Uint8Array> {
  for await (const chunk of source) {
    onChunk(chunk.byteLength);
    yield chunk;
  }
}
