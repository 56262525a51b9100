/**
 * Pull-through: a router with an `upstream` answers a read miss (an unknown package or version) by
 * copying that one version from the upstream with the mirror's checked per-version copy, then
 * serving it from its own store. What it holds never depends on the upstream again; a miss, and a
 * version refused by the publish rules and the router's `limits`, is remembered only `missTtlMs`;
 * upstream fetches are bounded in number and size.
 * Why: docs/decisions/depot-yank-mirror.md, "Pull-through".
 */
import { isRunnerDepotError, RunnerDepotError } from "../../errors.js";
import type { PackageStore } from "../ports.js";
import { DEFAULT_LIMITS, type DepotLimits } from "../transactions/lifecycle.js";
import { pullVersion } from "./mirror.js";
import { Upstream, UPSTREAM_LIMITS, type UpstreamLimits } from "./upstream.js";
import { isManifestRefusal } from "./upstream-manifest.js";

/** The `upstream` option of createPackageRouter. */
export interface PullThroughOptions {
  /** The upstream depot's base URL (what its clients use). */
  url: string;
  /** A bearer token with read on the upstream's packages. */
  token?: string;
  /**
   * How long an upstream "no such version", and a version whose manifest the publish rules refuse, is remembered,
   * ms (default 30,000).
   */
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

/** Misses (and refusals) remembered at most (oldest forgotten first): bounds the memory a reader can fill with names. */
const MAX_MISSES = 10_000;

/** A remembered miss: until when (ms), and the answer's detail when the upstream's version breaks a publish rule here. */
interface Miss {
  until: number;
  refusal?: string;
}

/**
 * The pull-through state of one router: in-flight copies (one per version, shared by concurrent
 * readers), the remembered misses and refusals, and the concurrency bound. `limits`: the router's,
 * which an upstream version's manifest must keep as a publish must.
 *
 * @example
 * const pulls = new PullThrough(store, { url: "https://depot.example.com" }, () => new Date(), DEFAULT_LIMITS);
 * if (await pulls.pull("toolchain", "1.2.0", "ci")) { … read it from the store … }
 */
export class PullThrough {
  private readonly upstream: Upstream;
  private readonly misses = new Map<string, Miss>();
  private readonly running = new Map<string, Promise<boolean>>();
  private readonly missTtlMs: number;
  private readonly maxConcurrent: number;
  private readonly maxVersionBytes: number;

  constructor(
    private readonly store: PackageStore,
    private readonly options: PullThroughOptions,
    private readonly now: () => Date,
    private readonly limits: DepotLimits = DEFAULT_LIMITS,
  ) {
    this.upstream = new Upstream(options.url, options.token, { ...UPSTREAM_LIMITS, ...options.limits });
    this.missTtlMs = options.missTtlMs ?? 30_000;
    this.maxConcurrent = options.maxConcurrent ?? 4;
    this.maxVersionBytes = options.maxVersionBytes ?? 2 ** 30;
  }

  /**
   * Copies `name@version` (no version: the upstream's latest) into the store; true when the store
   * now holds it, false when the upstream has no such version (remembered for `missTtlMs`).
   * UPSTREAM_UNAVAILABLE when the upstream is down or answers wrongly, or its version breaks a publish
   * rule or limit here (that one remembered for `missTtlMs`, answered again without asking the upstream);
   * TOO_MANY_PULLS past the bound. O(1) bookkeeping plus the copy (depot/mirror/mirror.ts pullVersion).
   */
  async pull(name: string, version: string | undefined, principal: string): Promise<boolean> {
    if (principal === "anonymous" && this.options.allowAnonymous !== true) return false;
    const key = `${name}@${version ?? ""}`;
    if (this.remembered(key)) return false;
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
    let exact = key;
    try {
      const wanted = version ?? (await this.upstream.latest(name));
      exact = `${name}@${wanted}`;
      // The latest resolved to a version refused a moment ago: answered as then, its manifest not read again.
      if (exact !== key) this.remembered(exact);
      await pullVersion(this.store, this.upstream, name, wanted, this.now, this.maxVersionBytes, this.limits);
      return true;
    } catch (error) {
      if (isRunnerDepotError(error) && error.details.upstreamStatus === 404) {
        this.remember(key);
        return false;
      }
      // A refusal by the publish rules is the version's for good (its bytes never change): remembered like a miss, so
      // the reads within missTtlMs are answered without fetching its manifest again.
      if (isManifestRefusal(error)) {
        const refusal = `the upstream's ${exact} breaks a publish rule or limit of this depot, so it is not pulled (${error.message})`;
        this.remember(key, refusal);
        if (exact !== key) this.remember(exact, refusal);
        throw this.refused(refusal, this.missTtlMs, error);
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

  /**
   * True when `key` is a miss remembered and still in time; throws its 503 again when it is a refusal. A miss past its
   * time is forgotten.
   */
  private remembered(key: string): boolean {
    const miss = this.misses.get(key);
    if (miss === undefined) return false;
    const left = miss.until - this.now().getTime();
    if (left <= 0) {
      this.misses.delete(key);
      return false;
    }
    if (miss.refusal !== undefined) throw this.refused(miss.refusal, left);
    return true;
  }

  private remember(key: string, refusal?: string): void {
    this.misses.delete(key);
    if (this.misses.size >= MAX_MISSES) this.misses.delete(this.misses.keys().next().value!);
    this.misses.set(key, {
      until: this.now().getTime() + this.missTtlMs,
      ...(refusal !== undefined ? { refusal } : {}),
    });
  }

  /** The 503 of a version the publish rules refuse, naming the refusal; Retry-After: when it is forgotten here. */
  private refused(refusal: string, leftMs: number, cause?: unknown): RunnerDepotError {
    return new RunnerDepotError("UPSTREAM_UNAVAILABLE", refusal, {
      ...(cause !== undefined ? { cause } : {}),
      details: { retryAfter: Math.max(1, Math.ceil(leftMs / 1000)) },
    });
  }
}
