/** Mapping a call's failure to the error the runner sees (§8): a gRPC code, a line of text, `runner-committed`. */
import { Code, ConnectError } from "@connectrpc/connect";
import { RunnerDepotError } from "../../../errors.js";
import type { CallRun } from "./run.js";
import { uErr, type RunnerCore } from "../job-table.js";
import { EndedSignal } from "./ended-signal.js";
import { COMMITTED_HEADER } from "../contract.js";

/** Turns any failure into the ConnectError the runner sees, with `runner-committed` when the job is known. */
export async function toResponseError(core: RunnerCore, call: CallRun, error: unknown): Promise<ConnectError> {
  let err = RunnerDepotError.from(error instanceof EndedSignal ? uErr("INTERNAL", "unexpected end signal") : error);
  if (err.code === "INTERNAL") core.report(error);
  else if (carriesDriverText(err)) {
    // A driver's words (addresses, ports) stay in the server's log; the agent gets the code.
    core.report(error);
    err = new RunnerDepotError(err.code, "the server's log store is unavailable; retry the call later");
  }
  if (!call.id || !call.slot) return err.toConnectError();
  // Items received before the failure stay stored, unless this call was replaced.
  if (err.code !== "ABORTED") {
    try {
      await call.flush();
    } catch (flushError) {
      if (!(flushError instanceof EndedSignal)) core.report(flushError);
    }
  }
  // A replaced call (ABORTED) answers at once, reading without the job's lock: the newer
  // call's store append may hold it for long, and a replaced call kept waiting kept what its
  // reader had queued (up to 1 MiB) counted in the store backlog, so one job replacing its
  // own calls could fill the server's budget and hold every other call back.
  if (err.code !== "ABORTED") await call.refresh().catch(() => undefined);
  else if (call.state === null) await call.refresh(true).catch(() => undefined);
  // Both gRPC (trailers) and Connect (end-of-stream metadata) append the error's
  // metadata to the response trailers, so it goes there once and only there.
  call.ctx.responseTrailer.delete(COMMITTED_HEADER);
  return err.toConnectError(new Headers({ [COMMITTED_HEADER]: String(call.committed) }));
}

/**
 * True for an UNAVAILABLE error that wraps a foreign failure and repeats its message (the
 * adapters' `PostgreSQL: connect ECONNRESET 127.0.0.1:55432`). O(message).
 */
function carriesDriverText(err: RunnerDepotError): boolean {
  if (err.grpcCode !== Code.Unavailable) return false;
  const cause = err.cause;
  if (!(cause instanceof Error) || cause instanceof RunnerDepotError || cause instanceof ConnectError) return false;
  return cause.message !== "" && err.message.includes(cause.message);
}
