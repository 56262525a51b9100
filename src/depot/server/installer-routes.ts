/**
 * The installer API of the depot router (docs/depot-api.md §Installer API): the catalog,
 * a package's versions and dependencies, and the archives and deltas, each read checked
 * against the request's `read` permission.
 */
import type { Span } from "@opentelemetry/api";
import type { IRequest } from "itty-router";
import { isRunnerDepotError, RunnerDepotError } from "../../errors.js";
import { traceContextOf } from "../../telemetry.js";
import { matchesEtag, serveBytes, type ByteSource } from "./blob-response.js";
import { answerCatalog, catalogEtag, catalogFloor, parseCatalogQuery } from "../catalog/catalog-route.js";
import { catalogHead } from "../catalog/head.js";
import { decodeSegment, parsePackageName, parsePackageRef, parseVersion } from "../package/names.js";
import { failSpan } from "./telemetry.js";
import { json } from "./problem-response.js";
import type { VersionRecord } from "../store/records.js";
import { parseVersionQuery, versionPage } from "./version-page.js";
import { routeOf } from "./route-label.js";
import { getAndHead, type RouterContext } from "./router-context.js";

/** Registers the installer routes (GET and HEAD each) on `context.router`. */
export function registerInstallerRoutes(context: RouterContext): void {
  const {
    router,
    store,
    base,
    telemetry,
    archives,
    principalOf,
    visiblePackage,
    publishedVersionYank,
    publishedVersions,
  } = context;

  const catalogHandler = async (request: IRequest) => {
    await principalOf(request, "read");
    const query = parseCatalogQuery(new URL(request.url).searchParams);
    const { storeId } = await context.storeFormat();
    // The ETag is the sequence head, held in memory (depot/catalog/head.ts): a 304 reads nothing.
    const head = await catalogHead(
      store,
      context.now,
      catalogFloor(query, request.headers.get("if-none-match"), storeId),
    );
    const etag = catalogEtag(storeId, head);
    const headers: Record<string, string> = { ETag: etag, "Cache-Control": "no-cache" };
    if (matchesEtag(request.headers.get("if-none-match"), etag)) return new Response(null, { status: 304, headers });
    const answer = await answerCatalog(store, query, head);
    if (answer.next) headers.Link = `<${base}/catalog?${answer.next}>; rel="next"`;
    return new Response(JSON.stringify(answer.body), {
      status: 200,
      headers: { ...headers, "Content-Type": "application/json" },
    });
  };
  getAndHead(router, "/catalog", catalogHandler);

  /**
   * `answer()`, and on a miss (no such package or version here) with an upstream: one pull of
   * `name@version` and `answer()` again. Without an upstream, or when it lacks the version, the miss stands.
   */
  async function orPull<T>(name: string, version: string | undefined, principal: string, answer: () => Promise<T>) {
    try {
      return await answer();
    } catch (error) {
      const miss =
        isRunnerDepotError(error) && (error.code === "PACKAGE_NOT_FOUND" || error.code === "VERSION_NOT_FOUND");
      if (!miss || !context.pull || !(await context.pull(name, version, principal))) throw error;
      return answer();
    }
  }

  getAndHead(router, "/version/:pkg", async (request) => {
    const ref = parsePackageRef(request.params.pkg!);
    const principal = await principalOf(request, "read", ref.name);
    return orPull(ref.name, ref.version, principal, () => versionAnswer(ref, request));
  });

  async function versionAnswer(ref: { name: string; version?: string }, request: IRequest): Promise<Response> {
    const listed = await visiblePackage(ref.name);
    if (ref.version && !listed.versions.includes(ref.version))
      throw new RunnerDepotError("VERSION_NOT_FOUND", `No version ${ref.version} of ${ref.name}`);
    // Paged (issue 30 item 4): a first answer is what it always was, but bounded in count and bytes.
    const query = ref.version ? { limit: 1 } : parseVersionQuery(new URL(request.url).searchParams);
    const page = await versionPage(
      store,
      ref.name,
      ref.version ? [ref.version] : listed.versions,
      query,
      listed.yanked,
    );
    const headers: Record<string, string> = {};
    if (page.next !== undefined)
      headers.Link = `<${base}/version/${ref.name}?limit=${query.limit}&after=${encodeURIComponent(page.next)}>; rel="next"`;
    return json(200, { name: ref.name, latest: listed.latest, versions: page.entries }, headers);
  }

  getAndHead(router, "/depend/:pkg", async (request) => {
    const ref = parsePackageRef(request.params.pkg!);
    const principal = await principalOf(request, "read", ref.name);
    const { record: v, yanked } = await orPull(ref.name, ref.version, principal, () =>
      publishedVersionYank(ref.name, ref.version),
    );
    return json(200, { name: v.name, version: v.version, requires: v.requires }, yankHeaders(yanked));
  });

  const dataHandler = (request: IRequest) =>
    download(request, async (span) => {
      const ref = parsePackageRef(request.params.pkg!);
      const principal = await principalOf(request, "read", ref.name);
      const { record: v, yanked } = await orPull(ref.name, ref.version, principal, () =>
        publishedVersionYank(ref.name, ref.version),
      );
      // No attributes object when nothing records (no provider): the library's default path.
      if (span.isRecording()) span.setAttributes({ "depot.package": v.name, "depot.version": v.version });
      if (request.method === "GET") context.downloaded(v.name, v.version);
      return {
        source: await archives.version(v),
        filename: `${v.name}-${v.version}.tar`,
        headers: yankHeaders(yanked),
      };
    });
  getAndHead(router, "/data/:pkg", dataHandler);

  const deltaRedirect = async (request: IRequest) => {
    const name = parsePlainName(request.params.pkg!);
    await principalOf(request, "read", name);
    const from = parseVersion(decodeSegment(request.params.from!));
    const listed = await visiblePackage(name);
    if (!listed.versions.includes(from))
      throw new RunnerDepotError("VERSION_NOT_FOUND", `No version ${from} of ${name}`);
    return new Response(null, {
      status: 307,
      headers: { Location: `${base}/data/${name}/${from}/${listed.latest}`, "Cache-Control": "no-cache" },
    });
  };
  getAndHead(router, "/data/:pkg/:from", deltaRedirect);

  const deltaHandler = (request: IRequest) =>
    download(request, async (span) => {
      const name = parsePlainName(request.params.pkg!);
      await principalOf(request, "read", name);
      const fromVersion = parseVersion(decodeSegment(request.params.from!));
      const toVersion = parseVersion(decodeSegment(request.params.to!));
      const [from, to] = (await publishedVersions(name, [fromVersion, toVersion])) as [VersionRecord, VersionRecord];
      if (request.method === "GET") context.downloaded(name, to.version);
      if (span.isRecording())
        span.setAttributes({ "depot.package": name, "depot.version": to.version, "depot.from_version": from.version });
      // A HEAD hashes nothing (issue 30 item 1): it gets the digest only if a GET already computed it.
      const source = await archives.delta(from, to, { digest: request.method !== "HEAD" });
      return { source, filename: `${name}-${from.version}-to-${to.version}.tar` };
    });

  /**
   * A download under a `depot.download` span (its parent from the request's trace
   * context) that ends when the body has been read to its end or cut, or at once when
   * the answer has no body (HEAD, 304, a redirect, 416). Bytes sent count once per body.
   */
  async function download(
    request: IRequest,
    load: (span: Span) => Promise<{ source: ByteSource; filename: string; headers?: Record<string, string> }>,
  ): Promise<Response> {
    const route = routeOf(request, base);
    const span = telemetry.startSpan("depot.download", traceContextOf(request.headers), {
      "http.route": route,
      "http.request.method": request.method,
    });
    try {
      const { source, filename, headers } = await load(span);
      const response = await serveBytes(
        request,
        countedSource(source, (bytes) => {
          telemetry.bytesSent(bytes);
          span.setAttribute("depot.bytes_sent", bytes);
          span.end();
        }),
        filename,
      );
      for (const [header, value] of Object.entries(headers ?? {})) response.headers.set(header, value);
      span.setAttribute("http.response.status_code", response.status);
      if (response.body === null || (response.status !== 200 && response.status !== 206)) span.end();
      return response;
    } catch (error) {
      failSpan(span, error);
      throw error;
    }
  }
  getAndHead(router, "/data/:pkg/:from/:to", deltaHandler);
}

/** `Pkg-Yanked: <reason, percent-encoded>` on an answer about a yanked version (docs/depot-api.md §Yank). */
function yankHeaders(reason: string | undefined): Record<string, string> {
  return reason === undefined ? {} : { "Pkg-Yanked": encodeURIComponent(reason) };
}

/** `source` with its bytes counted: `done(bytes)` once, when a read ends or is cut. */
function countedSource(source: ByteSource, done: (bytes: number) => void): ByteSource {
  let reported = false;
  // `options` passes through: a Node host asks for borrowed chunks (depot/store/blob-chunks.ts), and
  // dropping it would put every download back on the allocating read stream.
  async function* read(
    range?: Parameters<ByteSource["read"]>[0],
    options?: Parameters<ByteSource["read"]>[1],
  ): AsyncGenerator<Uint8Array> {
    let bytes = 0;
    try {
      for await (const chunk of source.read(range, options)) {
        bytes += chunk.byteLength;
        yield chunk;
      }
    } finally {
      if (!reported) {
        reported = true;
        done(bytes);
      }
    }
  }
  const counted: ByteSource = { digest: source.digest, size: source.size, read };
  if (source.signedUrl) counted.signedUrl = source.signedUrl.bind(source);
  return counted;
}

/** The package segment of a delta path: a plain name, no `@version`. */
function parsePlainName(segment: string): string {
  const decoded = decodeSegment(segment);
  if (decoded.includes("@"))
    throw new RunnerDepotError("BAD_REQUEST", "Delta paths take a plain package name: /data/<name>/<from>[/<to>]");
  return parsePackageName(decoded);
}
