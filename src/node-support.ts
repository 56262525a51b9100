/**
 * Which Node.js this package runs on, checked when an entry point loads: on an older Node
 * the fs store's `node:sqlite` and `process.getBuiltinModule` are missing, and every depot
 * request would answer 500 with nothing naming Node (issue 29). Other runtimes (Bun, Deno,
 * workers) are not Node and are not judged by its version.
 */

/** The oldest Node.js release line the package supports, as [major, minor]. */
export const MIN_NODE: readonly [number, number] = [22, 15];

/** How to get a supported Node, for the refusal's message. */
const HOW_TO_GET =
  "install one from https://nodejs.org/en/download (or `nvm install 22`, `fnm install 22`, `volta install node@22`), then run this again";

/**
 * The refusal's message when `version` (default: this process's Node) is older than
 * {@link MIN_NODE}, else `undefined`. Runtimes that only imitate Node (Bun, Deno) pass.
 *
 * @example
 * const why = unsupportedNode("20.19.5"); // "runner-depot needs Node.js 22.15 or later (22 or 24); this is Node.js 20.19.5: install one …"
 */
export function unsupportedNode(version: string | undefined = runningNode()): string | undefined {
  if (version === undefined) return undefined;
  const [major = 0, minor = 0] = version.replace(/^v/, "").split(".").map(Number);
  const [minMajor, minMinor] = MIN_NODE;
  if (major > minMajor || (major === minMajor && minor >= minMinor)) return undefined;
  return `runner-depot needs Node.js ${minMajor}.${minMinor} or later (22 or 24); this is Node.js ${version.replace(/^v/, "")}: ${HOW_TO_GET}`;
}

/** This process's Node version; undefined outside Node (workers) and in Bun or Deno. */
function runningNode(): string | undefined {
  const versions = (globalThis as { process?: { versions?: Record<string, string | undefined> } }).process?.versions;
  if (!versions || versions.bun !== undefined || versions.deno !== undefined) return undefined;
  return versions.node;
}

/** Error code of the refusal thrown by the library's entry points. */
export const UNSUPPORTED_NODE = "ERR_RUNNER_DEPOT_UNSUPPORTED_NODE";

/**
 * Throws when this process's Node is too old: the library's entry points call it as they
 * load, so an embedder on Node 20 learns it at import, not from a 500 later. O(1).
 *
 * @example
 * assertSupportedNode(); // throws Error { code: "ERR_RUNNER_DEPOT_UNSUPPORTED_NODE" } on Node 20
 */
export function assertSupportedNode(): void {
  const why = unsupportedNode();
  if (why !== undefined) throw Object.assign(new Error(why), { code: UNSUPPORTED_NODE });
}
