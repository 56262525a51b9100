/**
 * What a StreamLogs call tells the operator: its span, the open-streams gauge, the
 * resume count, its answer by gRPC code, the item it refused, and its log lines
 * (docs/decisions/operations.md). Never a header value: tokens stay out of every line.
 */
import { Code } from "@connectrpc/connect";
import type { HandlerContext } from "@connectrpc/connect";
import { traceContextOf } from "../../../telemetry.js";
import type { CallRun } from "./run.js";
import type { RunnerCore } from "../job-table.js";
import { grpcCodeName, type RefusalReason } from "../telemetry.js";

/** Opens the call's span (under the caller's trace context) and counts it open. */
export function reportCallOpen(core: RunnerCore, call: CallRun, ctx: HandlerContext): void {
  const parent = traceContextOf(ctx.requestHeader);
  call.span = core.telemetry.startCall(parent, ctx.protocolName);
  call.parentContext = parent;
  core.telemetry.streamsOpen.add(1);
}

/** The call has its job and knows where it stands: a start line, and a resume when items were stored before. */
export function reportCallStart(core: RunnerCore, call: CallRun, offset: number): void {
  const { logger } = core.telemetry;
  const fields = { requestId: call.id, offset, committed: call.committed, protocol: call.ctx.protocolName };
  logger.debug(fields, "call started");
  if (call.committed > 0) {
    core.telemetry.resumes.add(1);
    logger.info(fields, "call resumed");
  }
}

/** Codes that refuse the caller rather than an item's content. */
const REFUSALS = new Set<number>([Code.Unauthenticated, Code.PermissionDenied, Code.NotFound]);

/** The item a refused call ended on, by its answer; null when no item was refused. */
function refusalOf(call: CallRun, code: number): RefusalReason | null {
  if (call.endedReason) return "job_ended";
  // An oversized message may be refused by the transport before it is decoded.
  if (code === Code.ResourceExhausted) return "message_too_large";
  // UNAUTHENTICATED, and a malformed offset of a call without items, come before any item.
  if (call.claimedId === "") return null;
  switch (code) {
    case Code.InvalidArgument:
      return "invalid_item";
    case Code.FailedPrecondition:
      return "offset_gap";
    case Code.PermissionDenied:
      return "unauthorized";
    case Code.NotFound:
      return "unknown_job";
    default:
      return null;
  }
}

/** The call answered with `code` (0 for an Ack): counts, span end, log lines. */
export function reportCallEnd(core: RunnerCore, call: CallRun, code: number): void {
  const telemetry = core.telemetry;
  telemetry.streamsOpen.add(-1);
  const refusal = refusalOf(call, code);
  if (refusal) telemetry.refused(refusal);
  const requestId = call.id || call.claimedId || undefined;
  if (call.span)
    telemetry.endCall(call.span, code, {
      "runner.request_id": requestId ?? "",
      "runner.offset": call.offset,
      "runner.committed": call.committed,
    });
  if (REFUSALS.has(code)) {
    telemetry.logger.warn({ requestId, code: grpcCodeName(code) }, "call refused");
    return;
  }
  if (!call.id) return;
  const fields = {
    requestId: call.id,
    code: grpcCodeName(code),
    ok: code === 0 && call.endedReason === null,
    ...(call.endedReason ? { reason: call.endedReason } : {}),
    offset: call.offset,
    committed: call.committed,
    items: call.index,
  };
  telemetry.logger.info(fields, "call ended");
}
