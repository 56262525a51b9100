/**
 * One StreamLogs call from start to answer: stop signals wired (shutdown, client gone),
 * authentication on the first item, the newer call taking the job, then every item
 * through the rules until the end of the stream.
 */
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, type HandlerContext } from "@connectrpc/connect";
import { AckSchema, type Ack, type LogItem } from "../../../gen/runner/v1/runner_pb.js";
import type { CallItem } from "../../protocol/received-line.js";
import { normalizeRequestId } from "../../protocol/request-id.js";
import { kCallAuthenticated, kCallJob, kFirstItemCheck, kShutdownSignal } from "../../server/call-context.js";
import { ACCEPTS_HEADER, COMMITTED_HEADER, OFFSET_HEADER } from "../contract.js";
import { RUNS_FEATURE } from "../../protocol/received-run.js";
import { uErr, type RunnerCore } from "../job-table.js";
import { CallRun } from "./run.js";
import { readerOf, refill, takeItem, unread, type ItemReader } from "../../server/item-reader.js";
import { authenticate, checkTokenPresent, parseOffset } from "./auth.js";
import { checkItemShape, processItem } from "./item-rules.js";
import { EndedSignal } from "./ended-signal.js";
import { endedAck } from "./ended-answer.js";
import { forgetMaskerIfOver } from "./masking.js";
import { toResponseError } from "./response-error.js";
import { reportCallEnd, reportCallOpen, reportCallStart } from "./report.js";

/** Serves one StreamLogs call. */
export async function streamLogs(
  core: RunnerCore,
  requests: AsyncIterable<LogItem>,
  ctx: HandlerContext,
): Promise<Ack> {
  const call = new CallRun(core, ctx);
  core.calls.add(call);
  core.idle.watch();
  reportCallOpen(core, call, ctx);
  let code = 0;
  let ok = false;
  // Every answer (Ack or error, before the job is known too) says the server takes runs: set before anything can
  // fail, and kept by both transports beside an error's own metadata.
  if (core.config.acceptRuns) ctx.responseTrailer.set(ACCEPTS_HEADER, RUNS_FEATURE);
  const it = readerOf(requests, core.config.acceptRuns);
  const shutdown = ctx.values.get(kShutdownSignal);
  const stoppedBy = shutdown ? watchShutdown(shutdown, call) : null;
  const onClientGone = () => call.stop(whySignalAborted(ctx.signal.reason));
  ctx.signal.addEventListener("abort", onClientGone);
  try {
    const ack = await runCall(core, call, it);
    ok = ack.ok;
    // Success: the trailer says where the job stands (an accepted end included).
    if (call.id && !ctx.responseTrailer.has(COMMITTED_HEADER))
      ctx.responseTrailer.set(COMMITTED_HEADER, String(call.committed));
    return ack;
  } catch (error) {
    const answer = await toResponseError(core, call, error);
    code = answer.code;
    throw answer;
  } finally {
    reportCallEnd(core, call, code);
    stoppedBy?.delete(call);
    ctx.signal.removeEventListener("abort", onClientGone);
    core.calls.delete(call);
    if (call.slot) {
      if (call.slot.active === call) call.slot.active = null;
      core.release(call.id, call.slot);
    }
    // A call that did not end well may have been a late one of a job already over, whose lines made its masker anew.
    // In the background: a stalled store must not hold back the call's answer.
    if (!ok && call.id) core.track(call.id, forgetMaskerIfOver(core, call.id));
  }
}

async function runCall(core: RunnerCore, call: CallRun, it: ItemReader): Promise<Ack> {
  const headers = call.ctx.requestHeader;
  // Token presence and form are checked before anything is read (first in the check order).
  checkTokenPresent(core, headers);
  // A server checks a compressed first message's request ID with this before decompressing it.
  call.ctx.values.set(kFirstItemCheck, async (requestId: string) => {
    const id = normalizeRequestId(requestId);
    if (id === null)
      throw uErr("INVALID_ARGUMENT", `request_id is not a UUID: ${JSON.stringify(requestId.slice(0, 64))}`);
    await authenticate(core, call.ctx, id);
    call.checkedId = id;
  });
  const offset = parseOffset(headers.get(OFFSET_HEADER));

  // What is awaited settles with a boolean, not the item (runner/server/item-reader.ts, refill): this frame
  // lives as long as the call and would keep the first item and its chunk in a register.
  let first = takeItem(it) ?? ((await refill(call, it)) ? takeItem(it)! : null);
  if (first === null) {
    if (Number.isNaN(offset)) throw badOffset();
    // A call with zero items is fine, and names no job: no runner-committed to give.
    return create(AckSchema, { ok: true });
  }
  const id = normalizeRequestId(first.requestId);
  call.claimedId = id ?? first.requestId.slice(0, 64);
  if (id === null)
    throw uErr("INVALID_ARGUMENT", `request_id is not a UUID: ${JSON.stringify(first.requestId.slice(0, 64))}`);
  if (call.checkedId !== id) await authenticate(core, call.ctx, id);
  if (core.options.requireKnownJobs) {
    const known = await core.logs.get(id);
    if (!known?.expected) throw uErr("NOT_FOUND", `unknown job ${id}`);
  }
  // The transport may now read on (it held back everything after the first message).
  call.ctx.values.get(kCallAuthenticated)?.();

  takeJob(core, call, id, first.requestId);
  // The check order: a malformed offset and a bad first item come before ok = false.
  if (Number.isNaN(offset)) throw badOffset();
  // A job being cancelled or declared lost answers at once, even while its result
  // is still being published (which holds the job's lock).
  const hostReason = core.ending.get(id);
  if (hostReason) {
    checkItemShape(core, call, first);
    return endedAck(core, call, hostReason);
  }
  await call.guard(call.refresh());
  call.offset = offset;
  reportCallStart(core, call, offset);

  try {
    // The first item goes back to the reader and out of this frame, which lives as long as
    // the call: a received line holds its request chunk (runner/protocol/received-line.ts).
    unread(it, first);
    first = null;
    await processItems(core, call, it);
    return create(AckSchema, { ok: true });
  } catch (error) {
    if (error instanceof EndedSignal) return endedAck(core, call, error.reason);
    throw error;
  }
}

/**
 * The calls in flight under each shutdown signal, with ONE abort listener per signal.
 * Why: docs/decisions/runner-fleet-memory.md, "stream-call.ts: shutdownCalls".
 */
const shutdownCalls = new WeakMap<AbortSignal, Set<CallRun>>();

function stopForShutdown(call: CallRun): void {
  call.stop(uErr("UNAVAILABLE", "the server is shutting down; retry the call"));
}

/** Registers `call` to stop when `signal` aborts (at once if it has); the set to leave at the call's end. */
function watchShutdown(signal: AbortSignal, call: CallRun): Set<CallRun> {
  let calls = shutdownCalls.get(signal);
  if (calls === undefined) {
    const created = new Set<CallRun>();
    calls = created;
    shutdownCalls.set(signal, created);
    signal.addEventListener(
      "abort",
      () => {
        for (const c of created) stopForShutdown(c);
      },
      { once: true },
    );
  }
  calls.add(call);
  if (signal.aborted) stopForShutdown(call);
  return calls;
}

/**
 * Why a call's signal aborted: its own deadline (`grpc-timeout` / `connect-timeout-ms`,
 * which connect turns into a DEADLINE_EXCEEDED abort) answers DEADLINE_EXCEEDED as the
 * protocol says (§2, §9); anything else is the client going away.
 */
function whySignalAborted(reason: unknown) {
  if (reason instanceof ConnectError && reason.code === Code.DeadlineExceeded)
    return uErr("DEADLINE_EXCEEDED", "the call's deadline (grpc-timeout) passed");
  return uErr("UNAVAILABLE", "the call was cancelled by the client");
}

function badOffset() {
  return uErr("INVALID_ARGUMENT", `malformed ${OFFSET_HEADER}: expected a non-negative integer`);
}

/** The newer call wins, and only now that it has passed auth: an older call of the job ends ABORTED. */
function takeJob(core: RunnerCore, call: CallRun, id: string, rawId: string): void {
  call.id = id;
  call.rawId = rawId;
  call.ctx.values.get(kCallJob)?.(id);
  const slot = core.slotOf(id);
  slot.refs++;
  call.slot = slot;
  const older = slot.active;
  slot.active = call;
  older?.stop(uErr("ABORTED", "replaced by a newer call of the same job"));
}

/** Every item through the rules, then the last ones stored. O(items). */
async function processItems(core: RunnerCore, call: CallRun, it: ItemReader): Promise<void> {
  let item: CallItem | undefined;
  for (;;) {
    item = takeItem(it);
    if (item === undefined) {
      // No item held while the call waits for the next batch (an idle stream would pin its
      // chunk), neither here nor in the promise awaited (it settles with a boolean).
      if (await refill(call, it)) continue;
      break;
    }
    // Most items are handled synchronously; only a wait (back-pressure, the end) awaits.
    const processing = processItem(core, call, item);
    if (processing !== undefined) await processing;
    if (call.stopError) throw call.stopError;
  }
  await call.guard(call.flush());
}
