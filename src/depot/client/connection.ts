/**
 * The depot client's connection: its base URL, bearer token and `fetch`, and the request
 * helpers every part of the client (catalog, download, publish) goes through, so a network
 * failure is always reported the same way (UNAVAILABLE naming the URL and why).
 */
import { RunnerDepotError } from "../../errors.js";
import { fetchFailureCause } from "../../fetch-failure.js";
import { errorFromResponse } from "./http.js";
import { DEFAULT_LIMITS, readBounded, readJson, timedChunks } from "./body.js";
import type { DepotClientOptions } from "./types.js";
import { parsePackageSpec } from "../install/resolve.js";

/** One client's way to the depot. */
export interface DepotConnection {
  /** The base URL, ending in `/`. */
  readonly base: string;
  /** The `fetch` to use (the option's, or the global one). */
  readonly fetch: typeof fetch;
  /** How many times a broken download is resumed without progress before giving up. */
  readonly retries: number;
  /** The absolute URL of a path relative to the base. */
  url(relative: string): string;
  /** `extra` with the bearer token added. */
  headersWith(extra?: HeadersInit): Headers;
  /** One request; a network failure becomes UNAVAILABLE naming the URL and its cause. */
  call(method: string, relative: string, init?: RequestInit): Promise<Response>;
  /** One request whose 2xx answer is JSON; anything else throws its problem's error. */
  json<T>(method: string, relative: string, init?: RequestInit): Promise<T>;
  /** Waits before retry `attempt`: the first delay doubled per attempt, at most 2 s. */
  sleep(attempt: number): Promise<unknown>;
  /** The bounds on every answer this client reads (the options', or the defaults). */
  readonly limits: ConnectionLimits;
  /** A non-2xx answer's error, its body read within the bounds. */
  error(response: Response, what: string): Promise<RunnerDepotError>;
  /** A 2xx answer's JSON body, read within `maxJsonBytes` and the time bounds. */
  readJson<T>(response: Response, what: string): Promise<T>;
  /** A body's bytes, at most `maxBytes` (else TOO_LARGE), within the time bounds. */
  readBytes(response: Response, what: string, maxBytes: number): Promise<Buffer>;
  /** Whether the wait for an answer's headers is this connection's to bound (no `fetch` of the caller's). */
  readonly boundsHeaders: boolean;
  /**
   * A streamed body's chunks, each within `idleTimeoutMs` of the last; with `whole`, the body as a whole within
   * `jsonTimeoutMs` too (a structured read such as the manifest, not an archive that may progress slowly).
   */
  chunks(body: ReadableStream<Uint8Array>, what: string, whole?: boolean): AsyncIterable<Uint8Array>;
}

/** The bounds of {@link DepotClientOptions}, defaults applied. */
export interface ConnectionLimits {
  idleTimeoutMs: number;
  jsonTimeoutMs: number;
  maxJsonBytes: number;
  maxCatalogPages: number;
  maxCatalogBytes: number;
}

/**
 * The connection of a client with these options.
 *
 * @example
 * const connection = createDepotConnection({ baseUrl: "http://127.0.0.1:8080", token });
 * const info = await connection.json<VersionInfo>("GET", "version/toolchain");
 */
export function createDepotConnection(options: DepotClientOptions): DepotConnection {
  const base = String(options.baseUrl).replace(/\/*$/, "/");
  const fetchImpl = options.fetch ?? globalThis.fetch;
  const retryDelayMs = options.retryDelayMs ?? 100;
  const limits: ConnectionLimits = {
    idleTimeoutMs: options.idleTimeoutMs ?? DEFAULT_LIMITS.idleTimeoutMs,
    jsonTimeoutMs: options.jsonTimeoutMs ?? DEFAULT_LIMITS.jsonTimeoutMs,
    maxJsonBytes: options.maxJsonBytes ?? DEFAULT_LIMITS.maxJsonBytes,
    maxCatalogPages: options.maxCatalogPages ?? DEFAULT_LIMITS.maxCatalogPages,
    maxCatalogBytes: options.maxCatalogBytes ?? DEFAULT_LIMITS.maxCatalogBytes,
  };
  const timing = { idleMs: limits.idleTimeoutMs, totalMs: limits.jsonTimeoutMs };

  const url = (relative: string) => new URL(relative, base).href;
  const headersWith = (extra?: HeadersInit) => {
    const h = new Headers(extra);
    if (options.token !== undefined) h.set("authorization", `Bearer ${options.token}`);
    return h;
  };
  const call = async (method: string, relative: string, init: RequestInit = {}): Promise<Response> => {
    // A GET's answer must begin within the idle bound; a POST's may wait on the server's work (a commit hashes).
    // A `fetch` of the caller's bounds its own wait (the CLI's names $RUNNER_DEPOT_TIMEOUT).
    const bounded = (method === "GET" || method === "HEAD") && options.fetch === undefined;
    const controller = new AbortController();
    const timer = bounded
      ? setTimeout(
          () =>
            controller.abort(
              new RunnerDepotError(
                "DEADLINE_EXCEEDED",
                `${method} ${url(relative)}: no answer within ${limits.idleTimeoutMs / 1000} s`,
              ),
            ),
          limits.idleTimeoutMs,
        )
      : undefined;
    const signal = !bounded
      ? init.signal
      : init.signal
        ? AbortSignal.any([init.signal, controller.signal])
        : controller.signal;
    try {
      return await fetchImpl(url(relative), { ...init, method, headers: headersWith(init.headers), signal });
    } catch (cause) {
      if (controller.signal.aborted) throw controller.signal.reason as RunnerDepotError;
      if (cause instanceof RunnerDepotError) throw cause;
      // Undici says only "fetch failed": name the URL and why (refused, DNS, TLS, timeout).
      throw new RunnerDepotError("UNAVAILABLE", `cannot reach ${url(relative)}: ${fetchFailureCause(cause)}`, {
        cause,
      });
    } finally {
      clearTimeout(timer);
    }
  };
  const error = (response: Response, what: string) => errorFromResponse(response, what, timing);
  const readJsonBody = <T>(response: Response, what: string) =>
    readJson<T>(response, what, { maxBytes: limits.maxJsonBytes, ...timing });
  const json = async <T>(method: string, relative: string, init?: RequestInit): Promise<T> => {
    const response = await call(method, relative, init);
    if (!response.ok) throw await error(response, `${method} /${relative}`);
    return readJsonBody<T>(response, `${method} /${relative}`);
  };
  const sleep = (attempt: number) =>
    new Promise((resolve) => setTimeout(resolve, Math.min(2000, retryDelayMs * 2 ** attempt)));

  return {
    base,
    fetch: fetchImpl,
    retries: options.retries ?? 5,
    url,
    headersWith,
    call,
    json,
    sleep,
    limits,
    boundsHeaders: options.fetch === undefined,
    error,
    readJson: readJsonBody,
    readBytes: async (response, what, maxBytes) => (await readBounded(response, what, { maxBytes, ...timing })).bytes,
    chunks: (body, what, whole = false) => timedChunks(body, what, whole ? timing : { idleMs: limits.idleTimeoutMs }),
  };
}

/** `name` or `name@version` (an exact version, never a range), split. */
export function versionPart(spec: string): { name: string; version?: string } {
  const parsed = parsePackageSpec(spec);
  if (parsed.range !== "*" && !parsed.exact) {
    throw new RunnerDepotError("VERSION_INVALID", `expected name or name@version, got a range: ${spec}`);
  }
  return parsed.exact ? { name: parsed.name, version: parsed.range } : { name: parsed.name };
}

/** A path segment, percent-encoded. */
export const seg = (s: string) => encodeURIComponent(s);
/** The `<name>[@<version>]` segment of a path. */
export const specPath = (name: string, version?: string) => (version ? `${seg(name)}@${seg(version)}` : seg(name));
