/**
 * The depot client's catalog: every page of `GET /catalog` merged, then kept current by
 * asking only for the changes since its position, with the last ETag (a 304 costs nothing).
 */
import { RunnerDepotError } from "../../errors.js";
import { parseJson } from "./body.js";
import type { DepotConnection } from "./connection.js";
import type { Catalog } from "./types.js";

/** One answer of `GET /catalog` (a page, or the changes since a position). */
interface CatalogPage {
  packages: Catalog["packages"];
  count: number;
  position?: number;
  updatedAt: string | null;
}

/**
 * The `catalog()` of one client: its cache lives as long as the returned function.
 *
 * @example
 * const catalog = createCatalogReader(createDepotConnection({ baseUrl }));
 * const { packages } = await catalog(); // later calls ask only `?since=` the position
 */
export function createCatalogReader(connection: DepotConnection): () => Promise<Catalog> {
  const { url, call, limits } = connection;
  let cachedCatalog: { etag: string; body: Catalog } | null = null;

  /**
   * GETs a catalog URL and every page its `Link: rel="next"` chain leads to (at most
   * `maxCatalogPages` pages of `maxCatalogBytes` in all, no page twice); null on a 304 to
   * `etag`. The ETag is the first answer's.
   */
  const catalogPages = async (
    relative: string,
    etag?: string,
  ): Promise<{ etag: string | null; pages: CatalogPage[] } | null> => {
    const pages: CatalogPage[] = [];
    let firstEtag: string | null = null;
    let next: string | null = url(relative);
    const seen = new Set<string>();
    let bytes = 0;
    for (let n = 0; next !== null; n++) {
      if (n >= limits.maxCatalogPages || seen.has(next)) {
        throw new RunnerDepotError(
          "TOO_LARGE",
          n >= limits.maxCatalogPages
            ? `GET /catalog: more than ${limits.maxCatalogPages} pages (maxCatalogPages)`
            : `GET /catalog: the next link leads back to ${next}`,
        );
      }
      seen.add(next);
      const headers: Record<string, string> = n === 0 && etag ? { "if-none-match": etag } : {};
      const response: Response = await call("GET", next, { headers });
      if (response.status === 304 && n === 0) {
        await response.body?.cancel();
        return null;
      }
      if (!response.ok) throw await connection.error(response, "GET /catalog");
      if (n === 0) firstEtag = response.headers.get("etag");
      // Each page within maxJsonBytes, the walk as a whole within maxCatalogBytes.
      const left = limits.maxCatalogBytes - bytes;
      const body = await connection
        .readBytes(response, "GET /catalog", Math.min(limits.maxJsonBytes, left))
        .catch((error: unknown) => {
          if (!(error instanceof RunnerDepotError) || error.code !== "TOO_LARGE" || left >= limits.maxJsonBytes)
            throw error;
          throw new RunnerDepotError(
            "TOO_LARGE",
            `GET /catalog: the pages hold more than ${limits.maxCatalogBytes} bytes (maxCatalogBytes)`,
          );
        });
      bytes += body.byteLength;
      pages.push(parseJson<CatalogPage>(body, "GET /catalog"));
      const link = /<([^>]*)>\s*;\s*rel="?next"?/.exec(response.headers.get("link") ?? "");
      next = link ? new URL(link[1]!, next).href : null;
    }
    return { etag: firstEtag, pages };
  };

  return async function catalog() {
    // Cached: ask only for what changed since (one cheap 304 when nothing did).
    if (cachedCatalog?.body.position !== undefined) {
      const since = await catalogPages(`catalog?since=${cachedCatalog.body.position}`, cachedCatalog.etag);
      if (since === null) return cachedCatalog.body;
      const packages: Catalog["packages"] = { ...cachedCatalog.body.packages };
      for (const page of since.pages) Object.assign(packages, page.packages);
      const last = since.pages.at(-1)!;
      const body: Catalog = {
        packages,
        count: Object.keys(packages).length,
        position: last.position,
        updatedAt: last.updatedAt ?? cachedCatalog.body.updatedAt,
      };
      cachedCatalog = since.etag ? { etag: since.etag, body } : null;
      return body;
    }
    const walk = await catalogPages("catalog", cachedCatalog?.etag);
    if (walk === null) return cachedCatalog!.body;
    const packages: Catalog["packages"] = {};
    for (const page of walk.pages) Object.assign(packages, page.packages);
    // The first page's position: changes made during the walk come with the next `since`.
    const first = walk.pages[0]!;
    const body: Catalog = {
      packages,
      count: Object.keys(packages).length,
      position: first.position,
      updatedAt: first.updatedAt,
    };
    cachedCatalog = walk.etag ? { etag: walk.etag, body } : null;
    return body;
  };
}
