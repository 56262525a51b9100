/**
 * The label the depot router puts on a request in its metrics and log lines: the route
 * pattern, so the label set stays bounded whatever paths clients send.
 */
import type { IRequest } from "itty-router";

/**
 * The route pattern a request matched, below the base (`/data/:pkg`): a bounded label,
 * never the raw path. `other` for no route (404, a refusal before routing).
 */
export function routeOf(request: IRequest, base: string): string {
  const route = typeof request.route === "string" ? request.route : undefined;
  if (route === undefined || route === "*" || route === `${base}*` || route === `${base}/*`) return "other";
  return route.startsWith(base) ? route.slice(base.length) || "/" : route;
}
