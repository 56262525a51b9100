/**
 * Link resolution inside a package: where a link's target leads once every link of the package it passes
 * through is followed, the way the kernel would follow them after installation. A target is checked against
 * the whole chain, not alone: with `a/b/up → ../..` in the package, `passwd → a/b/up/../etc/passwd` is
 * lexically inside the root but resolves to `../etc/passwd` — outside.
 * Why: docs/decisions/depot-server.md, "links.ts: resolving a link through the package's links".
 */
import { RunnerDepotError } from "../../errors.js";
import { RESERVED_PREFIX, parseLinkTarget } from "./paths.js";

/** Links followed in one resolution at most (Linux's MAXSYMLINKS). */
const MAX_LINK_HOPS = 40;
/** Path segments walked in one resolution at most: bounds the work of a hostile chain. */
const MAX_RESOLVE_STEPS = 4096;

/** What a resolution needs to know about a path of the package. */
export type TreeEntry = { type: "file" | "dir" } | { type: "link"; target: string };

/** The package tree a resolution walks: the entry at a path, or undefined when none. */
export type TreeLookup = (path: string) => TreeEntry | undefined | Promise<TreeEntry | undefined>;

/** Optional: whether any item may lie below a directory (false lets the walk skip lookups there). */
export type BelowLookup = (dir: string) => boolean | Promise<boolean>;

/**
 * Resolves the link at `linkPath` with `target` through the package's own links and
 * returns where it leads (a package-relative path; `""` is the package root). Paths that
 * are no item of the package are taken lexically (conservative: `..` after a missing
 * directory is counted as if it existed). PATH_INVALID when the chain leaves the root,
 * points into the reserved `.pkg/`, follows more than {@link MAX_LINK_HOPS} links (a
 * cycle included) or walks more than {@link MAX_RESOLVE_STEPS} segments.
 *
 * O(segments walked) lookups, each path looked up at most once per resolution.
 *
 * @example
 * const tree = new Map([["a/up", { type: "link", target: "../.." }]]);
 * await resolveLink("passwd", "a/up/etc/passwd", (p) => tree.get(p)); // throws PATH_INVALID
 */
export async function resolveLink(
  linkPath: string,
  target: string,
  lookup: TreeLookup,
  below?: BelowLookup,
): Promise<string> {
  const refuse = (why: string): never => {
    throw new RunnerDepotError(
      "PATH_INVALID",
      `Link target ${JSON.stringify(target.slice(0, 200))} of ${JSON.stringify(linkPath.slice(0, 200))} ${why}`,
    );
  };
  // Each link's own target is validated by the lexical rule first (relative, normalised).
  parseLinkTarget(linkPath, target);
  const seen = new Map<string, TreeEntry | undefined>();
  const entryAt = async (path: string) => {
    if (!seen.has(path)) seen.set(path, await lookup(path));
    return seen.get(path);
  };
  const dir = linkPath.split("/").slice(0, -1);
  // Segments still to walk, in order (a stack: the next segment is last).
  const pending = target.split("/").reverse();
  let hops = 0;
  let steps = 0;
  // Depth from which the walk is inside a directory that holds no item: no lookups there
  // (nothing can be a link) until `..` climbs back out. Keeps a hostile 2,000-segment
  // target from costing 2,000 store reads.
  let emptyFrom: number | null = null;
  while (pending.length > 0) {
    if (++steps > MAX_RESOLVE_STEPS) refuse(`walks more than ${MAX_RESOLVE_STEPS} path segments`);
    const segment = pending.pop()!;
    if (segment === "..") {
      if (dir.length === 0) refuse("leaves the package root through its links");
      dir.pop();
      if (emptyFrom !== null && dir.length < emptyFrom) emptyFrom = null;
      continue;
    }
    if (emptyFrom === null && below && dir.length > 0 && !(await below(dir.join("/")))) emptyFrom = dir.length;
    const candidate = [...dir, segment].join("/");
    const entry = emptyFrom === null ? await entryAt(candidate) : undefined;
    if (entry?.type === "link") {
      if (++hops > MAX_LINK_HOPS) refuse(`follows more than ${MAX_LINK_HOPS} links (a cycle?)`);
      // The link's own target replaces it, relative to the link's directory (unchanged).
      const next = entry.target;
      if (next.length === 0 || next.startsWith("/"))
        refuse(`passes through the link ${JSON.stringify(candidate)}, whose target is absolute or empty`);
      for (const s of next.split("/").reverse()) if (s !== "" && s !== ".") pending.push(s);
      continue;
    }
    dir.push(segment);
  }
  if (dir.length > 0 && dir[0]!.toLowerCase() === RESERVED_PREFIX)
    refuse(`points into the reserved '${RESERVED_PREFIX}/' directory through its links`);
  return dir.join("/");
}

/**
 * A {@link TreeLookup} over a list of items (a manifest, a transaction's settled items).
 *
 * @example
 * const lookup = treeOf(manifest.items);
 * for (const item of manifest.items) if (item.type === "link") await resolveLink(item.path, item.target!, lookup);
 */
export function treeOf(items: Iterable<{ type: string; path: string; target?: string }>): TreeLookup {
  const byPath = new Map<string, TreeEntry>();
  for (const item of items) {
    if (item.type === "link") byPath.set(item.path, { type: "link", target: item.target ?? "" });
    else if (item.type === "file" || item.type === "dir") byPath.set(item.path, { type: item.type });
  }
  return (path) => byPath.get(path);
}

/**
 * A {@link BelowLookup} over a list of items: the directories that hold an item (every
 * proper ancestor of an item's path).
 *
 * @example
 * await resolveLink(link.path, link.target!, treeOf(items), belowOf(items));
 */
export function belowOf(items: Iterable<{ path: string }>): BelowLookup {
  const dirs = new Set<string>();
  for (const item of items) {
    const segments = item.path.split("/");
    for (let i = 1; i < segments.length; i++) dirs.add(segments.slice(0, i).join("/"));
  }
  return (dir) => dirs.has(dir);
}
