/**
 * Publishing a job's result to the queue: one attempt in flight per job, bounded by its
 * own timeout, recorded in the store once accepted (docs/runner-protocol.md, §5).
 */
import type { Context } from "@opentelemetry/api";
import { RunnerDepotError } from "../../errors.js";
import { secondsSince } from "../../telemetry.js";
import { errorText } from "./telemetry.js";
import type { JobResult, JobState } from "../ports.js";
import type { PublishAttempt, RunnerCore } from "./job-table.js";
import { sleep } from "./timing.js";

/**
 * Starts one queue publish of a job's result and makes it the job's publish in flight.
 * Whoever needs the job's result published (a replayed end, a cancel, the lost sweep)
 * waits for this attempt instead of starting another, so a slow queue never receives two
 * results for one job. An accepted result is recorded by whoever waits for it, or in the
 * background when nobody does (the call that started it may have answered UNAVAILABLE).
 */
export function startAttempt(
  core: RunnerCore,
  id: string,
  result: JobResult,
  at: number | undefined,
  parent?: Context,
): PublishAttempt {
  const attempt: PublishAttempt = {
    result,
    at,
    settled: null as unknown as Promise<boolean>,
    error: undefined,
    timedOut: false,
    recorded: null,
  };
  const span = core.telemetry.startPublish(parent, id, result.outcome);
  const start = performance.now();
  const published = Promise.resolve().then(() => core.queue.publishJobResult(result));
  attempt.settled = settleWithin(core, id, attempt, published);
  void attempt.settled.then((accepted) => {
    core.telemetry.endPublish(
      span,
      accepted ? "accepted" : attempt.timedOut ? "timeout" : "refused",
      secondsSince(start),
    );
  });
  core.inFlight.set(id, attempt);
  core.track(
    id,
    attempt.settled.then((accepted) => {
      if (!accepted) {
        if (core.inFlight.get(id) === attempt) core.inFlight.delete(id);
        return undefined;
      }
      return core.locked(id, () => recordAccepted(core, id, attempt));
    }),
  );
  return attempt;
}

/** True when `published` resolves before the attempt timeout; false (with attempt.error) otherwise. */
function settleWithin(
  core: RunnerCore,
  id: string,
  attempt: PublishAttempt,
  published: Promise<void>,
): Promise<boolean> {
  const { attemptTimeoutMs } = core.config.retry;
  return new Promise<boolean>((resolve) => {
    let givenUp = false;
    const timer = setTimeout(() => {
      givenUp = true;
      attempt.timedOut = true;
      // Set before `settled` resolves: whoever waited for this attempt sees it at once.
      mayHaveReachedQueue(core, id, attempt);
      attempt.error = new RunnerDepotError(
        "UNAVAILABLE",
        `the queue did not answer the publish of job ${id}'s result within ${attemptTimeoutMs} ms; the attempt was given up on`,
      );
      core.report(attempt.error);
      resolve(false);
    }, attemptTimeoutMs);
    timer.unref?.();
    published.then(
      () => {
        clearTimeout(timer);
        if (givenUp) lateAcceptance(core, id, attempt);
        resolve(true);
      },
      (error: unknown) => {
        clearTimeout(timer);
        attempt.error = error;
        mayHaveReachedQueue(core, id, attempt);
        resolve(false);
      },
    );
  });
}

/** A failed attempt: the job's first such one fixes its result (RunnerCore.maybePublished). O(1). */
function mayHaveReachedQueue(core: RunnerCore, id: string, attempt: PublishAttempt): void {
  if (!core.maybePublished.has(id)) core.maybePublished.set(id, attempt);
}

/**
 * The queue accepted an attempt after it was given up on: the result is recorded (a retry
 * of it may have been published too: the same result, reported).
 */
function lateAcceptance(core: RunnerCore, id: string, attempt: PublishAttempt): void {
  core.report(
    new RunnerDepotError(
      "INTERNAL",
      `the queue accepted job ${id}'s result after the attempt was given up on; a retry may have published the same result again`,
    ),
  );
  if (!core.closed)
    core.track(
      id,
      core.locked(id, () => recordAccepted(core, id, attempt).catch(recordedElsewhere)),
    );
}

/** A late result the job already has (a retry of it was recorded first): nothing to do. */
function recordedElsewhere(error: unknown): void {
  if ((error as { code?: unknown }).code !== "FAILED_PRECONDITION") throw error;
}

/** Records an accepted result once (call it under the job's lock); the job's publish is then over. */
export function recordAccepted(
  core: RunnerCore,
  id: string,
  attempt: PublishAttempt,
): Promise<{ state: JobState; first: boolean }> {
  if (attempt.recorded) return attempt.recorded;
  const recording = (async () => {
    const finished = await core.logs.finish(
      id,
      attempt.result,
      attempt.at === undefined ? undefined : { at: attempt.at },
    );
    if (core.inFlight.get(id) === attempt) core.inFlight.delete(id);
    // The job has its result: nothing else may be published for it anyway.
    core.maybePublished.delete(id);
    // The job is over: its secrets are not kept (a late duplicate is skipped, never stored).
    core.maskers.delete(id);
    core.notify(id);
    if (finished.first) {
      const { outcome, exitCode, success } = attempt.result;
      core.telemetry.jobEnded(outcome);
      core.telemetry.logger.info({ requestId: id, outcome, exitCode, success }, "job ended");
      core.safe(() => core.options.onEnd?.(attempt.result));
    }
    return finished;
  })();
  attempt.recorded = recording;
  // A store that failed: whoever waits next records again (the result stays accepted).
  recording.catch(() => {
    if (attempt.recorded === recording) attempt.recorded = null;
  });
  return recording;
}

/** Publishes a cancelled or lost result until the queue accepts (never dropped while the service lives). */
export async function publishPersistent(
  core: RunnerCore,
  id: string,
  result: JobResult,
  at?: number,
): Promise<PublishAttempt> {
  const retry = core.config.retry;
  let delay = retry.initialDelayMs;
  const { telemetry } = core;
  for (let attempts = 1; ; attempts++) {
    if (attempts > 1) telemetry.publishRetries.add(1);
    const attempt = startAttempt(core, id, result, at);
    if (await attempt.settled) return attempt;
    if (core.closed) {
      telemetry.logger.error(
        { requestId: id, outcome: result.outcome, attempts, error: errorText(attempt.error) },
        "result publish given up",
      );
      throw new RunnerDepotError("UNAVAILABLE", `result of job ${id} not published before close`, {
        cause: attempt.error,
      });
    }
    const wait = Math.min(delay, retry.maxDelayMs);
    telemetry.logger.warn(
      { requestId: id, outcome: result.outcome, attempt: attempts, delayMs: wait, error: errorText(attempt.error) },
      "result publish failed, retrying",
    );
    await sleep(wait);
    delay *= 2;
  }
}
