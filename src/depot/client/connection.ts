/**
 * The depot client's connection: its base URL, bearer token and `fetch`, and the request
 * helpers every part of the client (catalog, download, publish) goes through, so a network
 * failure is always reported the same way (UNAVAILABLE naming the URL and why).
 */
import { RunnerDepotError } from "../../errors.js";
import { fetchFailureCause } from "../../fetch-failure.js";
import { errorFromResponse } from "./http.js";
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

  const url = (relative: string) => new URL(relative, base).href;
  const headersWith = (extra?: HeadersInit) => {
    const h = new Headers(extra);
    if (options.token !== undefined) h.set("authorization", `Bearer ${options.token}`);
    return h;
  };
  const call = async (method: string, relative: string, init: RequestInit = {}): Promise<Response> => {
    try {
      return await fetchImpl(url(relative), { ...init, method, headers: headersWith(init.headers) });
    } catch (cause) {
      if (cause instanceof RunnerDepotError) throw cause;
      // Undici says only "fetch failed": name the URL and why (refused, DNS, TLS, timeout).
      throw new RunnerDepotError("UNAVAILABLE", `cannot reach ${url(relative)}: ${fetchFailureCause(cause)}`, {
        cause,
      });
    }
  };
  const json = async <T>(method: string, relative: string, init?: RequestInit): Promise<T> => {
    const response = await call(method, relative, init);
    if (!response.ok) throw await errorFromResponse(response, `${method} /${relative}`);
    return (await response.json()) as T;
  };
  const sleep = (attempt: number) =>
    new Promise((resolve) => setTimeout(resolve, Math.min(2000, retryDelayMs * 2 ** attempt)));

  return { base, fetch: fetchImpl, retries: options.retries ?? 5, url, headersWith, call, json, sleep };
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
