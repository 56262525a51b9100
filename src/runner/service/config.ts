/** The runner service's options resolved once: defaults filled in, values checked. */
import type { JobTokenSecret } from "../protocol/token.js";
import { stripUndefined } from "./strip-undefined.js";
import {
  DEFAULT_RUNNER_LIMITS,
  type PublishRetryOptions,
  type RunnerLimits,
  type RunnerServiceOptions,
} from "./contract.js";

/** Options after defaults; what the rest of the service reads. */
export interface RunnerConfig {
  readonly limits: RunnerLimits;
  readonly retry: PublishRetryOptions;
  readonly closeTimeoutMs: number;
  readonly lostAfterMs: number;
  /** False: ended jobs are kept. */
  readonly retentionMs: number | false;
  readonly sweepEveryMs: number;
  /** Token keys, or null when calls are not token-checked. */
  readonly secrets: readonly JobTokenSecret[] | null;
  readonly acceptsAnyCaller: boolean;
}

/** Resolves and checks the options (RangeError on a bad limit or an empty key list). */
export function resolveConfig(options: RunnerServiceOptions): RunnerConfig {
  const limits: RunnerLimits = { ...DEFAULT_RUNNER_LIMITS, ...stripUndefined(options.limits ?? {}) };
  for (const [name, value] of Object.entries(limits)) {
    if (!(typeof value === "number" && value > 0)) throw new RangeError(`limits.${name} must be a positive number`);
  }
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
  };
}
