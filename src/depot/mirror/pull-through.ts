/**
 * Pull-through: a router with an `upstream` answers a read miss (an unknown package or version) by
 * copying that one version from the upstream with the mirror's checked per-version copy, then
 * serving it from its own store. What it holds never depends on the upstream again; a miss is
 * remembered only `missTtlMs`; upstream fetches are bounded in number and size.
 * Why: docs/decisions/depot-yank-mirror.md, "Pull-through".
 */
import { isRunnerDepotError, RunnerDepotError } from "../../errors.js";
import type { PackageStore } from "../ports.js";
import { pullVersion } from "./mirror.js";
import { Upstream, UPSTREAM_LIMITS, type UpstreamLimits } from "./upstream.js";

/** The `upstream` option of createPackageRouter. */
export interface PullThroughOptions {
  /** The upstream depot's base URL (what its clients use). */
  url: string;
  /** A bearer token with read on the upstream's packages. */
  token?: string;
  /** How long an upstream "no such version" is remembered, ms (default 30,000). */
  missTtlMs?: number;
  /** Upstream copies running at once (default 4); more misses answer 503 TOO_MANY_PULLS with Retry-After. */
  maxConcurrent?: number;
  /** The largest archive a miss may make this depot store, bytes (default 1 GiB). */
  maxVersionBytes?: number;
  /**
   * Let the `anonymous` principal (an open router, or a hook that names no one) trigger pulls
   * (default false: only a named reader makes the depot fetch and store).
   */
  allowAnonymous?: boolean;
  /** Bounds of every read from the upstream. */
  limits?: Partial<UpstreamLimits>;
}

/**
 * What the upstream's reads and the copy's checks throw (depot/mirror/upstream.ts, mirror.ts); DEADLINE_EXCEEDED is
 * an upstream that did not answer within its bounds (no local store throws it).
 */
const UPSTREAM_FAILURES = new Set(["UNAVAILABLE", "PERMISSION_DENIED", "DIGEST_MISMATCH", "DEADLINE_EXCEEDED"]);

/** Misses remembered at most (oldest forgotten first): bounds the memory a reader can fill with names. */
const MAX_MISSES = 10_000;

/**
 * The pull-through state of one router: in-flight copies (one per version, shared by concurrent
 * readers), the remembered misses, and the concurrency bound.
 *
 * @example
 * const pulls = new PullThrough(store, { url: "https://depot.example.com" }, () => new Date());
 * if (await pulls.pull("toolchain", "1.2.0", "ci")) { … read it from the store … }
 */
export class PullThrough {
  private readonly upstream: Upstream;
  private readonly misses = new Map<string, number>();
  private readonly running = new Map<string, Promise<boolean>>();
  private readonly missTtlMs: number;
  private readonly maxConcurrent: number;
  private readonly maxVersionBytes: number;

  constructor(
    private readonly store: PackageStore,
    private readonly options: PullThroughOptions,
    private readonly now: () => Date,
  ) {
    this.upstream = new Upstream(options.url, options.token, { ...UPSTREAM_LIMITS, ...options.limits });
    this.missTtlMs = options.missTtlMs ?? 30_000;
    this.maxConcurrent = options.maxConcurrent ?? 4;
    this.maxVersionBytes = options.maxVersionBytes ?? 2 ** 30;
  }

  /**
   * Copies `name@version` (no version: the upstream's latest) into the store; true when the store
   * now holds it, false when the upstream has no such version (remembered for `missTtlMs`).
   * UPSTREAM_UNAVAILABLE when the upstream is down or answers wrongly; TOO_MANY_PULLS past the bound.
   * O(1) bookkeeping plus the copy (depot/mirror/mirror.ts pullVersion).
   */
  async pull(name: string, version: string | undefined, principal: string): Promise<boolean> {
    if (principal === "anonymous" && this.options.allowAnonymous !== true) return false;
    const key = `${name}@${version ?? ""}`;
    const until = this.misses.get(key);
    if (until !== undefined) {
      if (until > this.now().getTime()) return false;
      this.misses.delete(key);
    }
    const shared = this.running.get(key);
    if (shared) return shared;
    if (this.running.size >= this.maxConcurrent)
      throw new RunnerDepotError("TOO_MANY_PULLS", `${this.running.size} upstream pulls are running; retry shortly`, {
        details: { retryAfter: 1 },
      });
    const work = this.copy(name, version, key).finally(() => this.running.delete(key));
    this.running.set(key, work);
    return work;
  }

  private async copy(name: string, version: string | undefined, key: string): Promise<boolean> {
    try {
      const wanted = version ?? (await this.upstream.latest(name));
      await pullVersion(this.store, this.upstream, name, wanted, this.now, this.maxVersionBytes);
      return true;
    } catch (error) {
      if (isRunnerDepotError(error) && error.details.upstreamStatus === 404) {
        this.remember(key);
        return false;
      }
      // The reader sees the upstream's failure as such (not as this depot's store, nor its 403 as theirs).
      if (isRunnerDepotError(error) && UPSTREAM_FAILURES.has(error.code))
        throw new RunnerDepotError("UPSTREAM_UNAVAILABLE", `the upstream could not supply ${key}; retry later`, {
          cause: error,
          details: { retryAfter: 5 },
        });
      throw error;
    }
  }

  private remember(key: string): void {
    if (this.misses.size >= MAX_MISSES) this.misses.delete(this.misses.keys().next().value!);
    this.misses.set(key, this.now().getTime() + this.missTtlMs);
  }
}
