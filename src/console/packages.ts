/**
 * The console's package endpoints, written against the depot's HTTP API (the router's
 * `fetch`, called in-process) rather than its store, so the console follows the depot's
 * contract as it evolves: the catalog in pages (the depot's `limit`/`after` and
 * `Link: rel="next"` when it pages, paged here when it answers whole), a package's
 * versions (`/version`), a version's requirements (`/depend`) and its files and licences
 * (the manifest, the first entry of `/data/<name>@<version>`; only that entry is read).
 */
import { createTarDecoder } from "modern-tar";
import { RunnerDepotError } from "../errors.js";
import { parsePackageName, parsePackageRef } from "../depot/package/names.js";
import type { PackageManifest } from "../depot/package/archive.js";
import { intParam, json } from "./responses.js";

/** What the console needs of a depot: the router's fetch. */
export interface ConsoleDepot {
  fetch(request: Request): Promise<Response> | Response;
}

/** Options of the package endpoints. */
interface PackageEndpointOptions {
  depot: ConsoleDepot;
  /** The path the depot router answers under (its `base`), e.g. "" or "/depot". */
  depotBase: string;
  /** Headers sent with every depot request (e.g. a read token). */
  depotHeaders: Record<string, string>;
  /** Packages examined when looking for dependants. */
  dependantScan: number;
  /** Packages asked of the depot per catalog page. */
  catalogPageSize: number;
}

interface DependantIndex {
  etag: string;
  complete: boolean;
  byName: Map<string, Set<string>>;
}

interface CatalogEntry {
  latest: string;
  versions: string[];
  updatedAt?: string;
}

/** Depot catalog pages read per console request while a filter finds few matches. */
const MAX_DEPOT_PAGES = 5;
/** Largest manifest read from an archive (a 10,000-item package is about 2 MiB). */
const MAX_MANIFEST_BYTES = 32 * 1024 * 1024;
/** Items listed per version (more are counted, not listed). */
const MAX_ITEMS = 10_000;

/** Builds the package endpoints over a depot. */
export function createPackageEndpoints(options: PackageEndpointOptions) {
  const { depot, depotBase, depotHeaders } = options;
  /** Dependants by required name, built from one catalog state (its ETag). */
  let dependants: DependantIndex | null = null;
  let building: Promise<DependantIndex> | null = null;

  async function call(path: string, origin: string, init: { method?: string } = {}): Promise<Response> {
    const request = new Request(`${origin}${depotBase}${path}`, {
      method: init.method ?? "GET",
      headers: { ...depotHeaders },
      redirect: "manual",
    });
    return depot.fetch(request);
  }

  async function readJson<T>(response: Response): Promise<T> {
    if (!response.ok) {
      const body = (await response.json().catch(() => null)) as { code?: string; detail?: string } | null;
      const code =
        body?.code && /^[A-Z_]+$/.test(body.code) ? body.code : response.status === 404 ? "NOT_FOUND" : "UNAVAILABLE";
      throw new RunnerDepotError(code as "NOT_FOUND", body?.detail ?? `depot answered ${response.status}`);
    }
    return (await response.json()) as T;
  }

  /** One depot catalog page: its packages and the `after` of the next, if the depot pages. */
  async function catalogPage(origin: string, after: string | null, limit: number) {
    const query = new URLSearchParams({ limit: String(limit) });
    if (after) query.set("after", after);
    const response = await call(`/catalog?${query}`, origin);
    const body = await readJson<{ packages: Record<string, CatalogEntry> }>(response);
    let next: string | null = null;
    const link = response.headers.get("link");
    const match = link ? /<([^>]*)>\s*;\s*rel="?next"?/.exec(link) : null;
    if (match) next = new URL(match[1]!, "http://x").searchParams.get("after");
    return { packages: body.packages ?? {}, next, etag: response.headers.get("etag") ?? "" };
  }

  return {
    /** GET api/packages?q=&cursor=&limit= — one page of the catalog, filtered by a name substring. */
    async list(url: URL): Promise<Response> {
      const limit = intParam(url, "limit", 50, 1, 500);
      const q = (url.searchParams.get("q") ?? "").toLowerCase().slice(0, 64);
      let state = decodeCursor(url.searchParams.get("cursor"));
      const out: Array<{ name: string } & CatalogEntry> = [];
      for (let pages = 0; pages < MAX_DEPOT_PAGES; pages++) {
        const page = await catalogPage(url.origin, state.d, Math.max(limit, options.catalogPageSize));
        const names = Object.keys(page.packages)
          .filter((n) => n > state.n)
          .sort();
        for (const name of names) {
          if (q && !name.includes(q)) continue;
          out.push({ name, ...page.packages[name]! });
          if (out.length === limit) {
            const more = name !== names[names.length - 1] || page.next !== null;
            return json({ packages: out, next: more ? encodeCursor({ d: state.d, n: name }) : null });
          }
        }
        if (page.next === null) return json({ packages: out, next: null });
        state = { d: page.next, n: "" };
      }
      // The filter matched few of the pages read: the browser asks for more.
      return json({ packages: out, next: encodeCursor(state) });
    },

    /** GET api/packages/:name — versions, the newest's requirements, dependants. */
    async get(rawName: string, url: URL): Promise<Response> {
      const name = parsePackageName(rawName);
      const info = await readJson<{ name: string; latest: string; versions: unknown[] }>(
        await call(`/version/${encodeURIComponent(name)}`, url.origin),
      );
      const index = await dependantIndex(url.origin);
      return json({
        ...info,
        dependants: [...(index.byName.get(name) ?? [])].sort(),
        dependantsComplete: index.complete,
        depotUrl: `${url.origin}${depotBase}`,
      });
    },

    /** GET api/packages/:name/:version — requirements, licences and files of one version. */
    async version(rawName: string, rawVersion: string, url: URL): Promise<Response> {
      const ref = parsePackageRef(`${rawName}@${rawVersion}`);
      const spec = `${ref.name}@${ref.version}`;
      const dependAnswer = await call(`/depend/${encodeURIComponent(spec)}`, url.origin);
      const depend = await readJson<{ requires: Array<{ name: string; range: string }> }>(dependAnswer);
      // A yanked version's answers carry its reason (issue 27), percent-encoded.
      const yankHeader = dependAnswer.headers.get("pkg-yanked");
      let yanked: string | undefined;
      try {
        yanked = yankHeader === null ? undefined : decodeURIComponent(yankHeader);
      } catch {
        yanked = yankHeader ?? undefined;
      }
      const manifest = await readManifest(spec, url.origin);
      const items = manifest.items
        .slice(0, MAX_ITEMS)
        .map((i) => ({ type: i.type, path: i.path, mode: i.mode, size: i.size, target: i.target }));
      // The jobs whose provenance the version carries (a depot before issue 26 has no such route).
      const attested = await call(`/attestations/${encodeURIComponent(spec)}`, url.origin);
      const builtBy = attested.ok
        ? (
            await readJson<{ attestations: Array<{ requestId?: string; builderId?: string }> }>(attested)
          ).attestations.flatMap((a) => (a.requestId ? [{ requestId: a.requestId, builderId: a.builderId ?? "" }] : []))
        : (await attested.body?.cancel(), []);
      return json({
        name: ref.name,
        version: ref.version,
        builtBy,
        publishedAt: manifest.publishedAt,
        attributes: manifest.attributes,
        requires: depend.requires,
        licenses: manifest.licenses.map((l) => ({ name: l.name, size: l.size })),
        items,
        itemCount: manifest.items.length,
        ...(yanked !== undefined ? { yanked } : {}),
      });
    },
  };

  /** Reads `.pkg/manifest.json`, the archive's first entry, and stops there. */
  async function readManifest(spec: string, origin: string): Promise<PackageManifest> {
    let response = await call(`/data/${encodeURIComponent(spec)}`, origin);
    // A store that signs URLs answers with a redirect to its blob.
    const location = response.headers.get("location");
    if (response.status === 302 && location) response = await fetch(location);
    if (!response.ok || !response.body) await readJson(response);
    const reader = (response.body as ReadableStream<Uint8Array>)
      .pipeThrough(createTarDecoder({ strict: true }))
      .getReader();
    try {
      const first = await reader.read().catch((error: unknown) => {
        throw new RunnerDepotError("ARCHIVE_INVALID", "unreadable archive", { cause: error });
      });
      if (first.done) throw new RunnerDepotError("ARCHIVE_INVALID", "empty archive");
      const { header, body } = first.value;
      if (header.name !== ".pkg/manifest.json" || header.size > MAX_MANIFEST_BYTES)
        throw new RunnerDepotError("ARCHIVE_INVALID", "the archive does not start with a manifest of a readable size");
      const parts: Uint8Array[] = [];
      for await (const chunk of body as unknown as AsyncIterable<Uint8Array>) parts.push(chunk);
      try {
        return JSON.parse(Buffer.concat(parts).toString("utf8")) as PackageManifest;
      } catch (error) {
        throw new RunnerDepotError("ARCHIVE_INVALID", "unreadable manifest", { cause: error });
      }
    } finally {
      // Only the first entry was wanted: stop reading the archive.
      await reader.cancel().catch(() => undefined);
    }
  }

  /**
   * Which packages' newest versions require which names. The depot has no reverse index,
   * so this reads the catalog and one `/depend` per package, at most `dependantScan` of
   * them, and keeps the answer while the catalog's ETag stays the same.
   */
  async function dependantIndex(origin: string): Promise<DependantIndex> {
    const head = await call("/catalog", origin, { method: "HEAD" });
    const etag = head.headers.get("etag") ?? "";
    if (dependants && etag && dependants.etag === etag) return dependants;
    building ??= (async () => {
      const byName = new Map<string, Set<string>>();
      let seen = 0;
      let after: string | null = null;
      let complete = true;
      outer: for (;;) {
        const page = await catalogPage(origin, after, Math.max(options.catalogPageSize, 100));
        for (const [pkg, entry] of Object.entries(page.packages)) {
          if (seen++ >= options.dependantScan) {
            complete = false;
            break outer;
          }
          const depend = await readJson<{ requires: Array<{ name: string }> }>(
            await call(`/depend/${encodeURIComponent(`${pkg}@${entry.latest}`)}`, origin),
          ).catch(() => null);
          for (const req of depend?.requires ?? []) {
            let set = byName.get(req.name);
            if (!set) byName.set(req.name, (set = new Set()));
            set.add(pkg);
          }
        }
        if (!page.next) break;
        after = page.next;
      }
      return { etag, complete, byName };
    })().finally(() => {
      building = null;
    });
    const built = await building;
    dependants = built;
    return built;
  }
}

/** The console's catalog cursor: the depot page it is in (`d`) and the last name shown (`n`). */
export function encodeCursor(state: { d: string | null; n: string }): string {
  return Buffer.from(JSON.stringify(state), "utf8").toString("base64url");
}

export function decodeCursor(raw: string | null): { d: string | null; n: string } {
  if (!raw) return { d: null, n: "" };
  if (raw.length > 1024 || !/^[A-Za-z0-9_-]+$/.test(raw))
    throw new RunnerDepotError("INVALID_ARGUMENT", "malformed catalog cursor");
  try {
    const value = JSON.parse(Buffer.from(raw, "base64url").toString("utf8")) as { d?: unknown; n?: unknown };
    if ((value.d === null || typeof value.d === "string") && typeof value.n === "string" && value.n.length <= 64)
      return { d: value.d, n: value.n };
  } catch {
    // Falls through to the error below.
  }
  throw new RunnerDepotError("INVALID_ARGUMENT", "malformed catalog cursor");
}
