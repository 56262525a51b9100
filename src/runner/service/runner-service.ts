/**
 * The orchestrator side of runner.v1: a connect-es ServiceImpl of `Runner` that stores
 * log items through a JobLogStore and hands each job's result to a JobResultQueue,
 * following docs/runner-protocol.md rule by rule.
 * Why: docs/decisions/runner-server.md, "runner-service.ts: where each concern lives".
 */
import { RunnerDepotError } from "../../errors.js";
import type { JobLogStore, JobResultQueue, StoredLine } from "../ports.js";
import { normalizeRequestId } from "../protocol/request-id.js";
import { encodeJobCursor, summarizeJob, toJobListQuery } from "./job-list.js";
import { ACCEPTS_HEADER, type RunnerService, type RunnerServiceOptions } from "./contract.js";
import { RUNS_FEATURE } from "../protocol/received-run.js";
import { resolveConfig } from "./config.js";
import { createRunnerCore, uErr, type RunnerCore } from "./job-table.js";
import { streamLogs } from "./call/stream-call.js";
import { endFromHost } from "./host-ending.js";
import { startLostSweep } from "./lost-sweep.js";
import { followJob, followJobWithSections } from "./follow.js";
import { within } from "./timing.js";
import { kStoreBacklog, type StoreBacklog } from "./store-backlog.js";
import { checkSecret, type SecretMasker } from "../masking/secret-masker.js";
import { MASK_LIMITS } from "../masking/add-mask.js";

export {
  COMMITTED_HEADER,
  ACCEPTS_HEADER,
  REASON_HEADER,
  OFFSET_HEADER,
  DEFAULT_RUNNER_LIMITS,
  type EndedReason,
  type RunnerLimits,
  type RunnerAuthorizeContext,
  type PublishRetryOptions,
  type RunnerServiceOptions,
  type ExpectJobInfo,
  type RunnerService,
} from "./contract.js";
export {
  kShutdownSignal,
  kCallAuthenticated,
  kCallHeldBack,
  kCallJob,
  kMessageBytes,
  kItemBatches,
  type ItemBatchSource,
} from "../server/call-context.js";

/**
 * The runner service over `queue`, storing in `options.logs` or else in `defaultLogs()`: the caller (the
 * entry's `createRunnerService`) supplies that default, so the service never reaches into an adapter.
 */
export function assembleRunnerService(
  queue: JobResultQueue,
  options: RunnerServiceOptions,
  defaultLogs: () => JobLogStore,
): RunnerService {
  const config = resolveConfig(options);
  const core = createRunnerCore(queue, options.logs ?? defaultLogs(), options, config);
  const logs = core.logs;
  const sweepTimer = startLostSweep(core);
  let closing: Promise<void> | null = null;

  const service: RunnerService & { [kStoreBacklog]: StoreBacklog } = {
    // For the transport: it pauses authenticated calls while the store backlog is over budget.
    [kStoreBacklog]: core.backlog,
    // Not async: an open call keeps every suspended frame of its chain, and this one only forwards.
    streamLogs(requests, ctx) {
      if (core.closed) {
        if (core.config.acceptRuns) ctx.responseTrailer.set(ACCEPTS_HEADER, RUNS_FEATURE);
        return Promise.reject(uErr("UNAVAILABLE", "the runner service is closed").toConnectError());
      }
      return streamLogs(core, requests, ctx);
    },
    async expectJob(requestId, expectInfo = {}) {
      const id = requestIdOf(requestId);
      const { secrets, ...info } = expectInfo;
      if (secrets !== undefined) {
        const masker = registerSecrets(core, id, secrets);
        // The info is stored, and its repo URL and commit are the result's fallbacks: masked too.
        for (const key of ["repoUrl", "commitSha"] as const) {
          if (typeof info[key] === "string") info[key] = masker.mask(info[key]);
        }
      }
      return core.locked(id, () => logs.open(id, { expect: true, info, now: new Date() }));
    },
    async cancelJob(requestId, _reason) {
      const id = requestIdOf(requestId);
      // Marked at once, so calls in flight stop storing at their next item.
      if (!core.ending.has(id)) {
        const known = await logs.get(id);
        if (known && known.status !== "open") return null;
        core.ending.set(id, "cancelled");
      }
      return endFromHost(core, id, "cancelled");
    },
    async listJobs(listOptions = {}) {
      const { pageSize, ...query } = toJobListQuery(listOptions);
      if (!logs.list) throw uErr("FAILED_PRECONDITION", "this log store cannot list jobs (it has no list method)");
      // The store returns one row more than the page: its presence says a next page exists.
      const states = await logs.list(query);
      const jobs = states.slice(0, pageSize).map(summarizeJob);
      const last = jobs[jobs.length - 1];
      return { jobs, next: states.length > pageSize && last ? encodeJobCursor(last) : null };
    },
    follow(requestId: string, followOptions: { from?: number; signal?: AbortSignal; sections?: boolean } = {}) {
      const id = requestIdOf(requestId);
      if (followOptions.sections === true)
        return followJobWithSections(
          core,
          id,
          followOptions.from ?? 0,
          followOptions.signal,
        ) as AsyncIterable<StoredLine>;
      return followJob(core, id, followOptions.from ?? 0, followOptions.signal);
    },
    close() {
      closing ??= (async () => {
        core.closed = true;
        clearInterval(sweepTimer);
        // The idle sweep stops by itself once the calls still open have ended (it is unref'd).
        core.fanout.close();
        core.closeController.abort();
        await waitForBackground(core);
      })();
      return closing;
    },
    get acceptsAnyCaller() {
      return config.acceptsAnyCaller;
    },
    get limits() {
      return config.limits;
    },
    get logs() {
      return logs;
    },
    get activeCalls() {
      return core.calls.size;
    },
  };
  return service;
}

/** Adds the declared secrets to the job's masker (all checked first: none is kept when one is refused). O(bytes). */
function registerSecrets(core: RunnerCore, id: string, secrets: readonly string[]): SecretMasker {
  if (!Array.isArray(secrets)) throw uErr("INVALID_ARGUMENT", "secrets must be an array of strings");
  secrets.forEach((value, i) => {
    try {
      checkSecret(value);
    } catch (e) {
      // Named by position and size, never by value.
      throw uErr("INVALID_ARGUMENT", `secrets[${i}]: ${(e as Error).message}`);
    }
  });
  const bytes = secrets.reduce((n, value) => n + Buffer.byteLength(value, "utf8"), 0);
  if (secrets.length > MASK_LIMITS.values || bytes > MASK_LIMITS.valueBytes)
    throw uErr(
      "INVALID_ARGUMENT",
      `at most ${MASK_LIMITS.values} secrets and ${MASK_LIMITS.valueBytes} bytes of them a job, got ${secrets.length} and ${bytes}`,
    );
  // A job expected again keeps what it had (earlier declared values, and what `::add-mask::` lines
  // registered): forgetting them would leak them from an agent that does not mask.
  return core.maskers.declare(id, secrets).masker;
}

/** A request ID normalised, or INVALID_ARGUMENT. */
function requestIdOf(requestId: string): string {
  const id = normalizeRequestId(requestId);
  if (id === null) throw uErr("INVALID_ARGUMENT", `not a UUID: ${requestId}`);
  return id;
}

/** Waits for background publishes, bounded: a queue that never answers must not hang the host's shutdown. */
async function waitForBackground(core: RunnerCore): Promise<void> {
  const { closeTimeoutMs } = core.config;
  const deadline = Date.now() + closeTimeoutMs;
  while (core.background.size > 0) {
    const left = deadline - Date.now();
    if (left <= 0) {
      const jobs = [...new Set(core.background.values())];
      core.report(
        new RunnerDepotError(
          "UNAVAILABLE",
          `runner service closed with ${core.background.size} background publish(es) unfinished after ${closeTimeoutMs} ms (jobs ${jobs.join(", ")})`,
          { details: { jobs } },
        ),
      );
      return;
    }
    await within(Promise.allSettled([...core.background.keys()]), left);
  }
}
