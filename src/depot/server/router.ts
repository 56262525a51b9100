/**
 * The depot's REST router (docs/depot-api.md, openapi.yaml): an itty-router v5 router whose `fetch(Request)`
 * answers the installer and packager APIs on top of any PackageStore. This file assembles it: the
 * checks before every route, the answers after, the 404/405 fallback, request metrics and garbage
 * collection. The routes themselves live in depot/server/installer-routes.ts and depot/server/packager-routes.ts.
 */
import { Router, type IRequest, type RouterType } from "itty-router";
import { RunnerDepotError } from "../../errors.js";
import type { Logger } from "../../telemetry.js";
import { createArchiveSources } from "./archive-source.js";
import type { Authorize } from "./auth.js";
import { Additions } from "../transactions/additions.js";
import { CachedOpenCount } from "../transactions/open-count.js";
import { Commits } from "../transactions/commit.js";
import { openStoreFormat, type FormatRecord } from "../store/format.js";
import { collectGarbage, type GarbageReport } from "../store/gc.js";
import { registerInstallerRoutes } from "./installer-routes.js";
import { DepotTelemetry, type DepotTelemetryOptions } from "./telemetry.js";
import { registerPackagerRoutes } from "./packager-routes.js";
import { registerAttestationRoutes } from "./attestation-routes.js";
import { registerMirrorRoutes } from "./mirror-routes.js";
import { loadTrustedKeys, type TrustedKeySet } from "../signing/keys.js";
import { attestProvenance, type ProvenanceOptions } from "../transactions/provenance.js";
import type { PackageStore } from "../ports.js";
import { problemResponse } from "./problem-response.js";
import { recoverDeadCommits } from "../transactions/recovery.js";
import { routeOf } from "./route-label.js";
import { createRouterAccess } from "./access.js";
import type { RouterContext } from "./router-context.js";
import { timeStore } from "../store/metrics.js";
import { PullThrough, type PullThroughOptions } from "../mirror/pull-through.js";
import type { QuotaOf } from "../store/quota.js";
import { DownloadClock } from "../store/downloads.js";
import { DEFAULT_LIMITS, Transactions, type DepotLimits } from "../transactions/lifecycle.js";

/**
 * Options of {@link createPackageRouter}. Telemetry (`logger`, `meterProvider`,
 * `tracerProvider`): docs/depot-api.md §Operations; silent and free without them.
 */
export interface PackageRouterOptions extends DepotTelemetryOptions {
  /** Path prefix the router is mounted under, e.g. `/depot`. */
  base?: string;
  /** Auth hook; without it everything is open (see servePackageRouter). */
  authorize?: Authorize;
  /** Limits; each defaults to docs/depot-api.md's figure (§11). */
  limits?: Partial<DepotLimits>;
  /** Idle expiry of a transaction, ms (default 24 h). */
  transactionIdleMs?: number;
  /** Absolute expiry of a transaction, ms (default 7 days). */
  transactionMaxAgeMs?: number;
  /** How long a finished transaction still answers (410/summary) before it is forgotten, ms (default 7 days). */
  transactionRetainMs?: number;
  /** A blob is deleted only after staying unreferenced this long across GC runs, ms (default 1 h). */
  gcGraceMs?: number;
  /** Lifetime of signed blob URLs, seconds (default 300). */
  signedUrlSeconds?: number;
  /** Deltas laid out or hashed at once (default 2); docs/depot-api.md §Deltas. */
  deltaBuilds?: number;
  /** Delta requests waiting for a build slot (default 16); more answer 503 TOO_MANY_DELTA_BUILDS with Retry-After. */
  deltaQueue?: number;
  /**
   * The absolute URL clients reach the router's base at (e.g. `https://depot.example.com/depot`),
   * used for the `url` of commit and summary answers. Without it those URLs are relative
   * (`<base>/data/<name>@<version>`): the request's `Host` header is never reflected.
   */
  publicUrl?: string;
  /**
   * The keys whose signatures `POST /attestations` takes (issue 26), with their validity
   * windows and revocations; without them every attestation is refused (KEY_UNTRUSTED).
   */
  trustedKeys?: TrustedKeySet;
  /** The largest attestation (a Sigstore bundle's JSON) taken, bytes (default 16 MiB). */
  maxAttestationBytes?: number;
  /**
   * The orchestrator's provenance (issue 26): when a job's own credentials commit a
   * version, a SLSA Provenance v1 statement signed with `key` is attached to it before the
   * commit answers. A failure to sign is logged; the version stays published.
   */
  provenance?: ProvenanceOptions;
  /**
   * Pull-through (issue 27 item 2): a read of an unknown package or version is answered from this
   * upstream depot, checked, stored here and served; what is held keeps being served while the
   * upstream is down. A version whose manifest breaks a publish rule or `limits` is not pulled (503
   * UPSTREAM_UNAVAILABLE, remembered `missTtlMs`). Bounds and who may trigger a pull: PullThroughOptions.
   */
  upstream?: PullThroughOptions;
  /**
   * Quotas (issue 27 item 5): each committing principal's bounds in archive bytes and versions (bearerTokens'
   * principals: `tokenPrincipal(token)`). With this option every commit counts in its principal's usage; one over
   * quota answers 413 QUOTA_EXCEEDED and writes nothing. A removal (retention) gives the room back.
   */
  quota?: QuotaOf;
  /** The clock (tests). */
  now?: () => Date;
  /**
   * Called with every unexpected (500) error; default: the `logger`'s error line, or console.error without a logger.
   */
  onError?: (error: unknown, request: Request) => void;
}

/** The depot router: an itty-router plus garbage collection. */
export type PackageRouter = RouterType<IRequest, []> & {
  /** Answers one request. */
  fetch(request: Request): Promise<Response>;
  /** Runs recovery, transaction expiry and blob collection once. */
  collectGarbage(): Promise<GarbageReport>;
  /**
   * Resolves once the work that goes on after an answer is done (a commit's index of
   * published bytes and the cleanup of its working records): await it before closing or
   * deleting the store. servePackageRouter's `close()` does.
   */
  idle(): Promise<void>;
  /** True when the router has no authorize hook (anyone may publish). */
  readonly isOpen: boolean;
  /** The store the router serves. */
  readonly store: PackageStore;
};

const ALLOW_ORDER = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"];

/**
 * Creates the depot router over a PackageStore.
 *
 * @example
 * const depot = createPackageRouter(createFsStore("/var/lib/depot"), { authorize: bearerTokens({ [token]: ["*"] }) });
 * const response = await depot.fetch(new Request("http://depot.local/catalog"));
 */
export function createPackageRouter(rawStore: PackageStore, options: PackageRouterOptions = {}): PackageRouter {
  const telemetry = new DepotTelemetry(options);
  const log: Logger = telemetry.logger;
  // Every store call of the router is timed (depot.store.duration); depot.store stays the host's object.
  const store = timeStore(rawStore, telemetry.storeDuration);
  const base = (options.base ?? "").replace(/\/+$/, "");
  const limits: DepotLimits = { ...DEFAULT_LIMITS, ...options.limits };
  const now = options.now ?? (() => new Date());
  const publicUrl = options.publicUrl === undefined ? undefined : parsePublicUrl(options.publicUrl);
  /** A URL for a path below the base: absolute under `publicUrl`, else relative. */
  const linkTo = (location: string) => (publicUrl === undefined ? `${base}${location}` : `${publicUrl}${location}`);
  const onError =
    options.onError ??
    (options.logger
      ? (error: unknown, request: Request) =>
          log.error({ err: error, method: request.method, route: routeOf(request as IRequest, base) }, "internal error")
      : (error: unknown) => console.error("runner-depot: internal error", error));
  const transactions = new Transactions(store, {
    limits,
    idleMs: options.transactionIdleMs ?? 24 * 3600_000,
    maxAgeMs: options.transactionMaxAgeMs ?? 7 * 24 * 3600_000,
    now,
  });
  telemetry.observeOpenTransactions(new CachedOpenCount(() => transactions.countOpen()));
  const commits = new Commits(store, transactions, options.quota);
  const downloads = new DownloadClock(store, now);
  let opened: Promise<FormatRecord> | undefined;

  const router = Router<IRequest, []>({
    base,
    before: [
      (request: IRequest) => {
        let bytes = 0;
        request.headers.forEach((value: string, name: string) => {
          bytes += name.length + value.length + 4;
        });
        if (bytes > limits.headerBytes) {
          throw new RunnerDepotError(
            "HEADERS_TOO_LARGE",
            `Request headers are ${bytes} bytes; at most ${limits.headerBytes} are accepted`,
          );
        }
      },
      async () => {
        // Once per router: check (or upgrade) the store format, then settle the commits a
        // killed process left `committing`.
        opened ??= openStoreFormat(store, now)
          .then(async (format) => {
            await recoverDeadCommits(store, transactions, now);
            return format;
          })
          .catch((error: unknown) => {
            opened = undefined;
            throw error;
          });
        await opened;
      },
    ],
    catch: (error: unknown, request: IRequest) => problemResponse(error, request, onError),
    finally: [
      // Requests outside `base` match no route at all.
      (response: unknown, request: IRequest) =>
        response ?? problemResponse(new RunnerDepotError("NOT_FOUND", "No such resource"), request, onError),
      // HEAD answers what GET would, without the body (JSON and problem bodies are small).
      async (response: Response, request: IRequest) => {
        if (request.method !== "HEAD" || response.body === null) return response;
        const length = (await response.arrayBuffer()).byteLength;
        const headers = new Headers(response.headers);
        headers.set("Content-Length", String(length));
        return new Response(null, { status: response.status, statusText: response.statusText, headers });
      },
    ],
  });

  const context: RouterContext = {
    ...createRouterAccess({ store, log, base, authorize: options.authorize }),
    router,
    store,
    base,
    authorize: options.authorize,
    now,
    telemetry,
    log,
    transactions,
    additions: new Additions(store, transactions),
    commits,
    archives: createArchiveSources(store, {
      signedUrlSeconds: options.signedUrlSeconds ?? 300,
      now,
      deltaBuilds: options.deltaBuilds,
      deltaQueue: options.deltaQueue,
    }),
    storeFormat: () => opened!,
    linkTo,
    downloaded: (name, version) => downloads.note(name, version),
  };
  if (options.upstream) {
    // A pulled version keeps the limits a publish here keeps.
    const pulls = new PullThrough(store, options.upstream, now, limits);
    context.pull = (name, version, principal) => pulls.pull(name, version, principal);
  }
  const provenance = options.provenance;
  if (provenance) {
    context.published = async (name, version, principal) => {
      try {
        const entry = await attestProvenance(store, name, version, principal, provenance, now());
        if (entry) log.info({ name, version, requestId: entry.requestId, keyId: entry.keyId }, "provenance attested");
      } catch (error) {
        log.error({ err: error, name, version }, "provenance not attested");
      }
    };
  }
  // Installer routes first, then the packager's: itty answers with the first match.
  registerInstallerRoutes(context);
  registerPackagerRoutes(context);
  registerAttestationRoutes(context, {
    keys: loadTrustedKeys(options.trustedKeys ?? { keys: [] }),
    maxBytes: options.maxAttestationBytes ?? 16 * 2 ** 20,
  });
  registerMirrorRoutes(context);
  registerFallback(router);

  const depot = router as unknown as PackageRouter;
  const routed = router.fetch.bind(router);
  /** itty's fetch, with every answer counted by route, method and status. */
  async function fetch(request: Request): Promise<Response> {
    const started = performance.now();
    const response = await routed(request);
    const seconds = (performance.now() - started) / 1000;
    const method = ALLOW_ORDER.includes(request.method) ? request.method : "_OTHER";
    const route = routeOf(request as IRequest, base);
    telemetry.request(route, method, response.status, seconds);
    log.debug({ method, route, status: response.status, ms: Math.round(seconds * 1000) }, "request");
    return response;
  }
  async function runGarbageCollection(): Promise<GarbageReport> {
    try {
      const report = await collectGarbage(store, transactions, {
        now,
        graceMs: options.gcGraceMs ?? 3600_000,
        retainMs: options.transactionRetainMs ?? 7 * 24 * 3600_000,
        // The same line as an expiry a request finds, so every expiry is one line.
        onExpired: (trans) =>
          log.info({ transaction: trans.id, name: trans.name, version: trans.version }, "transaction expired"),
      });
      telemetry.reclaimed(report.deletedBlobs, report.reclaimedBytes);
      telemetry.transactionDelta(-report.expired);
      log.info({ ...report }, "garbage collected");
      return report;
    } catch (error) {
      log.error({ err: error }, "garbage collection failed");
      throw error;
    }
  }
  Object.defineProperties(depot, {
    fetch: { value: fetch, writable: true, configurable: true },
    collectGarbage: { value: runGarbageCollection },
    idle: { value: () => Promise.all([commits.idle(), downloads.idle()]).then(() => undefined) },
    isOpen: { value: options.authorize === undefined },
    store: { value: rawStore },
  });
  return depot;
}

/**
 * The last route, registered after all others: a known path with a method it does not
 * answer is 405 with Allow; anything else 404.
 */
function registerFallback(router: RouterType<IRequest, []>): void {
  const routes = [...router.routes];
  router.all("*", (request) => {
    const pathname = new URL(request.url).pathname;
    const allowed = new Set(routes.filter(([, pattern]) => pattern.test(pathname)).map(([method]) => method));
    if (allowed.size === 0) throw new RunnerDepotError("NOT_FOUND", "No such resource");
    const allow = ALLOW_ORDER.filter((m) => allowed.has(m)).join(", ");
    throw new RunnerDepotError(
      "METHOD_NOT_ALLOWED",
      `${request.method.slice(0, 20)} is not allowed here; allowed: ${allow}`,
      { details: { allow } },
    );
  });
}

/** The `publicUrl` option: an absolute http(s) URL, kept without a trailing slash. */
function parsePublicUrl(raw: string): string {
  let url: URL;
  try {
    url = new URL(raw);
  } catch (cause) {
    throw new RunnerDepotError("BAD_REQUEST", `publicUrl ${JSON.stringify(raw)} is not an absolute URL`, { cause });
  }
  if (url.protocol !== "http:" && url.protocol !== "https:")
    throw new RunnerDepotError("BAD_REQUEST", `publicUrl must be http or https, not ${url.protocol}`);
  if (url.search !== "" || url.hash !== "")
    throw new RunnerDepotError("BAD_REQUEST", "publicUrl takes no query or fragment");
  return url.href.replace(/\/+$/, "");
}
