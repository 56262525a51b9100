/**
 * Who may do what, and what a request may see: the router's use of the host's `authorize`
 * hook, and the reads that decide whether a package or version is visible (published).
 */
import type { IRequest } from "itty-router";
import { RunnerDepotError } from "../../errors.js";
import type { Logger } from "../../telemetry.js";
import type { ReferenceAccess } from "../transactions/additions.js";
import type { Authorize, DepotAction } from "./auth.js";
import { readPackage, type PackageRecord } from "../catalog/packages.js";
import type { PackageStore } from "../ports.js";
import { keys, type VersionRecord } from "../store/records.js";
import { routeOf } from "./route-label.js";
import { yankReason } from "../catalog/yank.js";

/** The access checks of one router. */
export interface RouterAccess {
  /** The request's principal for `action` (on `name`), a refusal logged on the way. */
  principalOf(request: Request, action: DepotAction, name?: string): Promise<string>;
  /** What a reference by digest may read: the request's own read permission, package by package. */
  referenceAccess(request: Request): ReferenceAccess;
  /** A visible package's record (one read, whatever the number of packages); PACKAGE_NOT_FOUND. */
  visiblePackage(name: string): Promise<PackageRecord>;
  /** A published version's record: listed in its package's record (the visibility point) and stored. Two reads. */
  publishedVersion(name: string, version: string | undefined): Promise<VersionRecord>;
  /** Several published versions of one package (the package's record read once). */
  publishedVersions(name: string, versions: ReadonlyArray<string | undefined>): Promise<VersionRecord[]>;
  /** A published version and, when it is yanked, the reason (the package's record read once). */
  publishedVersionYank(name: string, version: string | undefined): Promise<{ record: VersionRecord; yanked?: string }>;
}

/**
 * The access checks over `store` with the host's hook (none: everything is open).
 *
 * @example
 * const access = createRouterAccess({ store, log, base: "/depot", authorize: bearerTokens({ [token]: ["*"] }) });
 * const principal = await access.principalOf(request, "publish", "toolchain");
 */
export function createRouterAccess(settings: {
  store: PackageStore;
  log: Logger;
  base: string;
  authorize: Authorize | undefined;
}): RouterAccess {
  const { store, log, base, authorize } = settings;

  async function authorized(request: Request, action: DepotAction, name?: string): Promise<string> {
    if (!authorize) return "anonymous";
    const verdict = await authorize(request, { action, name });
    if (verdict === false)
      throw new RunnerDepotError("PERMISSION_DENIED", `Not allowed to ${action}${name ? ` ${name}` : ""}`);
    return typeof verdict === "string" ? verdict : "anonymous";
  }

  /**
   * The request's principal, a refusal logged on the way. The line names the action, the
   * package and the error code only: never a header, a token or the hook's own message
   * (a host hook might quote what it was given).
   */
  async function principalOf(request: Request, action: DepotAction, name?: string): Promise<string> {
    try {
      return await authorized(request, action, name);
    } catch (error) {
      if (error instanceof RunnerDepotError && (error.status === 401 || error.status === 403)) {
        log.warn(
          { action, name, code: error.code, method: request.method, route: routeOf(request as IRequest, base) },
          "auth refused",
        );
      }
      throw error;
    }
  }

  /** What a reference by digest may read: the request's own read permission, package by package. */
  function referenceAccess(request: Request): ReferenceAccess {
    return {
      // A probe, not a refusal worth a line: the addition just uploads its bytes instead.
      mayRead: (name) =>
        authorized(request, "read", name).then(
          () => true,
          (error: unknown) => {
            if (error instanceof RunnerDepotError && (error.status === 401 || error.status === 403)) return false;
            throw error;
          },
        ),
    };
  }

  /** A visible package's record (one read, whatever the number of packages); PACKAGE_NOT_FOUND. */
  async function visiblePackage(name: string): Promise<PackageRecord> {
    const listed = await readPackage(store, name);
    if (!listed) throw new RunnerDepotError("PACKAGE_NOT_FOUND", `No package ${name}`);
    return listed;
  }

  /** A published version's record: listed in its package's record (the visibility point) and stored. Two reads. */
  async function publishedVersion(name: string, version: string | undefined): Promise<VersionRecord> {
    return (await publishedVersions(name, [version]))[0]!;
  }

  /** Published versions of one package: its record read once, then each version's. */
  async function publishedVersions(
    name: string,
    versions: ReadonlyArray<string | undefined>,
  ): Promise<VersionRecord[]> {
    return versionsOf(await visiblePackage(name), versions);
  }

  async function publishedVersionYank(name: string, version: string | undefined) {
    const listed = await visiblePackage(name);
    const [record] = await versionsOf(listed, [version]);
    const yanked = yankReason(listed, record!.version);
    return yanked === undefined ? { record: record! } : { record: record!, yanked };
  }

  /** The records of `versions` of a listed package; no version means the newest not yanked. */
  async function versionsOf(listed: PackageRecord, versions: ReadonlyArray<string | undefined>) {
    const name = listed.name;
    return Promise.all(
      versions.map(async (version) => {
        if (version === undefined && yankReason(listed, listed.latest) !== undefined)
          throw new RunnerDepotError("VERSION_NOT_FOUND", `Every version of ${name} is yanked; ask for one by version`);
        const wanted = version ?? listed.latest;
        if (!listed.versions.includes(wanted))
          throw new RunnerDepotError("VERSION_NOT_FOUND", `No version ${wanted} of ${name}`);
        const record = await store.getRecord<VersionRecord>(keys.version(name, wanted));
        if (!record) throw new RunnerDepotError("VERSION_NOT_FOUND", `No version ${wanted} of ${name}`);
        return record.value;
      }),
    );
  }

  return { principalOf, referenceAccess, visiblePackage, publishedVersion, publishedVersions, publishedVersionYank };
}
