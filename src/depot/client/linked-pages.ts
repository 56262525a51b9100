/** A `Link: rel="next"` chain of JSON pages read with bounds (`/catalog` and `/version` both page this way). */
import { RunnerDepotError } from "../../errors.js";
import { parseJson } from "./body.js";
import type { DepotConnection } from "./connection.js";

/**
 * GETs `relative` and every page its `Link: rel="next"` chain leads to: at most
 * `maxCatalogPages` pages and `maxCatalogBytes` in all (each page within `maxJsonBytes`), no
 * page twice. Null on a 304 to `etag`; `etag` of the result is the first answer's.
 *
 * @example
 * const walk = await readLinkedPages<VersionInfo>(connection, "version/tool", "GET /version/tool");
 */
export async function readLinkedPages<T>(
  connection: DepotConnection,
  relative: string,
  what: string,
  etag?: string,
): Promise<{ etag: string | null; pages: T[] } | null> {
  const { url, call, limits } = connection;
  const pages: T[] = [];
  let firstEtag: string | null = null;
  let next: string | null = url(relative);
  const seen = new Set<string>();
  let bytes = 0;
  for (let n = 0; next !== null; n++) {
    if (n >= limits.maxCatalogPages || seen.has(next)) {
      throw new RunnerDepotError(
        "TOO_LARGE",
        n >= limits.maxCatalogPages
          ? `${what}: more than ${limits.maxCatalogPages} pages (maxCatalogPages)`
          : `${what}: the next link leads back to ${next}`,
      );
    }
    seen.add(next);
    const headers: Record<string, string> = n === 0 && etag ? { "if-none-match": etag } : {};
    const response: Response = await call("GET", next, { headers });
    if (response.status === 304 && n === 0) {
      await response.body?.cancel();
      return null;
    }
    if (!response.ok) throw await connection.error(response, what);
    if (n === 0) firstEtag = response.headers.get("etag");
    const left = limits.maxCatalogBytes - bytes;
    const body = await connection
      .readBytes(response, what, Math.min(limits.maxJsonBytes, left))
      .catch((error: unknown) => {
        if (!(error instanceof RunnerDepotError) || error.code !== "TOO_LARGE" || left >= limits.maxJsonBytes)
          throw error;
        throw new RunnerDepotError(
          "TOO_LARGE",
          `${what}: the pages hold more than ${limits.maxCatalogBytes} bytes (maxCatalogBytes)`,
        );
      });
    bytes += body.byteLength;
    pages.push(parseJson<T>(body, what));
    const link = /<([^>]*)>\s*;\s*rel="?next"?/.exec(response.headers.get("link") ?? "");
    next = link ? new URL(link[1]!, next).href : null;
  }
  return { etag: firstEtag, pages };
}
