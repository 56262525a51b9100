/**
 * `createConsole`: the web console as one web-standard `fetch(Request) → Response`
 * handler. Pages are a small HTML shell plus one script and one stylesheet shipped in the
 * package (no CDN, no build step for the host); the script reads the console's JSON API.
 */
import { createHash, createHmac, randomBytes, timingSafeEqual } from "node:crypto";
import { RunnerDepotError } from "../errors.js";
import type { RunnerService } from "../runner/service/runner-service.js";
import { CONSOLE_CSS } from "./client/styles.js";
import { CONSOLE_JS } from "./client/script.js";
import { json, problem, SECURITY_HEADERS } from "./responses.js";
import { createJobEndpoints, jobId } from "./jobs.js";
import { createPackageEndpoints, type ConsoleDepot } from "./packages.js";
import { renderPage, type PageSpec } from "./page.js";
import type { ConsoleSession, ConsoleSessions } from "./sessions.js";

/** What an `authorize` hook is asked. */
export interface ConsoleAuthorizeContext {
  /** `read` for pages and GETs, `cancel` for cancelling a job. */
  action: "read" | "cancel";
}

/** Options of {@link createConsole}. */
export interface ConsoleOptions {
  /** The runner service whose jobs the console shows (no Jobs section without it). */
  runner?: RunnerService;
  /** The depot router (anything with its `fetch`); no Packages section without it. */
  depot?: ConsoleDepot;
  /** The path the depot router answers under (its `base`); default "". */
  depotBase?: string;
  /** Headers for the console's depot requests, e.g. a read token; default none. */
  depotHeaders?: Record<string, string>;
  /** The path the console is mounted under, e.g. "/console"; default "" (the root). */
  base?: string;
  /**
   * The host's own access check (its session, SSO proxy header, …): return true to allow.
   * Runs after `sessions` when both are given.
   */
  authorize?: (request: Request, context: ConsoleAuthorizeContext) => boolean | Promise<boolean>;
  /** One-time login tokens and session cookies (see createConsoleSessions), for hosts without a login of their own. */
  sessions?: ConsoleSessions;
  /**
   * Origins allowed to send state-changing requests; default the request's own origin
   * (set it when a proxy changes scheme or host).
   */
  origins?: readonly string[];
  /**
   * The session cookie's `Secure` attribute: true always, false never; default: when the
   * request URL is https, or `trustProxy` is set and `X-Forwarded-Proto` says https.
   */
  secureCookies?: boolean;
  /** Believe `X-Forwarded-Proto` (set only behind a proxy that overwrites it); default false. */
  trustProxy?: boolean;
  /** Event streams open at once; default 256. */
  maxStreams?: number;
  /** Event streams one login session (`sessions`) holds at once; default 8. */
  maxStreamsPerSession?: number;
  /** Packages examined when listing a package's dependants; default 2,000. */
  dependantScan?: number;
  /** Packages the console asks the depot for per catalog page; default 200. */
  catalogPageSize?: number;
  /** Called with every unexpected (500) error; default console.error. */
  onError?: (error: unknown, request: Request) => void;
  /**
   * The versions a job published with its own credentials (issue 26), listed on its page;
   * `runner-depot serve` passes the depot's record of them. Default: none listed.
   */
  jobPublications?: (requestId: string) => Promise<Array<{ name: string; version: string }>>;
}

/** The console handler. */
export interface Console {
  /** Answers one request (anything outside `base` is 404). */
  fetch(request: Request): Promise<Response>;
  /** The mount path. */
  readonly base: string;
}

const ASSET_VERSION = createHash("sha256").update(CONSOLE_JS).update(CONSOLE_CSS).digest("hex").slice(0, 16);
/** Largest request URL the console reads. */
const MAX_URL = 4096;
/** The command that mints a new login URL on a running `serve`, named where a URL is refused. */
const NEW_LOGIN_URL = "runner-depot console-url";

/**
 * Creates the web console.
 *
 * @example
 * const console = createConsole({ runner, depot, base: "/console", authorize: (req) => isAdmin(req) });
 * http.createServer(createNodeHandler(console)).listen(8080); // createNodeHandler from "runner-depot/depot"
 */
export function createConsole(options: ConsoleOptions = {}): Console {
  const base = (options.base ?? "").replace(/\/+$/, "");
  if (base !== "" && !/^\/[A-Za-z0-9._~\-/]*$/.test(base)) throw new RangeError("base must be a path such as /console");
  const jobs = options.runner
    ? createJobEndpoints(options.runner, {
        maxStreams: options.maxStreams ?? 256,
        maxStreamsPerSession: options.maxStreamsPerSession ?? 8,
        ...(options.jobPublications ? { publications: options.jobPublications } : {}),
      })
    : null;
  const packages = options.depot
    ? createPackageEndpoints({
        depot: options.depot,
        depotBase: (options.depotBase ?? "").replace(/\/+$/, ""),
        depotHeaders: options.depotHeaders ?? {},
        dependantScan: options.dependantScan ?? 2000,
        catalogPageSize: options.catalogPageSize ?? 200,
      })
    : null;
  // Without sessions, the CSRF token is one per console (an HMAC, so it is not the key).
  const key = randomBytes(32);
  const hostCsrf = createHmac("sha256", key).update("console-csrf").digest("base64url");
  const sessions = options.sessions;

  async function handle(request: Request): Promise<Response> {
    if (request.url.length > MAX_URL) throw new RunnerDepotError("INVALID_ARGUMENT", "URL too long");
    const url = new URL(request.url);
    if (url.pathname !== base && !url.pathname.startsWith(`${base}/`))
      throw new RunnerDepotError("NOT_FOUND", "not a console path");
    const path = url.pathname.slice(base.length) || "/";
    const method = request.method;

    // The script and style hold no data: served to anyone (a login page needs the style).
    if (path === "/assets/console.js" || path === "/assets/console.css") {
      if (method !== "GET" && method !== "HEAD") return notAllowed("GET, HEAD");
      return asset(
        path.endsWith(".js") ? CONSOLE_JS : CONSOLE_CSS,
        path.endsWith(".js") ? "text/javascript" : "text/css",
        url,
      );
    }
    const isApi = path.startsWith("/api/");

    let session: ConsoleSession | null = null;
    if (sessions) {
      const token = url.searchParams.get("token");
      if (token !== null && !isApi && (method === "GET" || method === "HEAD")) return loginPage(token, url.pathname);
      if (path === "/login") return method === "POST" ? login(request, url) : notAllowed("POST");
      session = sessions.session(cookie(request, sessions.cookieName) ?? "");
      if (!session) {
        if (isApi) throw new RunnerDepotError("UNAUTHENTICATED", "sign in to the console with its login URL");
        return html(
          {
            page: "login",
            title: "Sign in",
            message: `Open the console with a one-time login URL: runner-depot serve prints one at startup, and '${NEW_LOGIN_URL}' mints another.`,
          },
          401,
        );
      }
    }
    const action = method === "POST" ? "cancel" : "read";
    if (options.authorize && !(await options.authorize(request, { action }))) {
      // Someone who may read but not cancel is known: 403; anyone else: 401.
      const reader =
        session !== null || (action === "cancel" && (await options.authorize(request, { action: "read" })));
      throw new RunnerDepotError(
        reader ? "PERMISSION_DENIED" : "UNAUTHENTICATED",
        action === "cancel" ? "not allowed to cancel jobs" : "not allowed to use the console",
      );
    }
    const csrf = session?.csrf ?? hostCsrf;
    if (method === "POST") checkCrossSite(request, url, csrf);
    else if (method !== "GET" && method !== "HEAD") return notAllowed("GET, HEAD, POST");

    if (!isApi) return page(path, csrf);
    // Streams are counted per session by a hash of its ID: the map holds no usable cookie.
    const streamKey = session ? createHash("sha256").update(session.id).digest("base64url") : undefined;
    return api(path.slice(4), method, request, url, streamKey);
  }

  async function api(path: string, method: string, request: Request, url: URL, session?: string): Promise<Response> {
    const parts = path.split("/").filter((p) => p !== "");
    if (parts[0] === "config" && parts.length === 1) return json({ jobs: jobs !== null, packages: packages !== null });
    if (parts[0] === "jobs") {
      if (!jobs) throw new RunnerDepotError("NOT_FOUND", "this console has no runner");
      if (parts.length === 1 && method !== "POST") return jobs.list(url);
      const id = jobId(parts[1] ?? "");
      if (parts.length === 2 && method !== "POST") return jobs.get(id);
      if (parts.length === 3 && parts[2] === "lines" && method !== "POST") return jobs.lines(id, url);
      if (parts.length === 3 && parts[2] === "events" && method !== "POST")
        return jobs.events(id, request, url, session);
      if (parts.length === 3 && parts[2] === "raw" && method !== "POST") return jobs.raw(id, url);
      if (parts.length === 3 && parts[2] === "sections" && method !== "POST") return jobs.sections(id);
      if (parts.length === 3 && parts[2] === "cancel") return method === "POST" ? jobs.cancel(id) : notAllowed("POST");
    }
    if (parts[0] === "packages" && method !== "POST") {
      if (!packages) throw new RunnerDepotError("NOT_FOUND", "this console has no depot");
      if (parts.length === 1) return packages.list(url);
      if (parts.length === 2) return packages.get(parts[1]!, url);
      if (parts.length === 3) return packages.version(parts[1]!, parts[2]!, url);
    }
    throw new RunnerDepotError("NOT_FOUND", `no console route ${method} ${path}`);
  }

  function page(path: string, csrf: string): Response {
    if (path === "/") return html({ page: "home", title: "Console", csrf });
    if ((path === "/jobs" || path === "/jobs/") && jobs) return html({ page: "jobs", title: "Jobs", csrf });
    if ((path === "/packages" || path === "/packages/") && packages)
      return html({ page: "packages", title: "Packages", csrf });
    const job = /^\/jobs\/([^/]+)$/.exec(path);
    if (job && jobs) return html({ page: "job", subject: jobId(job[1]!), title: "Job", csrf });
    const pkg = /^\/packages\/([^/]+)$/.exec(path);
    if (pkg && packages) {
      const name = decodeURIComponent(pkg[1]!);
      if (!/^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/.test(name))
        throw new RunnerDepotError("NAME_INVALID", "not a package name");
      return html({ page: "package", subject: name.toLowerCase(), title: name, csrf });
    }
    // A page, not a JSON problem: a person typed or followed this URL.
    return html({ page: "not-found", title: "Not found", csrf, message: "There is no such console page." }, 404);
  }

  function html(spec: Omit<PageSpec, "base" | "assetVersion" | "csrf"> & { csrf?: string }, status = 200): Response {
    const body = renderPage({ ...spec, csrf: spec.csrf ?? "", base, assetVersion: ASSET_VERSION });
    return new Response(body, {
      status,
      headers: { ...SECURITY_HEADERS, "content-type": "text/html; charset=utf-8", "cache-control": "no-store" },
    });
  }

  /**
   * `?token=` on a GET: a page whose "Sign in" button POSTs the token. The GET spends
   * nothing, so a chat's link unfurler or a browser's preview cannot use the URL up.
   */
  function loginPage(token: string, next: string): Response {
    const page = html({
      page: "login",
      title: "Sign in",
      message: "Sign in to the runner-depot console with this one-time login URL.",
      loginToken: token.slice(0, 64),
      loginNext: next,
    });
    // Under no-referrer a browser's form POST says `Origin: null`, which login() refuses as
    // cross-site; same-origin names this origin to the console only (the POST spends the token).
    page.headers.set("referrer-policy", "same-origin");
    return page;
  }

  /**
   * `POST <base>/login` with the form's token: a valid one opens a session and redirects to
   * the console; a used or unknown one gets 401. Only from the console's own origin (a
   * login CSRF would sign the victim in as someone else); the body is at most 1 KiB.
   */
  async function login(request: Request, url: URL): Promise<Response> {
    const origin = request.headers.get("origin");
    if (origin !== null && !(options.origins ?? [url.origin]).includes(origin))
      throw new RunnerDepotError("PERMISSION_DENIED", "cross-site request refused (Origin)");
    const form = new URLSearchParams(await boundedText(request, 1024));
    const opened = sessions!.redeem(form.get("token") ?? "");
    if (!opened) {
      return html(
        {
          page: "login",
          title: "Sign in",
          message: `This login URL has already been used or has expired. '${NEW_LOGIN_URL}' mints a new one.`,
        },
        401,
      );
    }
    const secure = secureCookie(request, url) ? "; Secure" : "";
    const cookieValue = `${sessions!.cookieName}=${opened.id}; Path=${base || ""}/; HttpOnly; SameSite=Strict; Max-Age=${sessions!.maxAgeSeconds}${secure}`;
    return new Response(null, {
      status: 303,
      headers: {
        ...SECURITY_HEADERS,
        location: nextPath(form.get("next")),
        "set-cookie": cookieValue,
        "cache-control": "no-store",
      },
    });
  }

  /** The console page a login returns to: one under `base` (never another site), else the console's front page. */
  function nextPath(next: string | null): string {
    const ok =
      next !== null && next.startsWith(`${base}/`) && next.length <= 512 && !/[\\]|\/\/|[^\x21-\x7e]/.test(next);
    return ok ? next : `${base}/`;
  }

  /** Issue 30 item 9: behind a TLS terminator the URL says http, so the host decides or trusts its proxy. */
  function secureCookie(request: Request, url: URL): boolean {
    if (options.secureCookies !== undefined) return options.secureCookies;
    if (url.protocol === "https:") return true;
    const forwarded = options.trustProxy ? request.headers.get("x-forwarded-proto") : null;
    return forwarded?.split(",")[0]?.trim().toLowerCase() === "https";
  }

  /**
   * Cross-site request forgery: a state-changing request must come from an allowed origin
   * (the browser's Origin header, which a page cannot forge) and carry the page's CSRF
   * token (which another site cannot read); the session cookie is SameSite=Strict too.
   */
  function checkCrossSite(request: Request, url: URL, csrf: string): void {
    const origin = request.headers.get("origin");
    const allowed = options.origins ?? [url.origin];
    if (origin === null || !allowed.includes(origin))
      throw new RunnerDepotError("PERMISSION_DENIED", "cross-site request refused (Origin)");
    const given = Buffer.from(request.headers.get("x-csrf-token") ?? "");
    const expected = Buffer.from(csrf);
    if (given.length !== expected.length || !timingSafeEqual(given, expected))
      throw new RunnerDepotError("PERMISSION_DENIED", "cross-site request refused (CSRF token)");
  }

  return {
    base,
    async fetch(request) {
      try {
        return await handle(request);
      } catch (error) {
        const response = problem(error);
        if (response.status >= 500 && !(error instanceof RunnerDepotError))
          (options.onError ?? ((e: unknown) => console.error("runner-depot console:", e)))(error, request);
        return response;
      }
    },
  };
}

function asset(body: string, type: string, url: URL): Response {
  const current = url.searchParams.get("v") === ASSET_VERSION;
  return new Response(body, {
    headers: {
      ...SECURITY_HEADERS,
      "content-type": `${type}; charset=utf-8`,
      "cache-control": current ? "public, max-age=31536000, immutable" : "no-cache",
    },
  });
}

/** A request body as text, refused past `max` bytes (read chunk by chunk: never more than max + one chunk held). */
async function boundedText(request: Request, max: number): Promise<string> {
  if (!request.body) return "";
  const chunks: Uint8Array[] = [];
  let size = 0;
  for await (const chunk of request.body as unknown as AsyncIterable<Uint8Array>) {
    size += chunk.byteLength;
    if (size > max) throw new RunnerDepotError("TOO_LARGE", `the login form is larger than ${max} bytes`);
    chunks.push(chunk);
  }
  return Buffer.concat(chunks).toString("utf8");
}

function notAllowed(allow: string): Response {
  const response = problem(new RunnerDepotError("METHOD_NOT_ALLOWED", "method not allowed"));
  response.headers.set("allow", allow);
  return response;
}

/** A cookie's value from the Cookie header (bounded: the header is at most a few KiB). */
function cookie(request: Request, name: string): string | null {
  const header = request.headers.get("cookie");
  if (!header || header.length > 8192) return null;
  for (const part of header.split(";")) {
    const eq = part.indexOf("=");
    if (eq > 0 && part.slice(0, eq).trim() === name) return part.slice(eq + 1).trim();
  }
  return null;
}
