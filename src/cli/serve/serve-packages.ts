/**
 * The packages only `serve` loads (its logger and the OpenTelemetry SDK): optional peer
 * dependencies, so a host that installs runner-depot as a library does not get them
 * (about 23 MB; issue 29, docs/decisions/public-surface.md "What an embedder installs").
 * When one is missing, `serve` says which and the one command that installs them all.
 */
import { CliError } from "../args.js";

/** What `serve` imports beyond the library's dependencies, as package.json's peerDependencies name them. */
export const SERVE_PACKAGES: readonly string[] = [
  "@opentelemetry/core@^3.1.0",
  "@opentelemetry/exporter-prometheus@^0.301.0",
  "@opentelemetry/exporter-trace-otlp-http@^0.301.0",
  "@opentelemetry/resources@^3.1.0",
  "@opentelemetry/sdk-metrics@^3.1.0",
  "@opentelemetry/sdk-trace@^3.1.0",
  "pino@^10.4.0",
];

/** The package a Node "Cannot find package 'x'" names, if it is one of {@link SERVE_PACKAGES}. */
export function missingServePackage(error: unknown): string | undefined {
  const e = error as { code?: string; message?: string } | undefined;
  if (e?.code !== "ERR_MODULE_NOT_FOUND" && e?.code !== "MODULE_NOT_FOUND") return undefined;
  const named = /Cannot find (?:package|module) '([^']+)'/.exec(e.message ?? "")?.[1];
  if (named === undefined) return undefined;
  return SERVE_PACKAGES.map((spec) => spec.slice(0, spec.lastIndexOf("@"))).find(
    (name) => named === name || named.startsWith(`${name}/`),
  );
}

/**
 * Loads `serve`, turning a missing optional package into a one-line error naming the
 * install command. O(1).
 *
 * @example
 * const serve = await loadServe(() => import("./serve.js"));
 */
export async function loadServe<T>(load: () => Promise<T>): Promise<T> {
  try {
    return await load();
  } catch (error) {
    const missing = missingServePackage(error);
    if (missing === undefined) throw error;
    throw new CliError(
      `'serve' needs ${missing}, which installing runner-depot as a library leaves out (only serve loads it); install serve's packages next to it: npm install ${SERVE_PACKAGES.join(" ")}`,
    );
  }
}
