/** The runner service's options resolved once: defaults filled in, values checked. */
import type { JobTokenSecret } from "../protocol/token.js";
import { stripUndefined } from "./strip-undefined.js";
import {
  DEFAULT_RUNNER_LIMITS,
  type PublishRetryOptions,
  type RunnerLimits,
  type RunnerServiceOptions,
} from "./contract.js";

/** Limits after defaults: the tail's options resolved too. */
export type ResolvedLimits = RunnerLimits & { tailBytes: number; headShare: number; headBytes: number };

/** Options after defaults; what the rest of the service reads. */
export interface RunnerConfig {
  readonly limits: ResolvedLimits;
  readonly retry: PublishRetryOptions;
  readonly closeTimeoutMs: number;
  readonly lostAfterMs: number;
  /** False: ended jobs are kept. */
  readonly retentionMs: number | false;
  readonly sweepEveryMs: number;
  /** Token keys, or null when calls are not token-checked. */
  readonly secrets: readonly JobTokenSecret[] | null;
  readonly acceptsAnyCaller: boolean;
  /** Runs of lines are taken and `runner-accepts: runs` sent (option `acceptRuns`, default true). */
  readonly acceptRuns: boolean;
}

/** Resolves and checks the options (RangeError on a bad limit or an empty key list). */
export function resolveConfig(options: RunnerServiceOptions): RunnerConfig {
  const given: RunnerLimits = { ...DEFAULT_RUNNER_LIMITS, ...stripUndefined(options.limits ?? {}) };
  const { tailBytes: tailGiven, headShare: shareGiven, ...required } = given;
  for (const [name, value] of Object.entries(required)) {
    if (!(typeof value === "number" && value > 0)) throw new RangeError(`limits.${name} must be a positive number`);
  }
  const limits = resolveTail(given, tailGiven, shareGiven);
  const retry: PublishRetryOptions = {
    maxMs: 10_000,
    initialDelayMs: 100,
    maxDelayMs: 2_000,
    attemptTimeoutMs: 30_000,
    ...stripUndefined(options.publishRetry ?? {}),
  };
  const lostAfterMs = options.lostAfterMs ?? 600_000;
  const retentionMs = options.retentionMs === false ? false : Math.max(options.retentionMs ?? 86_400_000, lostAfterMs);
  const secrets =
    options.secret === undefined
      ? null
      : Array.isArray(options.secret)
        ? (options.secret as JobTokenSecret[])
        : [options.secret as JobTokenSecret];
  if (secrets && secrets.length === 0) throw new RangeError("secret: give at least one key");
  return {
    limits,
    retry,
    closeTimeoutMs: options.closeTimeoutMs ?? 5_000,
    lostAfterMs,
    retentionMs,
    sweepEveryMs: options.sweepIntervalMs ?? Math.min(Math.max(Math.floor(lostAfterMs / 4), 10), 30_000),
    secrets,
    acceptsAnyCaller: !secrets && !options.authorize,
    acceptRuns: options.acceptRuns ?? true,
  };
}

/** The tail's limits: `tailBytes` (default a quarter of the cap), `headShare` and the head's bytes. */
function resolveTail(given: RunnerLimits, tailGiven?: number, shareGiven?: number): ResolvedLimits {
  const cap = given.jobLogBytes;
  const tailBytes = tailGiven ?? Math.floor(cap / 4);
  if (!(Number.isSafeInteger(tailBytes) && tailBytes >= 0 && tailBytes < cap))
    throw new RangeError("limits.tailBytes must be a whole number from 0 to below jobLogBytes");
  const headShare = shareGiven ?? 1 - tailBytes / cap;
  if (!(typeof headShare === "number" && headShare > 0 && headShare <= 1))
    throw new RangeError("limits.headShare must be in (0, 1]");
  const headBytes = Math.floor(headShare * cap);
  if (headBytes + tailBytes > cap)
    throw new RangeError("limits.headShare × jobLogBytes + tailBytes passes jobLogBytes");
  return { ...given, tailBytes, headShare, headBytes };
}
