/**
 * The mirror's batch reads (docs/depot-api.md §Mirror reads): one feed page with each new version's listing and
 * manifest (`GET /mirror/feed`), and the item blobs of many versions in one answer (`POST /mirror/blobs`), so an
 * incremental mirror moves a few hundred bytes per version beyond its new bytes instead of four requests' worth.
 * Both need `read` on every package they answer about; a blob is answered only as an item or licence of a version
 * the reader may read (never by digest alone).
 * Why: docs/decisions/depot-yank-mirror.md, "mirror-routes.ts".
 */
import { promisify } from "node:util";
import { readBlobWithin, readVersionManifest } from "../store/blob-read.js";
import { gzip } from "node:zlib";
import type { IRequest } from "itty-router";
import { RunnerDepotError } from "../../errors.js";
import { boundedRequestBody } from "./bounded-body.js";
import { catalogHead } from "../catalog/head.js";
import { readChanges } from "../catalog/changes.js";
import type { PackageManifest } from "../package/archive.js";
import { parsePackageRef } from "../package/names.js";
import { keys, mapLimit, type VersionRecord } from "../store/records.js";
import type { RouterContext } from "./router-context.js";
import { lazyWebStream } from "./web-streams.js";

const gzipped = promisify(gzip);

/** Changes per feed answer at most (the default too). */
const FEED_MAX = 100;
/**
 * Manifest bytes (UTF-8, as stored) per feed answer; versions past it are answered without (the mirror reads them
 * alone), their manifests never read.
 */
const FEED_DETAIL_BYTES = 8 * 2 ** 20;
/** Blobs per `POST /mirror/blobs` at most, and the largest body asking for them. */
const BLOBS_MAX = 1000;
const BLOBS_BODY = 256 * 1024;
/** Distinct versions per `POST /mirror/blobs` at most (a feed page's worth): each costs one manifest read. */
const BLOBS_VERSIONS = FEED_MAX;
/** The most bytes one blobs answer carries. */
const BLOBS_BYTES = 256 * 2 ** 20;

/** Registers `GET /mirror/feed` and `POST /mirror/blobs`. */
export function registerMirrorRoutes(context: RouterContext): void {
  const { router, store, principalOf } = context;

  router.get("/mirror/feed", async (request: IRequest) => {
    await principalOf(request, "read");
    const params = new URL(request.url).searchParams;
    const since = params.get("since") ?? "0";
    const limitText = params.get("limit") ?? String(FEED_MAX);
    if (!/^[0-9]{1,15}$/.test(since)) throw new RunnerDepotError("BAD_REQUEST", "since must be a position");
    if (!/^[0-9]{1,3}$/.test(limitText) || Number(limitText) < 1 || Number(limitText) > FEED_MAX)
      throw new RunnerDepotError("BAD_REQUEST", `limit must be from 1 to ${FEED_MAX}`);
    const head = await catalogHead(store, context.now, Number(since));
    if (Number(since) > head)
      throw new RunnerDepotError("BAD_REQUEST", `since=${since} is past this depot's newest position ${head}`);
    // O(limit) entries, then per publish entry two reads and a stat; then, in feed order, only the manifests that fit
    // what is left of the budget are read, so the texts held are O(FEED_DETAIL_BYTES), not O(entries × manifest).
    const { entries, scannedTo } = await readChanges(store, Number(since), head, { limit: Number(limitText) });
    const mayRead = readCheck(request, context);
    const listed = await mapLimit(entries, 8, async (e) => {
      if (e.yanked !== undefined || e.attested !== undefined || e.removed || !(await mayRead(e.name))) return null;
      const record = (await store.getRecord<VersionRecord>(keys.version(e.name, e.version)))?.value;
      const stat = record ? await store.statBlob(record.manifest) : null;
      return record && stat
        ? {
            publishedAt: record.publishedAt,
            digest: record.digest,
            size: record.size,
            blob: record.manifest,
            bytes: stat.size,
          }
        : null;
    });
    // As before, a manifest past what is left is left out (read alone by the mirror) and a later smaller one may fit.
    let budget = FEED_DETAIL_BYTES;
    const chosen = listed.map((l) => {
      if (!l || l.bytes > budget) return null;
      budget -= l.bytes;
      return l;
    });
    const texts = await mapLimit(chosen, 8, async (l) => (l ? blobText(context, l.blob, l.bytes) : null));
    const versions: Record<string, unknown> = {};
    entries.forEach((e, i) => {
      const l = chosen[i];
      const manifest = texts[i];
      if (!l || manifest === null || manifest === undefined) return;
      versions[`${e.name}@${e.version}`] = { publishedAt: l.publishedAt, digest: l.digest, size: l.size, manifest };
    });
    const changes = entries.map((e) => ({
      position: e.position,
      name: e.name,
      version: e.version,
      ...(e.yanked !== undefined ? { yanked: e.yanked } : {}),
      ...(e.attested !== undefined ? { attested: e.attested } : {}),
      ...(e.removed ? { removed: true } : {}),
    }));
    const position = entries.length > 0 ? scannedTo : Number(since);
    return compressedJson(request, { position, more: position < head, changes, versions });
  });

  router.post("/mirror/blobs", async (request: IRequest) => {
    await principalOf(request, "read");
    const body = await boundedRequestBody(request, "a blob list", BLOBS_BODY);
    if (body === null) throw new RunnerDepotError("BAD_REQUEST", "no body");
    const asked = parseBlobList(body);
    const mayRead = readCheck(request, context);
    // Refs grouped by the version they name (`big@1.0.0+1` and `big@1.0.0+2` are one: build metadata is dropped)
    // before anything is read, so the work is O(distinct versions ≤ BLOBS_VERSIONS) manifest reads, each once.
    const versionOf: string[] = [];
    const wanted = new Map<string, { name: string; version: string; digests: Set<string> }>();
    for (const [ref, digest] of asked) {
      const { name, version } = parsePackageRef(ref);
      if (version === undefined) throw new RunnerDepotError("BAD_REQUEST", `${ref} names no version`);
      const key = `${name}@${version}`;
      versionOf.push(key);
      const entry = wanted.get(key) ?? { name, version, digests: new Set<string>() };
      entry.digests.add(digest);
      wanted.set(key, entry);
    }
    if (wanted.size > BLOBS_VERSIONS)
      throw new RunnerDepotError("BAD_REQUEST", `blobs may name at most ${BLOBS_VERSIONS} versions`);
    // Each version's manifest read once: the sizes of the blobs asked of it (only those are kept).
    const held = new Map<string, Map<string, number>>();
    for (const [key, { name, version, digests }] of wanted) {
      if (!(await mayRead(name))) throw new RunnerDepotError("PERMISSION_DENIED", `This token may not read ${name}`);
      const record = await context.publishedVersion(name, version);
      const manifest = (await readVersionManifest<PackageManifest>(context.store, record)) ?? ({} as PackageManifest);
      const sizes = new Map<string, number>();
      for (const item of manifest.items ?? [])
        if (item.digest && digests.has(item.digest)) sizes.set(item.digest, item.size);
      for (const license of manifest.licenses ?? [])
        if (digests.has(license.digest)) sizes.set(license.digest, license.size);
      held.set(key, sizes);
    }
    let total = 0;
    for (const [i, [ref, digest]] of asked.entries()) {
      const size = held.get(versionOf[i]!)!.get(digest);
      if (size === undefined) throw new RunnerDepotError("DIGEST_UNKNOWN", `${ref} holds no blob ${digest}`);
      total += size;
    }
    if (total > BLOBS_BYTES)
      throw new RunnerDepotError(
        "TOO_LARGE",
        `These blobs are ${total} bytes; one answer carries at most ${BLOBS_BYTES}`,
      );
    const { store: blobs } = context;
    async function* concatenated(): AsyncGenerator<Uint8Array> {
      for (const [, digest] of asked) {
        const body = await blobs.getBlob(digest);
        if (!body) throw new RunnerDepotError("INTERNAL", `blob ${digest} is gone`);
        yield* body;
      }
    }
    return new Response(lazyWebStream(concatenated), {
      status: 200,
      headers: { "Content-Type": "application/octet-stream", "Content-Length": String(total) },
    });
  });
}

/** `read` on a package for this request, asked once per name. */
function readCheck(request: Request, context: RouterContext): (name: string) => Promise<boolean> {
  const answers = new Map<string, Promise<boolean>>();
  return (name) => {
    let answer = answers.get(name);
    if (!answer) {
      answer = context.referenceAccess(request).mayRead(name);
      answers.set(name, answer);
    }
    return answer;
  };
}

/** A blob's text; null when it is gone or longer than `maxBytes`, read no further than that. */
async function blobText(context: RouterContext, digest: string, maxBytes: number): Promise<string | null> {
  const read = await readBlobWithin(context.store, digest, maxBytes);
  return read === null || read === "over" ? null : read.toString("utf8");
}

/** JSON, gzip-compressed when the client accepts it (the mirror's fetch does). */
async function compressedJson(request: Request, body: unknown): Promise<Response> {
  const text = Buffer.from(JSON.stringify(body));
  const headers: Record<string, string> = { "Content-Type": "application/json", "Cache-Control": "no-store" };
  if (!/\bgzip\b/i.test(request.headers.get("accept-encoding") ?? "")) return new Response(text, { headers });
  const packed = await gzipped(text);
  return new Response(packed, { headers: { ...headers, "Content-Encoding": "gzip", Vary: "Accept-Encoding" } });
}

/** `{"blobs": [["name@version", "sha256:…"], …]}`: at most BLOBS_MAX pairs; BAD_REQUEST otherwise. */
function parseBlobList(bytes: Buffer): Array<[string, string]> {
  let body: { blobs?: unknown };
  try {
    body = JSON.parse(bytes.toString("utf8")) as { blobs?: unknown };
  } catch {
    throw new RunnerDepotError("BAD_REQUEST", "the body is not JSON");
  }
  const list = body?.blobs;
  if (!Array.isArray(list) || list.length === 0 || list.length > BLOBS_MAX)
    throw new RunnerDepotError("BAD_REQUEST", `blobs must list 1 to ${BLOBS_MAX} [ref, digest] pairs`);
  return list.map((pair: unknown) => {
    if (
      !Array.isArray(pair) ||
      pair.length !== 2 ||
      typeof pair[0] !== "string" ||
      pair[0].length > 512 ||
      typeof pair[1] !== "string" ||
      !/^sha256:[0-9a-f]{64}$/.test(pair[1])
    )
      throw new RunnerDepotError("BAD_REQUEST", 'each blob is ["name@version", "sha256:<hex>"]');
    return [pair[0], pair[1]] as [string, string];
  });
}
