/**
 * The depot client's catalog: every page of `GET /catalog` merged, then kept current by
 * asking only for the changes since its position, with the last ETag (a 304 costs nothing).
 */
import type { DepotConnection } from "./connection.js";
import { readLinkedPages } from "./linked-pages.js";
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
  let cachedCatalog: { etag: string; body: Catalog } | null = null;

  const catalogPages = (relative: string, etag?: string) =>
    readLinkedPages<CatalogPage>(connection, relative, "GET /catalog", etag);

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
