/**
 * The runner's end item inside a call: its result published within the call's retry
 * bound, and a publish still in flight from an earlier call settled before new items.
 */
import { RunnerDepotError } from "../../../errors.js";
import type { JobEnd } from "../../../gen/runner/v1/runner_pb.js";
import type { JobResult } from "../../ports.js";
import type { CallHandle, PublishAttempt, RunnerCore } from "../job-table.js";
import { EndedSignal } from "./ended-signal.js";
import { finishedResult } from "../job-results.js";
import { recordAccepted, startAttempt } from "../result-publish.js";
import { sleep, TIMED_OUT, within } from "../timing.js";
import { errorText } from "../telemetry.js";

/**
 * Publishes the runner's end within the retry bound, then records it (under the job's
 * lock). An earlier attempt still in flight (its call answered UNAVAILABLE) is awaited,
 * never doubled; a new attempt starts only once the earlier one has failed.
 */
export async function publishEnd(core: RunnerCore, call: CallHandle, end: JobEnd, at: number): Promise<void> {
  const retry = core.config.retry;
  const start = Date.now();
  let delay = retry.initialDelayMs;
  let result: JobResult | null = null;
  const { telemetry } = core;
  let attempts = 0;
  for (;;) {
    if (call.stopError) throw call.stopError;
    const reason = core.ending.get(call.id);
    if (reason) throw new EndedSignal(reason);
    let attempt = core.inFlight.get(call.id);
    if (!attempt) {
      const state = (await core.logs.get(call.id)) ?? (await core.logs.open(call.id));
      call.state = state;
      if (state.status !== "open") throw new EndedSignal(state.status === "finished" ? "ended" : state.status);
      // A failed publish may still reach the queue: its result is the job's (same at, same content).
      result ??= core.maybePublished.get(call.id)?.result ?? finishedResult(call.id, state, end);
      if (attempts++ > 0) telemetry.publishRetries.add(1);
      attempt = startAttempt(core, call.id, result, at, call.traceContext);
    }
    const accepted = await call.guard(within(attempt.settled, retry.maxMs - (Date.now() - start)));
    if (accepted === true) {
      const finished = await recordAccepted(core, call.id, attempt);
      call.state = finished.state;
      if (finished.state.status !== "finished")
        throw new EndedSignal(finished.state.status === "open" ? "ended" : finished.state.status);
      return;
    }
    const wait = Math.min(delay, retry.maxDelayMs);
    if (accepted === TIMED_OUT || Date.now() - start + wait >= retry.maxMs || core.closeController.signal.aborted) {
      // A publish still in flight stays the job's: the replayed end waits for it.
      telemetry.logger.error(
        { requestId: call.id, outcome: "finished", attempts, error: errorText(attempt.error ?? "no answer yet") },
        "result publish given up",
      );
      throw new RunnerDepotError("UNAVAILABLE", "the job-result queue is unavailable; retry the call later", {
        cause: attempt.error,
      });
    }
    telemetry.logger.warn(
      { requestId: call.id, outcome: "finished", attempt: attempts, delayMs: wait, error: errorText(attempt.error) },
      "result publish failed, retrying",
    );
    await call.guard(sleep(wait * (0.5 + Math.random() / 2)));
    delay *= 2;
  }
}

/**
 * A result of this job is still being published (e.g. an end whose call stopped waiting):
 * it decides whether new items may be stored. Accepted: the job has ended (ok = false).
 * Refused: the job is still open, go on. Still in flight: UNAVAILABLE.
 */
export async function settlePendingPublish(core: RunnerCore, call: CallHandle, attempt: PublishAttempt): Promise<void> {
  const accepted = await call.guard(within(attempt.settled, core.config.retry.maxMs));
  if (accepted === TIMED_OUT)
    throw new RunnerDepotError("UNAVAILABLE", "the job's result is still being published; retry the call later");
  if (accepted) {
    const state = (await recordAccepted(core, call.id, attempt)).state;
    call.state = state;
    throw new EndedSignal(state.status === "cancelled" || state.status === "lost" ? state.status : "ended");
  }
}
