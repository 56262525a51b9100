/**
 * What the depot router's route modules (depot/server/installer-routes.ts, depot/server/packager-routes.ts) share:
 * one object built per router by createPackageRouter, so each module registers its routes
 * without reaching back into depot/server/router.ts (no import cycle).
 */
import type { IRequest, RouterType } from "itty-router";
import type { Logger } from "../../telemetry.js";
import type { Additions } from "../transactions/additions.js";
import type { ArchiveSources } from "./archive-source.js";
import type { Authorize } from "./auth.js";
import type { Commits } from "../transactions/commit.js";
import type { FormatRecord } from "../store/format.js";
import type { DepotTelemetry } from "./telemetry.js";
import type { PackageStore } from "../ports.js";
import type { RouterAccess } from "./access.js";
import type { Transactions } from "../transactions/lifecycle.js";

/** The router's state and services, as its route handlers see them. */
export interface RouterContext extends RouterAccess {
  readonly router: RouterType<IRequest, []>;
  /** The store with every call timed (depot.store.duration); `depot.store` stays the host's object. */
  readonly store: PackageStore;
  /** Path prefix the router is mounted under, without a trailing slash. */
  readonly base: string;
  readonly authorize: Authorize | undefined;
  readonly now: () => Date;
  readonly telemetry: DepotTelemetry;
  readonly log: Logger;
  readonly transactions: Transactions;
  readonly additions: Additions;
  readonly commits: Commits;
  readonly archives: ArchiveSources;
  /** The store's format record; the router's before-hook has opened it by the time a handler runs. */
  storeFormat(): Promise<FormatRecord>;
  /** A URL for a path below the base: absolute under `publicUrl`, else relative. */
  linkTo(location: string): string;
  /**
   * Pull-through (router option `upstream`): copies `name@version` from the upstream on a read miss;
   * true when the store now holds it. Absent without an upstream.
   */
  pull?(name: string, version: string | undefined, principal: string): Promise<boolean>;
  /** Notes a GET of a published version's archive (depot/store/downloads.ts: at most a write per version per hour). */
  downloaded(name: string, version: string): void;
  /** Called once per version a commit publishes (the first answer, not a repeat): the provenance hook. */
  published?(name: string, version: string, principal: string): Promise<void>;
}

/** Registers a GET handler and the same handler for HEAD (RFC 9110: HEAD wherever GET works). */
export function getAndHead(
  router: RouterType<IRequest, []>,
  path: string,
  handler: (request: IRequest) => Promise<Response>,
): void {
  router.get(path, handler);
  router.head(path, handler);
}
